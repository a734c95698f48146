"""Checkpoints under MPI: round trips, loading on another grid, atomic replacement."""
from __future__ import annotations

import errno
import os

import h5py
import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from disttensor import io
from disttensor.core.agreement import ArgumentMismatchError
from disttensor.io import _h5file, _sessions, _temps
from conftest import assert_all_ranks, assert_allclose_all, assert_raises_all

SIZE = MPI.COMM_WORLD.Get_size()
DRIVERS = [d for d in ("mpio", "independent") if io.hdf5_driver_available(d)]


def _state(g):
    """Parameters and optimizer state of a toy model on grid ``g`` (1-d or 2-d)."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((5, 3, 3, 3)).astype("float32")
    m = rng.standard_normal((9, 4)).astype("float64")
    uneven = rng.integers(0, 100, (7, 2)).astype("int16")
    p = g.dims[0]
    sizes = [0] * p
    sizes[-1] = 7  # everything on the last coordinate: an unbalanced distribution
    arrays = {
        "model/conv1/weight": dt.from_global(w, grid=g, split=(0,)),
        "model/fc/bias": dt.from_global(np.arange(4.0, dtype="float32"), grid=g, split=()),
        "opt/m": dt.from_global(m, grid=g, split=(None, 0)),
        "uneven": dt.from_global(uneven, grid=g, split=(0,), sizes=[sizes, None]),
        "flags": dt.from_global(rng.random(6) > 0.5, grid=g),
        "empty": dt.zeros((0, 3), dtype="complex64", grid=g),
    }
    host = {"rng_state": np.arange(8, dtype=np.uint64), "betas": np.array([0.9, 0.999]),
            "scalar_host": np.array(1.5)}
    scalars = {"step": 1234, "epoch": 3, "lr": 1e-3, "name": "cosmoflow", "done": False,
               "empty": "", "big": 2**62, "neg": -7}
    return arrays, host, scalars, {"w": w, "m": m, "uneven": uneven}


def _same_state(comm, arrays, host, scalars, ref):
    a0, h0, s0, _ = ref
    assert_all_ranks(comm, sorted(arrays) == sorted(a0), f"{sorted(arrays)}")
    for n, x in a0.items():
        y = arrays[n]
        assert_all_ranks(comm, y.shape == x.shape and y.dtype == x.dtype,
                         f"{n}: {y.shape}/{y.dtype} vs {x.shape}/{x.dtype}")
        assert_allclose_all(comm, y.local, x.to_numpy()[y.local_slices], rtol=0,
                            err_msg=n)
    assert_all_ranks(comm, sorted(host) == sorted(h0))
    for n, v in h0.items():
        assert_all_ranks(comm, host[n].dtype == v.dtype and np.array_equal(host[n], v), n)
    assert_all_ranks(comm, scalars == s0, f"{scalars} != {s0}")
    assert_all_ranks(comm, all(type(scalars[k]) is type(v) for k, v in s0.items()),
                     f"{ {k: type(v).__name__ for k, v in scalars.items()} }")


@pytest.mark.parametrize("driver", DRIVERS)
def test_round_trip_same_grid(comm, shared_tmp_path, driver):
    g = dt.ProcessGrid((SIZE,))
    ref = _state(g)
    arrays, host, scalars, _ = ref
    path = shared_tmp_path / "ck.h5"
    io.save_checkpoint(path, arrays, host, scalars, driver=driver)
    a, h, s = io.load_checkpoint(path, grid=g, driver=driver)
    _same_state(comm, a, h, s, ref)
    for n, x in arrays.items():  # the very same distributions come back (unbalanced too)
        assert_all_ranks(comm, a[n].distribution == x.distribution, n)

    def serial():  # plain h5py sees the global arrays and the recorded distribution
        with h5py.File(path, "r") as f:
            return (np.array_equal(f["arrays/model/conv1/weight"][...], ref[3]["w"]),
                    f.attrs["format"], list(f["arrays/uneven"].attrs["dt_split"]),
                    int(f["scalars"].attrs["step"]))
    res = _h5file.root_call(comm, serial)
    assert_all_ranks(comm, res == (True, "disttensor.checkpoint", [0, -1], 1234), str(res))
    g.free()


@pytest.mark.parametrize("driver", DRIVERS)
def test_written_on_a_sub_grid_loads_on_all_ranks(comm, shared_tmp_path, driver):
    """Saved by 2 ranks (a grid over a sub-communicator; 1 rank when there are fewer than 3),
    loaded on every rank with the new grid's distribution."""
    w = 2 if SIZE >= 3 else 1
    sub = comm.Split(0 if comm.rank < w else MPI.UNDEFINED, comm.rank)
    path = shared_tmp_path / "sub.h5"
    if sub != MPI.COMM_NULL:
        gs = dt.ProcessGrid((w,), comm=sub)
        arrays, host, scalars, _ = _state(gs)
        io.save_checkpoint(path, arrays, host, scalars, driver=driver)
        gs.free()
        sub.Free()
    comm.Barrier()
    g = dt.ProcessGrid((SIZE,))
    ref_grid = dt.ProcessGrid((1,), comm=MPI.COMM_SELF)  # the reference state, locally
    ref = _state(ref_grid)
    a, h, s = io.load_checkpoint(path, grid=g, driver=driver,
                                 split={"opt/m": (0, None), "model/fc/bias": (0,)})
    _same_state(comm, a, h, s, ref)
    assert_all_ranks(comm, a["opt/m"].split == (0, None) and a["model/fc/bias"].split == (0,))
    assert_all_ranks(comm, a["model/conv1/weight"].split == (0, None, None, None))
    assert_all_ranks(comm, a["uneven"].distribution.is_balanced(0) or w == SIZE)
    # grid=None: a grid of the saved shape over the default grid's communicator if it fits
    a2, _, _ = io.load_checkpoint(path, driver=driver)
    want_dims = (w,) if w == SIZE else dt.get_default_grid().dims
    assert_all_ranks(comm, all(x.grid.dims == want_dims for x in a2.values()),
                     str({n: x.grid.dims for n, x in a2.items()}))
    _same_state(comm, a2, h, s, ref)
    ref_grid.free()
    g.free()


def test_load_on_a_2d_grid(comm, shared_tmp_path):
    g = dt.ProcessGrid((SIZE,))
    ref = _state(g)
    path = shared_tmp_path / "to2d.h5"
    io.save_checkpoint(path, *ref[:3])
    g2 = dt.ProcessGrid((1, SIZE))
    a, h, s = io.load_checkpoint(path, grid=g2, split={"model/conv1/weight": (1, None, 0)})
    _same_state(comm, a, h, s, ref)
    assert_all_ranks(comm, a["model/conv1/weight"].split == (1, None, 0, None))
    assert_all_ranks(comm, a["opt/m"].split == (None, 0) and a["opt/m"].grid is g2)
    g2.free()
    g.free()


@pytest.mark.parametrize("driver", DRIVERS)
def test_failure_mid_write_keeps_the_last_checkpoint(comm, shared_tmp_path, driver, monkeypatch):
    """While a checkpoint is being written, `path` still holds the previous one; when a rank
    fails (injected ENOSPC after its block went out, or a crash-like error), every rank
    raises, the temporary file is removed and the previous checkpoint loads as before."""
    g = dt.ProcessGrid((SIZE,))
    path = shared_tmp_path / "last.h5"
    old = {"x": dt.from_global(np.arange(6.0), grid=g)}
    io.save_checkpoint(path, old, scalars={"step": 1}, driver=driver)
    new = {"x": dt.from_global(-np.arange(6.0), grid=g),
           "y": dt.zeros((100, 10), grid=g)}
    real = _sessions.write_from
    seen = []

    def failing(dset, start, data, dxpl):
        real(dset, start, data, dxpl)
        if comm.rank == 0:  # mid-write: the file at `path` is still the old checkpoint
            with h5py.File(path, "r") as f:
                seen.append(int(f["scalars"].attrs["step"]))
        if comm.rank == SIZE - 1 and dset.name == "/arrays/y":
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
    monkeypatch.setattr(_sessions, "write_from", failing)
    ok, msg = True, ""
    try:
        io.save_checkpoint(path, new, scalars={"step": 2}, driver=driver)
        ok, msg = False, "did not raise"
    except OSError as e:
        ok = "No space left on device" in str(e)
        msg = str(e)
    assert_all_ranks(comm, ok, msg)
    assert_all_ranks(comm, comm.rank != 0 or (seen and set(seen) == {1}), f"{seen}")
    monkeypatch.setattr(_sessions, "write_from", real)
    a, _, s = io.load_checkpoint(path, grid=g, driver=driver)
    assert_all_ranks(comm, sorted(a) == ["x"] and s == {"step": 1})
    assert_allclose_all(comm, a["x"].to_numpy(), np.arange(6.0))
    left = [p for p in os.listdir(shared_tmp_path) if p.endswith(".tmp")] if comm.rank == 0 else []
    assert_all_ranks(comm, not left, f"{left}")
    # and a successful save replaces it
    io.save_checkpoint(path, new, scalars={"step": 2}, driver=driver)
    a, _, s = io.load_checkpoint(path, grid=g, driver=driver)
    assert_all_ranks(comm, sorted(a) == ["x", "y"] and s == {"step": 2})
    g.free()


def test_checkpoint_errors(comm, shared_tmp_path):
    g = dt.ProcessGrid((SIZE,))
    x = dt.zeros((4,), grid=g)
    p = shared_tmp_path / "e.h5"
    io.write_hdf5(x, p, "x", mode="w")
    assert_raises_all(comm, ValueError, "not a disttensor checkpoint",
                       lambda: io.load_checkpoint(p, grid=g))
    assert_raises_all(comm, FileNotFoundError, "no such checkpoint",
                       lambda: io.load_checkpoint(shared_tmp_path / "none.h5", grid=g))
    assert_raises_all(comm, TypeError, "must be a DistArray",
                       lambda: io.save_checkpoint(p, {"x": np.zeros(3)}))
    assert_raises_all(comm, TypeError, "must be an int, float, bool or str",
                       lambda: io.save_checkpoint(p, {"x": x}, scalars={"s": [1, 2]}))
    assert_raises_all(comm, ValueError, "does not fit in int64",
                       lambda: io.save_checkpoint(p, {"x": x}, scalars={"s": 2**70}))
    assert_raises_all(comm, ValueError, "invalid array name",
                       lambda: io.save_checkpoint(p, {"a//b": x}))
    if SIZE > 1:
        assert_raises_all(comm, ValueError, "differ between ranks",
                           lambda: io.save_checkpoint(p, {"x": x}, scalars={"r": comm.rank}))
    io.save_checkpoint(shared_tmp_path / "ck_ok.h5", {"x": x})
    assert_raises_all(comm, ValueError, "does not hold",
                       lambda: io.load_checkpoint(shared_tmp_path / "ck_ok.h5", grid=g,
                                                  split={"nope": (0,)}))
    assert_raises_all(comm, TypeError, "split must be None or a dict",
                       lambda: io.load_checkpoint(shared_tmp_path / "ck_ok.h5", grid=g,
                                                  split=(0,)))
    g.free()


def _listing(comm, d):
    return _h5file.root_call(comm, lambda: sorted(os.listdir(d)))


@pytest.mark.parametrize("driver", DRIVERS)
def test_rank_dependent_arguments_raise_before_anything_is_written(comm, shared_tmp_path,
                                                                   driver):
    """save_checkpoint / load_checkpoint with an argument that differs on the last rank raise
    ArgumentMismatchError on every rank, naming it; the previous checkpoint is untouched and no
    temporary file is left."""
    if SIZE == 1:
        pytest.skip("needs ranks that can disagree")
    g = dt.ProcessGrid((SIZE,))
    path = shared_tmp_path / "ck.h5"
    a = {"w": dt.from_global(np.arange(6.0), grid=g), "b": dt.zeros((3,), grid=g)}
    io.save_checkpoint(path, a, {"h": np.arange(3)}, {"step": 1}, driver=driver)
    last = comm.rank == SIZE - 1

    def per_rank(bad, good):
        return bad if last else good

    w_f4 = dt.from_global(np.arange(6.0, dtype="float32"), grid=g)
    w_rep = dt.from_global(np.arange(6.0), grid=g, split=(None,))
    save = lambda arrays=a, host={"h": np.arange(3)}, scalars={"step": 2}, p=path, **kw: \
        lambda: io.save_checkpoint(p, arrays, host, scalars, driver=driver, **kw)  # noqa: E731
    cases = [
        ("path", save(p=per_rank(shared_tmp_path / "other.h5", path))),
        ("arrays", save(arrays=per_rank({"w": a["w"]}, a))),  # a different name set
        ("arrays", save(arrays=per_rank({"w": w_f4, "b": a["b"]}, a))),  # dtype
        ("arrays", save(arrays=per_rank({"w": w_rep, "b": a["b"]}, a))),  # distribution
        ("host", save(host=per_rank({"h": np.arange(4)}, {"h": np.arange(3)}))),
        ("host", save(host=per_rank({}, {"h": np.arange(3)}))),
        ("scalars", save(scalars={"step": per_rank(3, 2)})),
        ("scalars", save(scalars=per_rank({"step": 2, "lr": 0.1}, {"step": 2}))),
        ("scalars", save(scalars={"step": per_rank([1], 2)})),  # invalid on one rank only
        ("driver", lambda: io.save_checkpoint(path, a, driver=per_rank("posix", driver))),
    ]
    for what, fn in cases:
        assert_raises_all(comm, ArgumentMismatchError,
                          rf"save_checkpoint: arguments differ between ranks.*'{what}' "
                          r"\(rank 0: ", fn)
        assert_all_ranks(comm, _listing(comm, shared_tmp_path) == ["ck.h5"],
                         f"{what}: {_listing(comm, shared_tmp_path)}")
    def load(p=path, **kw):
        kw = {"driver": driver, **kw}
        return lambda: io.load_checkpoint(p, grid=g, **kw)
    for what, fn in [("path", load(p=per_rank(shared_tmp_path / "none.h5", path))),
                     ("split", load(split=per_rank({"w": (None,)}, None))),
                     ("split", load(split={"w": per_rank((None,), (0,))})),
                     ("device", load(device=per_rank("cuda", "cpu"))),
                     ("driver", load(driver=per_rank("posix", driver)))]:
        assert_raises_all(comm, ArgumentMismatchError,
                          rf"load_checkpoint: arguments differ between ranks.*'{what}' "
                          r"\(rank 0: ", fn)
    arrays, host, scalars = io.load_checkpoint(per_rank(str(path), path), grid=g, driver=driver)
    assert_all_ranks(comm, scalars == {"step": 1} and sorted(arrays) == ["b", "w"])
    assert_allclose_all(comm, arrays["w"].to_numpy(), np.arange(6.0))
    g.free()


def _dead_pid() -> int:
    import subprocess
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_save_removes_stale_temporary_files(comm, shared_tmp_path, monkeypatch):
    """A checkpoint save removes the temporary files that killed saves to the same path left
    (this host: writer gone; another host: older than DISTTENSOR_STALE_TMP_AGE), keeps those
    of live or recent writers, and leaves exactly the checkpoint and those."""
    g = dt.ProcessGrid((SIZE,))
    d = shared_tmp_path
    here = _temps.host_tag()
    monkeypatch.setenv("DISTTENSOR_STALE_TMP_AGE", "120")

    def plant():
        def mk(host, pid, age=0):
            n = f".ck.h5.{host}.{pid}.{os.urandom(6).hex()}.tmp"
            (d / n).write_bytes(b"partial checkpoint")
            if age:
                t = (d / n).stat().st_mtime - age
                os.utime(d / n, (t, t))
            return n
        stale = [mk(here, _dead_pid()), mk(here, _dead_pid(), 10), mk("node-b", 77, 300)]
        kept = [mk(here, os.getppid()), mk("node-b", 77, 60)]
        return stale, kept
    stale, kept = _h5file.root_call(comm, plant)
    x = dt.from_global(np.arange(5.0), grid=g)
    io.save_checkpoint(d / "ck.h5", {"x": x}, scalars={"step": 7})
    left = _listing(comm, d)
    assert_all_ranks(comm, left == sorted(kept + ["ck.h5"]), f"{left}; stale {stale}")
    monkeypatch.setenv("DISTTENSOR_STALE_TMP_AGE", "30")  # now the foreign one is old enough
    io.save_checkpoint(d / "ck.h5", {"x": x}, scalars={"step": 8})
    left = _listing(comm, d)
    assert_all_ranks(comm, left == sorted([kept[0], "ck.h5"]), f"{left}")
    monkeypatch.setenv("DISTTENSOR_STALE_TMP_AGE", "soon")
    assert_raises_all(comm, ValueError, "DISTTENSOR_STALE_TMP_AGE='soon'",
                      lambda: io.save_checkpoint(d / "ck.h5", {"x": x}))
    _, _, s = io.load_checkpoint(d / "ck.h5", grid=g)
    assert_all_ranks(comm, s == {"step": 8})
    g.free()
