"""Parallel generation of the synthetic dataset: the same samples whatever the rank count."""
from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from disttensor import io
from disttensor.io import _h5file, _temps
from disttensor.io.synthetic import main, synthetic_sample, synthetic_segmentation_sample
from conftest import assert_all_ranks, assert_raises_all

SIZE = MPI.COMM_WORLD.Get_size()
DRIVERS = [d for d in ("mpio", "independent") if io.hdf5_driver_available(d)]


def _check_files(comm, paths, n, size, channels, seed):
    def check():
        bad = []
        for i, p in enumerate(paths):
            x, y = synthetic_sample(i, size, channels, seed)
            with h5py.File(p, "r") as f:
                if not (np.array_equal(f["full"][...], x) and np.array_equal(f["unitPar"][...], y)
                        and int(f.attrs["index"]) == i):
                    bad.append(i)
        return bad, sorted(os.listdir(os.path.dirname(paths[0])))
    bad, listing = _h5file.root_call(comm, check)
    assert_all_ranks(comm, not bad, f"samples differ from the serial generator: {bad}")
    assert_all_ranks(comm, listing == [f"sample_{i:06d}.h5" for i in range(n)], str(listing))


def test_files_layout_in_parallel(comm, shared_tmp_path):
    n = 2 * SIZE + 1
    paths = io.generate_synthetic(shared_tmp_path / "f", n, size=6, channels=3, seed=9)
    assert_all_ranks(comm, len(paths) == n)
    _check_files(comm, paths, n, 6, 3, 9)


@pytest.mark.parametrize("driver", DRIVERS)
def test_stacked_layout_in_parallel(comm, shared_tmp_path, driver):
    n = SIZE + 2  # the last round leaves ranks without a sample
    out = io.generate_synthetic(shared_tmp_path / "s.h5", n, size=5, channels=2, seed=1,
                                layout="stacked", driver=driver, dtype="float64")

    def check():
        with h5py.File(out, "r") as f:
            x, y = f["full"][...], f["unitPar"][...]
            ok = x.shape == (n, 2, 5, 5, 5) and y.shape == (n, 3) and x.dtype == np.float64
            for i in range(n):
                xi, yi = synthetic_sample(i, 5, 2, 1, "float64")
                ok = ok and np.array_equal(x[i], xi) and np.array_equal(y[i], yi)
            return ok and f.attrs["generator"] == "disttensor.io.synthetic"
    assert_all_ranks(comm, _h5file.root_call(comm, check))


def test_command_line_main_in_parallel(comm, shared_tmp_path):
    d = shared_tmp_path / "cli"
    rc = main(["--out", str(d), "--samples", "3", "--size", "4", "--channels", "1",
               "--seed", "2"])
    assert_all_ranks(comm, rc == 0)
    _check_files(comm, [str(d / f"sample_{i:06d}.h5") for i in range(3)], 3, 4, 1, 2)


def _check_segmentation_files(comm, paths, n, size, channels, classes, seed):
    def check():
        bad = []
        for i, p in enumerate(paths):
            x, lab = synthetic_segmentation_sample(i, size, channels, classes, seed)
            with h5py.File(p, "r") as f:
                if not (np.array_equal(f["full"][...], x) and f["labels"].dtype == np.uint8
                        and np.array_equal(f["labels"][...], lab) and int(f.attrs["index"]) == i
                        and f.attrs["task"] == "segmentation"
                        and int(f.attrs["classes"]) == classes):
                    bad.append(i)
        return bad, sorted(os.listdir(os.path.dirname(paths[0])))
    bad, listing = _h5file.root_call(comm, check)
    assert_all_ranks(comm, not bad, f"samples differ from the serial generator: {bad}")
    assert_all_ranks(comm, listing == [f"sample_{i:06d}.h5" for i in range(n)], str(listing))


def test_segmentation_files_layout_in_parallel(comm, shared_tmp_path):
    n = 2 * SIZE + 1
    paths = io.generate_synthetic(shared_tmp_path / "f", n, size=6, channels=2, seed=9,
                                  task="segmentation", classes=4)
    assert_all_ranks(comm, len(paths) == n)
    _check_segmentation_files(comm, paths, n, 6, 2, 4, 9)


@pytest.mark.parametrize("driver", DRIVERS)
def test_segmentation_stacked_layout_in_parallel(comm, shared_tmp_path, driver):
    n = SIZE + 2  # the last round leaves ranks without a sample
    out = io.generate_synthetic(shared_tmp_path / "s.h5", n, size=5, channels=3, seed=1,
                                layout="stacked", driver=driver, dtype="float64",
                                task="segmentation", classes=2, y_dataset="seg")

    def check():
        with h5py.File(out, "r") as f:
            x, lab = f["full"][...], f["seg"][...]
            ok = (x.shape == (n, 3, 5, 5, 5) and lab.shape == (n, 5, 5, 5)
                  and x.dtype == np.float64 and lab.dtype == np.uint8)
            for i in range(n):
                xi, li = synthetic_segmentation_sample(i, 5, 3, 2, 1, "float64")
                ok = ok and np.array_equal(x[i], xi) and np.array_equal(lab[i], li)
            return (ok and f.attrs["task"] == "segmentation" and int(f.attrs["classes"]) == 2
                    and f["seg"].attrs["axes"] == "N,D,H,W")
    assert_all_ranks(comm, _h5file.root_call(comm, check))


def test_segmentation_command_line_main_in_parallel(comm, shared_tmp_path):
    d = shared_tmp_path / "cli"
    rc = main(["--out", str(d), "--samples", "3", "--size", "4", "--channels", "1",
               "--seed", "2", "--task", "segmentation", "--classes", "3"])
    assert_all_ranks(comm, rc == 0)
    _check_segmentation_files(comm, [str(d / f"sample_{i:06d}.h5") for i in range(3)], 3, 4, 1,
                              3, 2)


def test_bad_arguments(comm, shared_tmp_path):
    for kw, exc in [({"samples": -1}, ValueError), ({"size": 1}, ValueError),
                    ({"layout": "zip"}, ValueError), ({"dtype": "int32"}, TypeError),
                    ({"task": "zip"}, ValueError),
                    ({"task": "segmentation", "classes": 1}, ValueError),
                    ({"task": "segmentation", "classes": 9}, ValueError),
                    ({"task": "segmentation", "y_dataset": "full"}, ValueError)]:
        args = dict(out=shared_tmp_path / "bad", samples=2)
        args.update(kw)
        ok = False
        try:
            io.generate_synthetic(**args)
        except exc:
            ok = True
        assert_all_ranks(comm, ok, str(kw))


def test_rank_dependent_arguments_raise_before_anything_is_written(comm, shared_tmp_path):
    if SIZE == 1:
        pytest.skip("needs ranks that can disagree")
    from disttensor.core.agreement import ArgumentMismatchError
    last = comm.rank == SIZE - 1

    def per_rank(bad, good):
        return bad if last else good

    d = shared_tmp_path
    for what, kw in [("out", {"out": per_rank(d / "b", d / "a")}),
                     ("samples", {"samples": per_rank(3, 2)}),
                     ("size", {"size": per_rank(5, 4)}),
                     ("channels", {"channels": per_rank(1, 2)}),
                     ("seed", {"seed": per_rank(1, 0)}),
                     ("layout", {"layout": per_rank("stacked", "files")}),
                     ("dtype", {"dtype": per_rank("float64", "float32")}),
                     ("task", {"task": per_rank("segmentation", "regression")}),
                     ("classes", {"task": "segmentation", "classes": per_rank(4, 3)}),
                     ("y_dataset", {"y_dataset": per_rank("t", None)}),
                     ("samples", {"samples": per_rank(-1, 2)})]:  # invalid on one rank only
        args = {"out": d / "a", "samples": 2, "size": 4, "channels": 2, **kw}
        assert_raises_all(comm, ArgumentMismatchError,
                          rf"generate_synthetic: arguments differ between ranks.*'{what}' "
                          r"\(rank 0: ", lambda: io.generate_synthetic(**args))
        left = _h5file.root_call(comm, lambda: sorted(os.listdir(d)))
        assert_all_ranks(comm, left == [], f"{what}: {left}")
    # equal arguments in different forms agree
    paths = io.generate_synthetic(per_rank(str(d / "a"), d / "a"), 2, size=4, channels=1,
                                  dtype=per_rank(np.float32, "f4"))
    assert_all_ranks(comm, len(paths) == 2)


def test_files_layout_removes_stale_temporary_files(comm, shared_tmp_path):
    """A generation killed mid-way leaves temporary sample files; the next run removes those of
    dead writers on this host (each rank those of its own samples) and nothing else."""
    import subprocess
    d = shared_tmp_path / "f"
    n = 2 * SIZE + 1

    def plant():
        os.makedirs(d)
        p = subprocess.Popen(["true"])
        p.wait()
        here = _temps.host_tag()
        stale = [f".sample_{i:06d}.h5.{here}.{p.pid}.{os.urandom(6).hex()}.tmp" for i in range(n)]
        kept = [f".sample_{n:06d}.h5.{here}.{p.pid}.{os.urandom(6).hex()}.tmp",  # not written
                f".sample_000000.h5.{here}.{os.getppid()}.{os.urandom(6).hex()}.tmp"]  # live
        for name in stale + kept:
            (d / name).write_bytes(b"partial")
        return kept
    kept = _h5file.root_call(comm, plant)
    io.generate_synthetic(d, n, size=4, channels=1, seed=0)
    left = _h5file.root_call(comm, lambda: sorted(os.listdir(d)))
    want = sorted(kept + [f"sample_{i:06d}.h5" for i in range(n)])
    assert_all_ranks(comm, left == want, f"{left}")
