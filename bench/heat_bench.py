"""disttensor against Heat (a bench peer, never a dependency), the operations of issue 25.

Heat (``heat``, on PyTorch) is installed beside the project in its own virtual environment
under ``build/`` (ignored by git), so the two libraries run in two MPI jobs with the same
sizes, seeds, rank count and thread settings, and this script prints one table::

    python3 -m venv build/heat-venv
    build/heat-venv/bin/pip install heat      # Heat 1.8 pins torch < 2.11.1: pip takes 2.11
    mkdir -p build/heat-venv/mpi-abi          # PyPI's mpi4py wheel loads libmpi.so.12, the
    ln -s /lib/x86_64-linux-gnu/libmpich.so.12 build/heat-venv/mpi-abi/libmpi.so.12
                                              # MPICH ABI name: point it at the system MPICH

(the driver puts ``mpi-abi`` on ``LD_LIBRARY_PATH`` of the Heat job, so both use the same
MPICH, with the idle-sleep shim of scripts/test.sh where it is built).  Two modes:

* driver (no ``--lib``, no MPI in this process): runs ``mpiexec -n N <python> -m mpi4py
  bench/heat_bench.py --lib L --json F`` once with this project's Python (``--lib ours``) and
  once with ``--heat-python`` (``--lib heat``), then prints each operation's medians and the
  ratio Heat time / ours (> 1: we are faster) and checks that both computed the same values
  (a checksum per operation);
* worker (``--lib ours|heat``, under mpiexec): times each operation, the slowest rank's wall
  time after a barrier, medians of ``--reps`` passes after one warm-up, interleaved.

Operations (float64 unless said, split along axis 0 over a 1-D grid of all ranks):
``elementwise`` ``x + y`` of ``--n2`` x ``--n2``; ``sum`` and ``std`` of that array;
``unique`` of ``--nu`` int32 in ``[0, 10^6)``; ``sort`` of ``--ns`` uniform floats;
``redistribute`` the ``--n2``^2 array from split 0 to split 1; ``fft`` a 2-D complex FFT of
``--nf``^2; ``jacobi`` ``--sweeps`` 5-point Jacobi sweeps of a ``--n2``^2 grid with halos of
one row (ours: ``exchange_halo`` on a halo=1 array; Heat: ``get_halo`` + ``array_with_halos``).

    python bench/heat_bench.py --ranks 2 --heat-python build/heat-venv/bin/python
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OPS = ["elementwise", "sum", "std", "unique", "sort", "redistribute", "fft", "jacobi"]


# -- workers ------------------------------------------------------------------------------------
def _ours(args, rng_global):
    import numpy as np
    sys.path.insert(0, str(ROOT))
    import disttensor as dt
    n2 = args.n2
    a = rng_global.standard_normal((n2, n2))
    b = rng_global.standard_normal((n2, n2))
    u_vals = rng_global.integers(0, 10**6, args.nu).astype(np.int32)
    s_vals = rng_global.random(args.ns)
    f_vals = rng_global.standard_normal((args.nf, args.nf)) + 0j
    x = dt.from_global(a, split=(0, None))
    y = dt.from_global(b, split=(0, None))
    xu = dt.from_global(u_vals, split=(0,))
    xs = dt.from_global(s_vals, split=(0,))
    xf = dt.from_global(f_vals, split=(0, None))
    u0 = dt.from_global(a, split=(0, None), halo=1)

    def jacobi():
        u = u0
        for _ in range(args.sweeps):
            u.exchange_halo()
            b_ = u.buffer
            new = 0.25 * (b_[:-2, 1:-1] + b_[2:, 1:-1] + b_[1:-1, :-2] + b_[1:-1, 2:])
            u.local[...] = new
        return u
    fns = {
        "elementwise": lambda: x + y,
        "sum": lambda: x.sum(),
        "std": lambda: x.std(),
        "unique": lambda: dt.unique(xu),
        "sort": lambda: dt.sort(xs),
        "redistribute": lambda: x.redistribute(split=(None, 0)),
        "fft": lambda: dt.fft.fftn(xf),
        "jacobi": jacobi,
    }

    def checksum(op, r):
        if op == "jacobi":
            u0.local[...] = x.local  # restart from the same field for the check
            r = jacobi()
            return float(dt.sum(abs(dt.DistArray(r.local.copy(), r.distribution, r.grid))))
        if op in ("sum", "std"):
            return float(r)
        if op == "unique":
            return float(r.size) + float(dt.sum(r.astype("float64")))
        if op == "fft":
            return float(dt.sum(abs(r)))
        if op == "sort":
            return float(r[: min(1000, r.shape[0])].to_numpy().sum())
        return float(dt.sum(abs(r)))
    return fns, checksum


def _heat(args, rng_global):
    import heat as ht
    import torch
    import torch.nn.functional as F
    n2 = args.n2
    a = rng_global.standard_normal((n2, n2))
    b = rng_global.standard_normal((n2, n2))
    u_vals = rng_global.integers(0, 10**6, args.nu).astype("int32")
    s_vals = rng_global.random(args.ns)
    f_vals = rng_global.standard_normal((args.nf, args.nf)) + 0j
    x = ht.array(a, split=0)
    y = ht.array(b, split=0)
    xu = ht.array(u_vals, split=0)
    xs = ht.array(s_vals, split=0)
    xf = ht.array(f_vals, split=0)
    rank, size = ht.MPI_WORLD.rank, ht.MPI_WORLD.size
    u0 = ht.array(a, split=0)

    def jacobi(u=None):
        u = u0 if u is None else u
        for _ in range(args.sweeps):
            u.get_halo(1)
            w = u.array_with_halos
            if rank == 0 or size == 1:
                w = torch.cat([torch.zeros_like(w[:1]), w])
            if rank == size - 1 or size == 1:
                w = torch.cat([w, torch.zeros_like(w[:1])])
            w = F.pad(w, (1, 1))
            u.larray = 0.25 * (w[:-2, 1:-1] + w[2:, 1:-1] + w[1:-1, :-2] + w[1:-1, 2:])
        return u
    fns = {
        "elementwise": lambda: x + y,
        "sum": lambda: x.sum(),
        "std": lambda: x.std(),
        "unique": lambda: ht.unique(xu, sorted=True),
        "sort": lambda: ht.sort(xs),
        "redistribute": lambda: ht.resplit(x, 1),
        "fft": lambda: ht.fft.fftn(xf),
        "jacobi": jacobi,
    }

    def checksum(op, r):
        if op == "jacobi":
            u = ht.array(a, split=0)
            return float(ht.sum(ht.abs(jacobi(u))).item())
        if op in ("sum", "std"):
            return float(r.item())
        if op == "unique":
            r = r.resplit_(None) if r.split is not None else r
            return float(r.shape[0]) + float(r.larray.double().sum())
        if op == "fft":
            return float(ht.sum(ht.abs(r)).item())
        if op == "sort":
            v = r[0]
            return float(v[: min(1000, v.shape[0])].numpy().sum())
        return float(ht.sum(ht.abs(r)).item())
    return fns, checksum


def worker(args) -> None:
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(2025)  # the same global arrays on every rank and library
    fns, checksum = (_ours if args.lib == "ours" else _heat)(args, rng)
    ops = [o for o in OPS if o in args.ops.split(",")]

    def timed(fn):
        comm.Barrier()
        t0 = time.perf_counter()
        r = fn()
        dt_ = time.perf_counter() - t0
        return comm.allreduce(dt_, op=MPI.MAX), r
    times = {o: [] for o in ops}
    sums = {}
    for o in ops:  # warm-up, and the checksum of one result
        _, r = timed(fns[o])
        sums[o] = checksum(o, r)
        del r
    for i in range(args.reps):
        for o in ops[i % len(ops):] + ops[:i % len(ops)]:
            times[o].append(timed(fns[o])[0])
    if comm.rank == 0:
        out = {"lib": args.lib, "ranks": comm.size,
               "median_s": {o: statistics.median(v) for o, v in times.items()},
               "checksum": sums}
        with open(args.json, "w") as f:
            json.dump(out, f)


# -- driver -------------------------------------------------------------------------------------
def _run(python, lib, args, path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
               OPENBLAS_NUM_THREADS=str(args.threads), NUMBA_NUM_THREADS=str(args.threads))
    shim = Path(python).absolute().parent.parent / "mpi-abi"  # see the module docstring
    if lib == "heat" and shim.is_dir():
        env["LD_LIBRARY_PATH"] = f"{shim}:{env.get('LD_LIBRARY_PATH', '')}"
    launcher = ["mpiexec"]
    idle = ROOT / "build" / "libmpi_idle_sleep.so"  # waiting ranks yield (scripts/test.sh)
    if idle.exists() and os.environ.get("DISTTENSOR_MPI_IDLE_SLEEP", "1") != "0":
        launcher += ["-genv", "LD_PRELOAD", str(idle)]
    cmd = launcher + ["-n", str(args.ranks), python, "-m", "mpi4py", str(Path(__file__)),
           "--lib", lib, "--json", path] + [f"--{k}={getattr(args, k)}" for k in
                                            ("n2", "nu", "ns", "nf", "sweeps", "reps", "ops")]
    subprocess.run(cmd, check=True, env=env, timeout=args.timeout)
    with open(path) as f:
        return json.load(f)


def driver(args) -> None:
    sys.path.insert(0, str(HERE))
    from _results import record
    with tempfile.TemporaryDirectory() as tmp:
        ours = _run(args.python, "ours", args, os.path.join(tmp, "ours.json"))
        heat = _run(args.heat_python, "heat", args, os.path.join(tmp, "heat.json"))
    print(f"disttensor vs Heat on {args.ranks} rank(s), {args.threads} thread(s) per rank, "
          f"medians of {args.reps} passes (slowest rank's wall time); n2={args.n2} "
          f"nu={args.nu} ns={args.ns} nf={args.nf} sweeps={args.sweeps}")
    print(f"{'operation':<14}{'ours ms':>10}{'Heat ms':>10}{'Heat/ours':>11}  same result")
    for o in ours["median_s"]:
        t_o, t_h = ours["median_s"][o], heat["median_s"][o]
        c_o, c_h = ours["checksum"][o], heat["checksum"][o]
        same = abs(c_o - c_h) <= 1e-9 * max(abs(c_o), abs(c_h), 1.0)
        print(f"{o:<14}{t_o * 1e3:>10.2f}{t_h * 1e3:>10.2f}{t_h / t_o:>11.2f}  "
              f"{'yes' if same else f'NO ({c_o!r} vs {c_h!r})'}")
        record("heat", o, "heat_over_ours", t_h / t_o, "x", target=1.0, better="higher",
               ranks=args.ranks)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", choices=["ours", "heat"], help="worker mode (under mpiexec)")
    ap.add_argument("--json", help="worker: where rank 0 writes its medians")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="threads per rank (both libraries)")
    ap.add_argument("--python", default=sys.executable, help="Python with disttensor")
    ap.add_argument("--heat-python", default=str(ROOT / "build/heat-venv/bin/python"))
    ap.add_argument("--n2", type=int, default=4000, help="side of the 2-D float64 arrays")
    ap.add_argument("--nu", type=int, default=10**7, help="int32 elements for unique")
    ap.add_argument("--ns", type=int, default=10**6, help="float64 elements for sort")
    ap.add_argument("--nf", type=int, default=1024, help="side of the 2-D complex FFT")
    ap.add_argument("--sweeps", type=int, default=10, help="Jacobi sweeps per pass")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per library run")
    args = ap.parse_args(argv)
    if args.lib:
        worker(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
