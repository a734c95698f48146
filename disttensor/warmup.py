"""``python -m disttensor.warmup``: compile the CPU kernels ahead, into Numba's on-disk cache.

Every Numba kernel of :mod:`disttensor.ops.local.cpu` (and :mod:`disttensor.sparse`) is
declared ``cache=True``: compiled once per signature, its machine code is written beside the
source (``__pycache__/*.nbi``, ``*.nbc``) or under ``$NUMBA_CACHE_DIR`` when that is set (or
when the package directory is not writable: Numba then uses the user's cache directory), and
later processes load it in milliseconds instead of compiling it for seconds.  Without a warm
cache the first training step of every process pays the compilation (about 35 s for a CosmoFlow
step on one core).

This command runs the common signatures once: a small CosmoFlow and a small 3D U-Net, forward
and backward with their losses and Adam, a few pointwise, normalization and resampling ops
and a step of each other optimizer, in float32 and float64, first on rank 0 alone, then
(under ``mpiexec -n 2``) on all ranks with the grid split along depth, so the halo'd,
non-contiguous block views that only multi-rank runs pass to the kernels are compiled too.
Every convolution algorithm the tuner may pick runs at least once (tuning runs in benchmark
mode with a zero budget into a throw-away plan cache, so the user's plan cache is left alone).

Cheap when already warm: a stamp (a hash of the kernel sources, Python, NumPy, Numba and the
CPU) is written next to the cache after a successful warm-up, and a later run with the same
stamp returns at once (``--force`` warms anyway).  Safe to run while other processes use the
cache: Numba writes each cache file to a temporary name and renames it into place, and an index
whose source file changed (timestamp and size) is ignored and recompiled, so a stale cache
costs a compilation, never a wrong kernel.

Collective over ``MPI.COMM_WORLD`` when started under ``mpiexec``; exits 0 when warm, 1 if a
warm-up step failed (the library still works: kernels then compile on first use).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["kernel_sources", "stamp_value", "stamp_path", "is_warm", "warm", "main"]

_PKG = Path(__file__).resolve().parent
#: the folders whose modules hold cached Numba kernels
_KERNEL_DIRS = ("ops/local/cpu", "sparse")
STAMP_NAME = "disttensor-warm.stamp"


def kernel_sources() -> list[Path]:
    """The source files whose kernels the cache holds (sorted)."""
    out = []
    for d in _KERNEL_DIRS:
        out += [p for p in (_PKG / d).rglob("*.py") if "njit" in p.read_text(errors="ignore")]
    return sorted(out)


def stamp_value() -> str:
    """A hash of what the compiled code depends on: the kernel sources, Python, NumPy, Numba,
    the machine and CPU model."""
    import numba
    import numpy as np
    h = hashlib.sha256()
    for p in kernel_sources():
        h.update(str(p.relative_to(_PKG)).encode())
        h.update(p.read_bytes())
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    h.update(repr((sys.version, np.__version__, numba.__version__, platform.machine(),
                   cpu)).encode())
    return h.hexdigest()


def stamp_path() -> Path:
    """Where the stamp lives: ``$NUMBA_CACHE_DIR`` if set, else the ``__pycache__`` of the
    kernels (where Numba writes their cache), else ``~/.cache/disttensor``."""
    d = os.environ.get("NUMBA_CACHE_DIR")
    if d:
        return Path(d) / STAMP_NAME
    pyc = _PKG / "ops" / "local" / "cpu" / "__pycache__"
    try:
        pyc.mkdir(exist_ok=True)
        if os.access(pyc, os.W_OK):
            return pyc / STAMP_NAME
    except OSError:
        pass
    return Path.home() / ".cache" / "disttensor" / STAMP_NAME


def is_warm() -> bool:
    """Whether the stamp of a finished warm-up matches this installation."""
    try:
        return stamp_path().read_text().strip() == stamp_value()
    except OSError:
        return False


def _steps(grid, dtype: str):
    """The warm-up steps on ``grid`` in ``dtype``: ``{name: fn}`` (names: :data:`_STEPS`)."""
    import numpy as np

    import disttensor as dt
    from disttensor import nn
    from disttensor.autograd import Tensor
    from disttensor.nn import functional as F

    n = grid.dims[0] * 2
    rng = dt.random.default_rng(0)
    split = (0, None, 1, 2, 3)

    def cosmoflow():
        m = nn.models.cosmoflow(input_size=16, in_channels=2, widths=(4, 8), dense=(8,),
                                outputs=2, dtype=dtype, rng=np.random.default_rng(0))
        opt = nn.optim.Adam(m.parameters(), lr=1e-4)
        x = rng.normal(shape=(n, 2, 16, 16, 16), dtype=dtype, grid=grid, split=split)
        y = rng.uniform(-1, 1, shape=(n, 2), dtype=dtype, grid=grid, split=(0, None))
        for _ in range(2):  # the second step runs the tuned plans
            loss = F.mse_loss(m(Tensor(x)), Tensor(y))
            opt.zero_grad()
            loss.backward()
            opt.step()

    def unet():
        m = nn.models.unet3d(in_channels=1, classes=2, encoder=((4, 4),), bottom=(8, 8),
                             dtype=dtype, rng=np.random.default_rng(0))
        opt = nn.optim.Adam(m.parameters(), lr=1e-4)
        x = rng.normal(shape=(n, 1, 8, 8, 8), dtype=dtype, grid=grid, split=split)
        t = rng.integers(0, 2, shape=(n, 8, 8, 8), grid=grid, split=(0, 1, 2, 3))
        for _ in range(2):
            loss = F.cross_entropy(m(Tensor(x)), t)
            opt.zero_grad()
            loss.backward()
            opt.step()

    def pointwise():
        x = Tensor(rng.normal(shape=(n, 4, 8, 8, 8), dtype=dtype, grid=grid, split=split),
                   requires_grad=True)
        y = F.avg_pool3d(F.gelu(F.relu(x)), 2)
        y = F.group_norm(F.silu(y), 2)
        y = F.interpolate(y, scale_factor=2, mode="trilinear")
        (y * y).sum().backward()
        w = nn.Parameter(np.ones(8, dtype))     # the other compiled updates (Adam's ran above)
        w.grad = np.full(8, 0.5, dtype)
        for opt in (nn.optim.SGD([w], lr=0.1, momentum=0.9), nn.optim.RMSprop([w]),
                    nn.optim.Adagrad([w]), nn.optim.NAdam([w]), nn.optim.RAdam([w])):
            opt.step()

    return {"cosmoflow": cosmoflow, "unet3d": unet, "pointwise": pointwise}


_STEPS = ("cosmoflow", "unet3d", "pointwise")


def _polling_allgather(comm, obj):
    """``comm.allgather(obj)`` after a polling barrier (ranks waiting for rank 0's single-rank
    warm-up sleep instead of spinning on a core it needs)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.01)
    return comm.allgather(obj)


def warm(dtypes=("float32", "float64"), verbose: bool = True) -> list[str]:
    """Run the warm-up steps on every rank of ``COMM_WORLD`` (collective); returns the names
    of the steps that failed (on any rank), ``[]`` when all ran."""
    from mpi4py import MPI

    import disttensor as dt

    comm = MPI.COMM_WORLD
    # rank 0 alone first (contiguous blocks, every kernel compiled once), then all ranks on a
    # depth split (the halo'd block views; mostly cache loads by then)
    grids = [("1 rank", dt.ProcessGrid((1, 1, 1, 1), comm=MPI.COMM_SELF)
              if comm.rank == 0 else None)]
    if comm.size > 1:
        grids.append((f"{comm.size} ranks", dt.ProcessGrid((1, comm.size, 1, 1))))
    failed = []
    saved = {k: os.environ.get(k) for k in ("DISTTENSOR_CACHE_DIR", "DISTTENSOR_CONV_TUNE",
                                            "DISTTENSOR_CONV_TUNE_BUDGET_S")}
    with tempfile.TemporaryDirectory(prefix="disttensor-warm-") as tmp:
        os.environ["DISTTENSOR_CACHE_DIR"] = os.path.join(tmp, f"rank{comm.rank}")
        os.environ["DISTTENSOR_CONV_TUNE"] = "benchmark"
        os.environ["DISTTENSOR_CONV_TUNE_BUDGET_S"] = "0"
        try:
            for where, grid in grids:
                for dtype in dtypes:
                    for name in _STEPS:
                        t0 = time.perf_counter()
                        err = None
                        if grid is not None:
                            try:
                                _steps(grid, dtype)[name]()
                            except Exception as e:  # noqa: BLE001 - reported, others still run
                                err = f"{type(e).__name__}: {e}"
                        bad = [e for e in _polling_allgather(comm, err) if e]
                        if bad:
                            failed.append(f"{name} {dtype} ({where})")
                        if verbose and comm.rank == 0:
                            status = f"FAILED ({bad[0]})" if bad else "ok"
                            print(f"[warmup] {name:9s} {dtype} {where}: "
                                  f"{time.perf_counter() - t0:6.1f} s {status}", flush=True)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return failed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m disttensor.warmup", description=__doc__.split(
        "\n")[0])
    p.add_argument("--force", action="store_true", help="warm even if the stamp matches")
    p.add_argument("--check", action="store_true",
                   help="only report whether the cache is warm (exit 0 warm, 2 cold)")
    p.add_argument("--dtypes", default="float32,float64")
    args = p.parse_args(argv)
    warm_now = is_warm()
    if args.check:
        print(f"{'warm' if warm_now else 'cold'} ({stamp_path()})")
        return 0 if warm_now else 2
    if warm_now and not args.force:
        print(f"[warmup] kernel cache already warm ({stamp_path()})")
        return 0
    from mpi4py import MPI
    t0 = time.perf_counter()
    failed = warm(tuple(d.strip() for d in args.dtypes.split(",") if d.strip()))
    rank = MPI.COMM_WORLD.rank
    if failed:
        if rank == 0:
            print(f"[warmup] failed: {', '.join(failed)}; those kernels compile on first use",
                  file=sys.stderr)
        return 1
    if rank == 0:
        path = stamp_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(stamp_value() + "\n")
        os.replace(tmp, path)
        print(f"[warmup] kernel cache warm in {time.perf_counter() - t0:.1f} s ({path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
