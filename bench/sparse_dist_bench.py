"""Distributed sparse matrices: CG on a 3-D Laplacian and the distributed SpMV.

Run: ``mpiexec -n 4 .venv/bin/python bench/sparse_dist_bench.py [--n 64] [--reps 5]``.  In one
run, the matrix is built on the first 1, 2 and 4 ranks (sub-communicators of the job; the other
ranks wait), and for each:

* CG (``disttensor.sparse.linalg.cg``, ``rtol=1e-13``, no preconditioner and Jacobi) on the
  7-point Dirichlet Laplacian of an ``n^3`` grid with a fixed right-hand side; the solution is
  compared with the serial solution of the same system computed exactly by the discrete sine
  transform (SciPy's ``dstn``; the Laplacian is diagonal in the DST-I basis): relative error,
  iterations and seconds are printed;
* ``A @ x`` (median of ``reps`` timings of 20 products, the slowest rank's time): the 2-rank
  time against the 1-rank time in the same run (the speed-up), and the 1-rank time against
  SciPy's CSR ``A @ x`` on one process (when SciPy is installed).

4 ranks on this 2-core machine are oversubscribed: their times are not speed figures.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import disttensor as dt  # noqa: E402
from disttensor.core.array import DistArray  # noqa: E402
from disttensor.sparse.laplacian import laplacian_3d  # noqa: E402
from disttensor.sparse.linalg import cg  # noqa: E402
from _results import record  # noqa: E402

WORLD = MPI.COMM_WORLD


def serial_solution(n: int, b: np.ndarray) -> np.ndarray:
    """The exact solution of the Dirichlet Laplacian system by the orthonormal DST-I."""
    from scipy.fft import dstn
    k = np.arange(1, n + 1)
    lam1 = 2.0 - 2.0 * np.cos(np.pi * k / (n + 1))
    lam = lam1[:, None, None] + lam1[None, :, None] + lam1[None, None, :]
    bh = dstn(b.reshape(n, n, n), type=1, norm="ortho")
    return dstn(bh / lam, type=1, norm="ortho").ravel()


def rhs(n: int) -> np.ndarray:
    i = np.arange(n ** 3)
    return np.sin(0.37 * i) + 1.0


def timed(comm, fn) -> float:
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def idle_barrier(comm) -> None:
    """A barrier that sleeps while it waits (ranks left out of a sub-run must not spin on the
    cores the measured ranks use)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.005)


def run_on(p: int, n: int, reps: int, want: np.ndarray | None):
    """CG and SpMV on the first p ranks; returns (rank 0 results) or None."""
    color = 0 if WORLD.rank < p else MPI.UNDEFINED
    sub = WORLD.Split(color, WORLD.rank)
    out = None
    if sub != MPI.COMM_NULL:
        grid = dt.ProcessGrid(comm=sub)
        t0 = time.perf_counter()
        A = laplacian_3d(n, grid)
        build = sub.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        dist = A.output_distribution()
        sl = dist.block_slices(grid.coords)[0]
        b = DistArray(rhs(n)[sl].copy(), dist, grid)
        res = {"build_s": build, "method": A.halo.method(1, 8)}
        for name, M in (("cg", None), ("pcg_jacobi", "jacobi")):
            box, iters = {}, [0]

            def count(_):
                iters[0] += 1

            def solve():
                box["x"], box["info"] = cg(A, b, rtol=1e-13, M=M, callback=count)
            cg(A, b, M=M, maxiter=2)   # warm-up: the kernels' first calls load their code
            secs = timed(sub, solve)   # (the callback counting iterations: ~1% of a step)
            x = box["x"].to_numpy()   # gathers (small enough: 2 MiB)
            err = float(np.linalg.norm(x - want) / np.linalg.norm(want)) \
                if want is not None and sub.rank == 0 else float("nan")
            res[name] = (secs, iters[0], box["info"], err)
        xv = DistArray(rhs(n)[sl][::-1].copy(), dist, grid)
        for _ in range(3):
            A @ xv
        ts = [timed(sub, lambda: [A @ xv for _ in range(20)]) / 20 for _ in range(reps)]
        res["spmv_s"] = statistics.median(ts)
        X = np.ascontiguousarray(xv.local.reshape(-1, 1))
        xe = A.halo.gather(X)
        ts = [timed(sub, lambda: [A.halo.gather(X) for _ in range(20)]) / 20
              for _ in range(reps)]
        res["exchange_s"] = statistics.median(ts)   # the halo exchange alone
        ts = [timed(sub, lambda: [A._local_product(xe, False) for _ in range(20)]) / 20
              for _ in range(reps)]
        res["local_s"] = statistics.median(ts)      # the local CSB product alone
        out = res if sub.rank == 0 else None
        grid.free()
        sub.Free()
    idle_barrier(WORLD)
    return out


def scipy_spmv(n: int, reps: int):
    try:
        import scipy.sparse as sp
    except ImportError:
        return None
    t = sp.diags([2.0, -1.0, -1.0], [0, -1, 1], shape=(n, n))
    eye = sp.identity(n)
    a = (sp.kron(sp.kron(t, eye), eye) + sp.kron(sp.kron(eye, t), eye)
         + sp.kron(sp.kron(eye, eye), t)).tocsr()
    x = rhs(n)[::-1].copy()
    for _ in range(3):
        a @ x
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(20):
            a @ x
        ts.append((time.perf_counter() - t0) / 20)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    n = args.n
    want = None
    if WORLD.rank == 0:
        try:
            want = serial_solution(n, rhs(n))
        except ImportError:
            print("SciPy missing: no serial reference solution")
    rows = {}
    for p in (1, 2, 4):
        if p <= WORLD.size:
            rows[p] = run_on(p, n, args.reps, want)
    if WORLD.rank != 0:
        return
    print(f"CG on the 7-point Dirichlet Laplacian of {n}^3 = {n ** 3} unknowns, rtol 1e-13 "
          f"(serial reference: DST-I solve)")
    print(f"{'ranks':>5} {'solver':>11} {'iters':>6} {'info':>4} {'seconds':>8} "
          f"{'rel.err':>9} {'exchange':>9} {'build s':>8}")
    for p, r in rows.items():
        for name in ("cg", "pcg_jacobi"):
            secs, it, info, err = r[name]
            print(f"{p:>5} {name:>11} {it:>6} {info:>4} {secs:>8.3f} {err:>9.2e} "
                  f"{r['method']:>9} {r['build_s']:>8.3f}")
            record("sparse_dist", f"cg {name} laplacian {n}^3", "seconds", secs, "s",
                   better="lower", ranks=p)
            record("sparse_dist", f"cg {name} laplacian {n}^3", "iterations", it, "",
                   better="lower", ranks=p)
            record("sparse_dist", f"cg {name} laplacian {n}^3", "rel_error_vs_serial", err, "",
                   target=1e-10, better="lower", ranks=p)
    t1 = rows[1]["spmv_s"]
    print(f"\nSpMV A @ x, {n}^3 Laplacian (median of {args.reps} x 20 products)")
    print(f"  1 rank: {t1 * 1e3:.3f} ms")
    for p, r in rows.items():
        print(f"  {p} rank(s): halo exchange {r['exchange_s'] * 1e3:.3f} ms, local CSB product "
              f"{r['local_s'] * 1e3:.3f} ms ({r['method']})")
    if 2 in rows:
        t2 = rows[2]["spmv_s"]
        print(f"  2 ranks: {t2 * 1e3:.3f} ms   speed-up 1 -> 2 ranks: {t1 / t2:.2f}x")
        record("sparse_dist", f"spmv laplacian {n}^3", "speedup_2_vs_1_ranks", t1 / t2, "x",
               ranks=2)
    if 4 in rows:
        print(f"  4 ranks (oversubscribed): {rows[4]['spmv_s'] * 1e3:.3f} ms")
    ts = scipy_spmv(n, args.reps)
    if ts is not None:
        print(f"  SciPy CSR, one process: {ts * 1e3:.3f} ms   ours(1 rank) / SciPy: "
              f"{t1 / ts:.2f}x")
        record("sparse_dist", f"spmv laplacian {n}^3", "ratio_1rank_vs_scipy", t1 / ts, "x",
               better="lower", ranks=1)


if __name__ == "__main__":
    main()
