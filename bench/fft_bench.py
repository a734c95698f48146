"""Distributed 3-D FFT vs numpy.fft.fftn on one rank (run: mpiexec -n 2 python bench/fft_bench.py).

A complex128 array of ``--size``^3 (default 256^3, 256 MiB) split along axis 0 over all
ranks (a slab) is transformed by ``disttensor.fft.fftn`` (local 2-D FFTs of axes 1 and 2, one
redistribution moving the split to axis 1, local FFTs of axis 0; the output is split along
axis 1).  The baseline is ``numpy.fft.fftn`` of the same global array on rank 0 alone (the
other ranks wait), in the same run.  Calls are interleaved rep by rep, each after a barrier,
timed as the slowest rank; medians over ``--reps`` after ``--warmup``.  Also timed: the
redistribution alone (``x.redistribute``) and the slab FFT with ``out_split='input'`` (one more
redistribution).  The result is checked against NumPy's (max error relative to max |X|).
mpi4py-fft is timed too if it is importable (it is not installed here).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import disttensor as dt  # noqa: E402
from _results import record  # noqa: E402
from _timing import compare  # noqa: E402

COMM = MPI.COMM_WORLD


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    args = ap.parse_args()
    n = args.size
    shape = (n, n, n)
    g = dt.ProcessGrid((COMM.size,))
    rng = dt.random.default_rng(0)
    x = (rng.normal(0.0, 1.0, shape, grid=g, split=0)
         + 1j * rng.normal(0.0, 1.0, shape, grid=g, split=0))
    a = x.gather(root=0)  # the global array on rank 0 only

    fns = {
        "disttensor fftn": lambda: dt.fft.fftn(x),
        "disttensor fftn out_split=input": lambda: dt.fft.fftn(x, out_split="input"),
        "redistribute (0->1)": lambda: x.redistribute(split=(None, 0, None)),
        "numpy fftn, 1 rank": (lambda: np.fft.fftn(a)) if COMM.rank == 0 else (lambda: None),
    }
    try:
        from mpi4py_fft import PFFT, newDistArray  # noqa: F401
        fft = PFFT(COMM, shape, dtype=np.complex128, grid=(COMM.size, 1, 1))
        u = newDistArray(fft, False)
        u[:] = x.local
        fns["mpi4py-fft forward"] = lambda: fft.forward(u)
    except ImportError:
        pass
    t = compare(fns, args.reps, args.warmup)

    y = dt.fft.fftn(x)
    ref = np.fft.fftn(a) if COMM.rank == 0 else None
    yg = y.gather(root=0)
    if COMM.rank == 0:
        err = np.abs(yg - ref).max() / np.abs(ref).max()
        base = t["numpy fftn, 1 rank"]
        print(f"3-D FFT {n}^3 complex128 ({16 * n**3 / 2**20:.0f} MiB), {COMM.size} ranks, "
              f"grid {g.dims}, median of {args.reps}; output split {y.split}")
        for k, v in t.items():
            print(f"  {k:34s} {v * 1e3:9.1f} ms   numpy/this = {base / v:5.2f}")
            if k != "numpy fftn, 1 rank":
                record("fft", f"{n}^3 {k}", "numpy_over_this", base / v, "x",
                       ranks=COMM.size)
        if "mpi4py-fft forward" in t:
            record("fft", f"{n}^3 fftn", "mpi4pyfft_over_ours",
                   t["mpi4py-fft forward"] / t["disttensor fftn"], "x",
                   ranks=COMM.size)
        print(f"  max |dt - numpy| / max |numpy| = {err:.2e}")


if __name__ == "__main__":
    main()
