"""Temporary files of atomic writes: their names, the staleness rule, and a save killed
mid-write followed by another save (single process, and a 2-rank ``mpiexec`` job).

Plain pytest (no MPI launcher); the kill tests start their own processes."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from disttensor.io import _atomic, _h5file, _sessions, _temps

ROOT = Path(__file__).resolve().parents[2]
HERE = _temps.host_tag()


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.fixture
def sleeper():
    """A live process of this host (started now)."""
    p = subprocess.Popen(["sleep", "60"])
    yield p
    p.kill()
    p.wait()


def _touch(path: Path, age_s: float = 0.0, data: bytes = b"partial") -> Path:
    path.write_bytes(data)
    if age_s:
        t = time.time() - age_s
        os.utime(path, (t, t))
    return path


def _name(base, host, pid, rand=None):
    return f".{base}.{host}.{pid}.{rand or os.urandom(6).hex()}.tmp"


# -- names -------------------------------------------------------------------------------------
def test_temp_name_pattern_and_parsing(tmp_path):
    t = _temps.temp_path_for(tmp_path / "ck.h5")
    try:
        d, n = os.path.split(t)
        assert d == str(tmp_path)
        assert n.startswith(f".ck.h5.{HERE}.{os.getpid()}.") and n.endswith(".tmp")
        assert _temps.parse_temp_name(n) == (
            "ck.h5", HERE, os.getpid(), n[len(f".ck.h5.{HERE}.{os.getpid()}."):-4])
    finally:
        _temps.remove_quietly(t)
    assert "." not in HERE and HERE
    # base names with dots, and the older pattern without a writer
    assert _temps.parse_temp_name(".a.b.c.h5.node-1.17.0123456789ab.tmp") == \
        ("a.b.c.h5", "node-1", 17, "0123456789ab")
    assert _temps.parse_temp_name(".ck.h5.0123456789ab.tmp") == ("ck.h5", None, None,
                                                               "0123456789ab")
    for other in ("ck.h5", ".ck.h5.tmp", "ck.h5.node.1.0123456789ab.tmp",
                  ".ck.h5.node.1.0123456789AB.tmp", ".ck.h5.node.x.0123456789ab.tmp",
                  ".ck.h5.node.1.0123456789ab.tmp.bak", ".ck.h5.0123456789a.tmp"):
        p = _temps.parse_temp_name(other)
        assert p is None or p.host is None and p.base != "ck.h5", (other, p)


# -- the staleness rule ------------------------------------------------------------------------
def test_dead_writer_removed_live_writer_kept(tmp_path, sleeper):
    dead = _touch(tmp_path / _name("ck.h5", HERE, _dead_pid()))
    live = _touch(tmp_path / _name("ck.h5", HERE, sleeper.pid))
    time.sleep(0.05)
    assert _temps.temp_is_stale(dead)
    assert not _temps.temp_is_stale(live)
    # a live local writer's file is never removed by age (other hosts' are)
    assert not _temps.temp_is_stale(live, age=0.0, now=time.time() + 10)
    removed = _temps.remove_stale_temps(tmp_path, {"ck.h5"})
    assert removed == [str(dead)]
    assert live.exists()


def test_zombie_and_reused_pid_count_as_dead(tmp_path, sleeper):
    z = subprocess.Popen(["sleep", "60"])
    z.send_signal(signal.SIGKILL)
    for _ in range(100):  # until the kernel made it a zombie (not reaped: no wait yet)
        with open(f"/proc/{z.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.01)
    try:
        zombie = _touch(tmp_path / _name("a.h5", HERE, z.pid))
        assert _temps.temp_is_stale(zombie)
    finally:
        z.wait()
    # the sleeper started now: it cannot have written a file last modified an hour ago
    reused = _touch(tmp_path / _name("a.h5", HERE, sleeper.pid), age_s=3600)
    assert _temps.temp_is_stale(reused)
    recent = _touch(tmp_path / _name("a.h5", HERE, sleeper.pid))
    assert not _temps.temp_is_stale(recent)


def test_own_pid_stale_unless_in_flight(tmp_path):
    mine = _temps.temp_path_for(tmp_path / "f.h5")
    _touch(Path(mine))
    leftover = _touch(tmp_path / _name("f.h5", HERE, os.getpid()))  # an earlier process
    assert not _temps.temp_is_stale(mine)
    assert _temps.temp_is_stale(leftover)
    assert _temps.remove_stale_temps(tmp_path, {"f.h5"}) == [str(leftover)]
    _temps.remove_quietly(mine)  # ends the write: no longer in flight
    assert not os.path.exists(mine)
    _touch(Path(mine))
    assert _temps.temp_is_stale(mine)


def test_other_hosts_and_old_pattern_by_age(tmp_path, monkeypatch):
    recent = _touch(tmp_path / _name("f.h5", "node-b", 12))
    old = _touch(tmp_path / _name("f.h5", "node-b", 12), age_s=2 * 3600)
    legacy_recent = _touch(tmp_path / ".f.h5.0123456789ab.tmp", age_s=60)
    legacy_old = _touch(tmp_path / ".f.h5.ba9876543210.tmp", age_s=2 * 3600)
    monkeypatch.delenv(_temps.STALE_TMP_AGE_ENV, raising=False)
    assert _temps.stale_temp_age() == 3600
    assert [_temps.temp_is_stale(p) for p in (recent, old, legacy_recent, legacy_old)] == \
        [False, True, False, True]
    monkeypatch.setenv(_temps.STALE_TMP_AGE_ENV, "never")
    assert not any(_temps.temp_is_stale(p) for p in (recent, old, legacy_recent, legacy_old))
    monkeypatch.setenv(_temps.STALE_TMP_AGE_ENV, "-1")
    assert _temps.stale_temp_age() == float("inf")
    monkeypatch.setenv(_temps.STALE_TMP_AGE_ENV, "30")
    assert [_temps.temp_is_stale(p) for p in (recent, old, legacy_recent, legacy_old)] == \
        [False, True, True, True]
    assert sorted(_temps.remove_stale_temps(tmp_path, {"f.h5"})) == \
        sorted(map(str, (old, legacy_recent, legacy_old)))
    assert sorted(os.listdir(tmp_path)) == [recent.name]
    monkeypatch.setenv(_temps.STALE_TMP_AGE_ENV, "1h")
    with pytest.raises(ValueError, match="DISTTENSOR_STALE_TMP_AGE='1h'"):
        _temps.stale_temp_age()


def test_foreign_names_untouched(tmp_path):
    dead = _dead_pid()
    keep = [
        "ck.h5",                                     # the target itself
        _name("ck.h5.bak", HERE, dead),              # another target whose name extends ours
        _name("other.h5", HERE, dead),               # another target
        f"ck.h5.{HERE}.{dead}.0123456789ab.tmp",     # not hidden
        f".ck.h5.{HERE}.{dead}.0123456789ab.tmp~",   # another suffix
        f".ck.h5.{HERE}.{dead}.0123456789AB.tmp",    # not our random part
        f".ck.h5.{HERE}.{dead}.tmp",                 # no random part
        ".ck.h5.tmp", ".ck.h5.swp", "notes.txt",
    ]
    for n in keep:
        _touch(tmp_path / n, age_s=10 * 86400)
    d = tmp_path / _name("ck.h5", HERE, dead)        # our pattern, but a directory
    d.mkdir()
    link = tmp_path / _name("ck.h5", HERE, dead)     # our pattern, but a symbolic link
    link.symlink_to(tmp_path / "notes.txt")
    stale = _touch(tmp_path / _name("ck.h5", HERE, dead))
    assert _temps.remove_stale_temps(tmp_path, {"ck.h5"}) == [str(stale)]
    assert sorted(os.listdir(tmp_path)) == sorted(keep + [d.name, link.name])
    assert _temps.remove_stale_temps(tmp_path / "missing", {"ck.h5"}) == []  # errors ignored


def test_atomic_update_cleans_before_writing(tmp_path):
    p = tmp_path / "k.h5"
    stale = [_touch(tmp_path / _name("k.h5", HERE, _dead_pid())),
             _touch(tmp_path / _name("k.h5", "node-b", 3), age_s=7200)]
    fresh = _touch(tmp_path / _name("k.h5", "node-b", 3))

    def body(s):
        s.create([_sessions.DatasetSpec("x", (2,), np.dtype("f4"))])
        s.write([("x", (0,), np.ones(2, "f4"))])
    _atomic.atomic_update(None, p, "independent", "w", True, 8, body)
    assert sorted(os.listdir(tmp_path)) == sorted(["k.h5", fresh.name])
    assert not any(s.exists() for s in stale)


# -- killed mid-write, then saved again ------------------------------------------------------------
CHILD = r"""
import os, sys, time
import numpy as np
from mpi4py import MPI
import disttensor as dt
from disttensor import io
from disttensor.io import _sessions

path, step, mode, marks = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
comm = MPI.COMM_WORLD
with open(os.path.join(marks, f"pid-{comm.rank}"), "w") as f:
    f.write(str(os.getpid()))
g = dt.ProcessGrid((comm.size,))
x = dt.from_global(np.arange(20000.0) * step, grid=g)
if mode == "hang":
    real = _sessions.write_from

    def slow(dset, start, data, dxpl):
        real(dset, start, data, dxpl)
        # this rank's block is in the temporary file; the rename has not happened yet
        with open(os.path.join(marks, f"mid-write-{comm.rank}"), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)
    _sessions.write_from = slow
io.save_checkpoint(path, {"x": x}, scalars={"step": step}, driver=sys.argv[5])
"""


def _launcher(nprocs):
    if nprocs == 1:
        return []
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("mpiexec not found")
    cmd = ["timeout", "-k", "5", "120", mpiexec]
    shim = ROOT / "build" / "libmpi_idle_sleep.so"
    if os.environ.get("DISTTENSOR_MPI_IDLE_SLEEP", "1") != "0" and shim.exists():
        cmd += ["-genv", "LD_PRELOAD", str(shim)]
    return cmd + ["-n", str(nprocs)]


def _run(nprocs, args, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    return subprocess.Popen(_launcher(nprocs) + [sys.executable, "-c", CHILD, *map(str, args)],
                            env=env, cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def _finish(p, timeout=120):
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"timed out:\n{out}")
    return p.returncode, out


def _drivers():
    return [d for d in ("mpio", "independent")
            if d == "independent" or _h5file.h5py_has_mpi()]


@pytest.mark.parametrize("nprocs", [1, 2])
@pytest.mark.parametrize("driver", _drivers())
def test_kill_during_checkpoint_save_then_save_leaves_one_file(tmp_path, nprocs, driver):
    """A save SIGKILLed while its data is in the temporary file leaves the previous checkpoint
    intact and the temporary file behind; the next save to the same path removes it: the
    directory holds exactly the checkpoint, the new one."""
    d = tmp_path / "ckpt"
    d.mkdir()
    path = d / "model.h5"
    rc, out = _finish(_run(nprocs, [path, 1, "save", tmp_path, driver]))
    assert rc == 0, out
    marks = tmp_path / "marks"
    marks.mkdir()
    p = _run(nprocs, [path, 2, "hang", marks, driver])
    try:
        deadline = time.monotonic() + 90
        while not (marks / "mid-write-0").exists():
            assert p.poll() is None, p.communicate()[0]
            assert time.monotonic() < deadline, "the save never reached its data write"
            time.sleep(0.05)
        time.sleep(0.2)  # let the other ranks get into their own write (mpio) or wait
        temps = [n for n in os.listdir(d) if n != "model.h5"]
        assert len(temps) == 1 and _temps.parse_temp_name(temps[0]).base == "model.h5", temps
        pids = [int((marks / f"pid-{r}").read_text()) for r in range(nprocs)]
        assert _temps.parse_temp_name(temps[0]).pid == pids[0]
        for pid in pids:  # the whole job dies at once, as when a node or batch job is killed
            os.kill(pid, signal.SIGKILL)
    finally:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(p.pid, signal.SIGKILL)  # whatever of the job is left
        except ProcessLookupError:
            pass
        p.communicate()
    assert sorted(os.listdir(d)) == sorted(["model.h5"] + temps)  # left behind
    with h5py.File(path, "r") as f:  # the previous checkpoint is intact
        assert int(f["scalars"].attrs["step"]) == 1
    rc, out = _finish(_run(nprocs, [path, 3, "save", tmp_path, driver]))
    assert rc == 0, out
    assert os.listdir(d) == ["model.h5"]
    with h5py.File(path, "r") as f:
        assert int(f["scalars"].attrs["step"]) == 3
        np.testing.assert_array_equal(f["arrays/x"][...], np.arange(20000.0) * 3)
