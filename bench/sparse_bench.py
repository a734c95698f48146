"""CSB (disttensor.sparse.CSBMatrix) SpMM against dense BLAS GEMM and scipy.sparse CSR/CSC,
one process (run: python bench/sparse_bench.py [--quick]).

Pruned DNN weights: an ``n x n`` Gaussian matrix with a uniformly random fraction ``s`` of
its entries set to zero (what unstructured magnitude pruning leaves), at s = 50, 70, 80, 90,
95, 99 %, times ``k`` right-hand columns (64 and 256), for n = 4096 and 1024; and the 7-point
Laplacian of a ``g^3`` grid (SpMV, k = 1, and k = 16).  In the same run, interleaved
(``_timing.compare``: medians of ``--reps`` after ``--warmup``):

* ``csb``  ``A @ X`` and ``csbT`` ``A.T @ X`` (block-rows / block-columns of one structure;
  Numba threads = ``NUMBA_NUM_THREADS``, default the cores);
* ``dense`` ``a @ X`` (NumPy's BLAS GEMM, its own threads);
* ``csr``/``csrT`` ``csr @ X`` / ``csr.T @ X`` and ``csc``/``cscT`` the same with CSC
  (scipy.sparse, single-threaded).

Printed per case: the times and the ratios ``csbT/csb`` (target <= 1.2) with scipy's
``csrT/csr`` as the contrast, scipy/CSB (target > 1 for both products: ``min(csr, csc) /
csb`` and ``min(csrT, cscT) / csbT``), dense/CSB (target > 1 from 90 % sparsity), and per
(n, k) the break-even sparsity (where CSB ``A @ X`` meets dense GEMM, interpolated in log
time between the measured sparsities).  Every result is checked against dense.  Figures go to
``$DISTTENSOR_BENCH_CSV`` (bench/_results.py) too.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from disttensor.sparse import CSBMatrix  # noqa: E402
from _results import record  # noqa: E402
from _timing import compare, wall  # noqa: E402


def pruned_weights(rng, n, sparsity, dtype):
    a = rng.standard_normal((n, n)).astype(dtype)
    a[rng.random((n, n)) < sparsity] = 0
    return a


def laplacian_coo(g):
    """The 7-point Laplacian (6 on the diagonal, -1 to each grid neighbour) of a g^3 grid,
    Dirichlet boundary: (rows, cols, values)."""
    idx = np.arange(g ** 3).reshape(g, g, g)
    rows, cols = [idx.ravel()], [idx.ravel()]
    vals = [np.full(g ** 3, 6.0)]
    for axis in range(3):
        for shift in (1, -1):
            src = [slice(None)] * 3
            dst = [slice(None)] * 3
            src[axis] = slice(max(shift, 0), g + min(shift, 0))
            dst[axis] = slice(max(-shift, 0), g + min(-shift, 0))
            rows.append(idx[tuple(dst)].ravel())
            cols.append(idx[tuple(src)].ravel())
            vals.append(np.full(rows[-1].size, -1.0))
    return np.concatenate(rows), np.concatenate(cols), np.concatenate(vals)


def check(got, want, what):
    want = np.asarray(want, dtype=np.float64)
    scale = max(1.0, float(np.abs(want).max(initial=0)))
    err = float(np.abs(np.asarray(got, dtype=np.float64) - want).max(initial=0)) / scale
    if err > 1e-4:
        raise AssertionError(f"{what}: relative error {err:.2e}")


def time_case(name, A, csr, csc, x, z, reps, warmup, dense=None):
    fns = {"csb": lambda: A @ x, "csbT": lambda: A.T @ z,
           "csr": lambda: csr @ x, "csrT": lambda: csr.T @ z,
           "csc": lambda: csc @ x, "cscT": lambda: csc.T @ z}
    if dense is not None:
        fns["dense"] = lambda: dense @ x
    want = csr @ x
    check(A @ x, want, f"{name} A@X")
    check(A.T @ z, csr.T @ z, f"{name} A.T@X")
    return compare(fns, reps, warmup, timer=wall)


def report(case, t, has_dense):
    r = {"T_over_A": t["csbT"] / t["csb"], "scipyT_over_A": t["csrT"] / t["csr"],
         "scipy_vs_csb": min(t["csr"], t["csc"]) / t["csb"],
         "scipyT_vs_csbT": min(t["csrT"], t["cscT"]) / t["csbT"]}
    if has_dense:
        r["dense_vs_csb"] = t["dense"] / t["csb"]
    for key in ("csb", "csbT", "csr", "csrT", "csc", "cscT", "dense"):
        if key in t:
            record("sparse", case, f"{key}_s", t[key], "s", better="lower")
    record("sparse", case, "csbT_over_csb", r["T_over_A"], "x", target=1.2, better="lower")
    record("sparse", case, "csrT_over_csr", r["scipyT_over_A"], "x")
    record("sparse", case, "scipy_over_csb", r["scipy_vs_csb"], "x", target=1.0)
    record("sparse", case, "scipyT_over_csbT", r["scipyT_vs_csbT"], "x", target=1.0)
    if has_dense:
        record("sparse", case, "dense_over_csb", r["dense_vs_csb"], "x", target=1.0)
    ms = {k: f"{v * 1e3:8.2f}" for k, v in t.items()}
    print(f"{case:28s} csb {ms['csb']} csbT {ms['csbT']} dense {ms.get('dense', '     -  ')} "
          f"csr {ms['csr']} csrT {ms['csrT']} csc {ms['csc']} cscT {ms['cscT']} ms | "
          f"csbT/csb {r['T_over_A']:5.2f} csrT/csr {r['scipyT_over_A']:5.2f} "
          f"scipy/csb {r['scipy_vs_csb']:5.2f} scipyT/csbT {r['scipyT_vs_csbT']:5.2f}"
          + (f" dense/csb {r['dense_vs_csb']:6.2f}" if has_dense else ""), flush=True)
    return r


def break_even(points):
    """The sparsity where CSB meets dense, interpolating log(dense/csb) linearly between the
    measured sparsities (None if CSB never wins; the lowest one if it always does)."""
    points = sorted(points)
    for (s0, r0), (s1, r1) in zip(points, points[1:]):
        if r0 < 1 <= r1:
            l0, l1 = math.log(r0), math.log(r1)
            return s0 + (s1 - s0) * (0 - l0) / (l1 - l0)
    if points and points[0][1] >= 1:
        return points[0][0]
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 1024])
    ap.add_argument("--cols", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--sparsities", type=float, nargs="+", default=[50, 70, 80, 90, 95, 99])
    ap.add_argument("--grids", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="1024 only, k=64, 3 reps")
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.cols, args.grids, args.reps = [1024], [64], [32], 3
    import numba
    import scipy
    import scipy.sparse as sps
    dtype = np.dtype(args.dtype)
    print(f"sparse_bench: {dtype}, Numba threads {numba.get_num_threads()} of "
          f"{os.cpu_count()} cores, NumPy {np.__version__}, SciPy {scipy.__version__}; "
          f"medians of {args.reps} (ms)")
    rng = np.random.default_rng(0)
    summary = []
    for n in args.sizes:
        for k in args.cols:
            points = []
            x = rng.standard_normal((n, k)).astype(dtype)
            z = rng.standard_normal((n, k)).astype(dtype)
            for s in args.sparsities:
                a = pruned_weights(rng, n, s / 100, dtype)
                A = CSBMatrix.from_dense(a)
                csr = sps.csr_array(a)
                csc = csr.tocsc()
                case = f"{n}x{n} s={s:g}% k={k}"
                t = time_case(case, A, csr, csc, x, z, args.reps, args.warmup, dense=a)
                r = report(case, t, True)
                points.append((s, r["dense_vs_csb"]))
                summary.append((case, r))
                del a, A, csr, csc
            be = break_even(points)
            print(f"  break-even sparsity CSB A@X vs dense GEMM, {n}x{n} k={k}: "
                  + (f"{be:.1f}%" if be is not None else "not reached"), flush=True)
            if be is not None:
                record("sparse", f"{n}x{n} k={k}", "break_even_sparsity", be, "%",
                       target=90.0, better="lower")
    for g in args.grids:
        rows, cols, vals = laplacian_coo(g)
        N = g ** 3
        A = CSBMatrix.from_coo(rows, cols, vals.astype(dtype), (N, N))
        csr = sps.csr_array((vals.astype(dtype), (rows, cols)), shape=(N, N))
        csc = csr.tocsc()
        for k in (1, 16):
            x = rng.standard_normal((N, k) if k > 1 else N).astype(dtype)
            case = f"laplacian {g}^3 k={k} (beta {A.block_size})"
            t = time_case(case, A, csr, csc, x, x, max(args.reps, 7), args.warmup)
            summary.append((case, report(case, t, False)))
    worst = max(r["T_over_A"] for _, r in summary)
    print(f"max csbT/csb over all cases {worst:.2f} (target <= 1.2); "
          f"min scipy/csb {min(r['scipy_vs_csb'] for _, r in summary):.2f}, "
          f"min scipyT/csbT {min(r['scipyT_vs_csbT'] for _, r in summary):.2f} (target > 1)")


if __name__ == "__main__":
    main()
