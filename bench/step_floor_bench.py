"""The per-step overhead floor: a tiny CosmoFlow training step, ours vs PyTorch's, same run.

    mpiexec -n 2 python -m mpi4py bench/step_floor_bench.py [--reps 60] [--size 8]

The model is so small (widths 2,2 on an 8^3 x 4 sample, batch 2, dense 128,64, Adam) that its
kernels take microseconds: the step's time is the fixed cost of every op (Python bookkeeping
in autograd and nn, argument agreement, plans, halo exchanges, allocations, the optimizer).
On a GPU each kernel is 50-100x faster than here, so this fixed cost is what decides strong
scaling there.  One step: forward, MSE loss, ``zero_grad``, backward, Adam step, through
:class:`disttensor.nn.DistributedDataParallel` as the training command runs it.

Cases, interleaved rep by rep (``bench/_timing.compare``), each a collective wall time (the
slowest rank's):

* ``1 rank``: the model on rank 0 alone (a grid over ``COMM_SELF``), the other ranks waiting
  in a barrier;
* ``2 ranks spatial``: grid ``(1, 2, 1, 1)`` (depth split), ``2 ranks samples``: grid
  ``(2, 1, 1, 1)`` (needs 2 ranks);
* ``torch``: the same model in PyTorch (CPU, one thread, the same initial weights), on rank
  0 alone.

Figures (bench ``step_floor``): each case's seconds (median; the fastest rep beside it, less
sensitive to other jobs on a shared machine), ``ratio_vs_torch`` for each (targets: <= 1.2 on
one rank, <= 1.5 on two; ``best_ratio_vs_torch``: fastest over fastest;
``paired_ratio_vs_torch``: the median over the reps of the case's time over PyTorch's time in
the same rep, the two run back to back, so that a slow stretch of the machine, which moves
PyTorch's own median by 1.4-2.1 ms between runs, hits both sides of each ratio), the CPU
seconds of a step summed over the ranks taking part, the status all-reduces (argument
agreement and failure checks) per steady-state step, counted through
:func:`disttensor.core.agreement.status_allreduce`, the bytes NumPy allocates and frees during
one steady-state step (tracemalloc peak above what the step keeps), the NumPy data buffers a
steady-state step allocates however briefly (count and bytes,
:mod:`disttensor.testing.allocations`) and the minor page
faults of one steady-state step (``getrusage``; the largest rank).  Run with one thread per rank (set here if unset).  PyTorch is a peer for comparison
only; without it the torch case and the ratios are skipped.

MPI waits: the rank sitting out the 1-rank and PyTorch cases sleeps outside MPI
(:func:`_timing.quiet_wait`); under ``bench/run_all.py`` the ranks run with the idle-sleep
shim (``build/libmpi_idle_sleep.so``), which this script gives a 2 ms spin budget
(``DISTTENSOR_MPI_IDLE_SPIN_NS``, :func:`_timing.spin_before_sleep`, where ranks do not
outnumber cores), so that the dozen meetings of a 2-rank step do not each end in a ~55 us
sleep, which users, running without the shim, never pay (``bench/README.md``, "MPI waits in
the benchmarks").
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
import tracemalloc

for _v in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import spin_before_sleep  # noqa: E402

# before MPI starts: waits poll for up to 2 ms before the idle-sleep shim sleeps, where ranks
# do not outnumber cores (bench/_timing.spin_before_sleep, bench/README.md "MPI waits")
SPIN_NS = spin_before_sleep()

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import record  # noqa: E402
from _timing import compare, wall_and_cpu  # noqa: E402

import disttensor as dt  # noqa: E402
from disttensor import nn  # noqa: E402
from disttensor.autograd import Tensor  # noqa: E402
from disttensor.core import agreement  # noqa: E402
from disttensor.nn import functional as F  # noqa: E402
from disttensor.testing.allocations import numpy_allocations  # noqa: E402

COMM = MPI.COMM_WORLD
WIDTHS, DENSE, CIN, OUTPUTS, SLOPE, SCALE = (2, 2), (128, 64), 4, 4, 0.3, 1.2


def data(args):
    rng = np.random.default_rng(2)
    s = args.size
    x = rng.standard_normal((args.batch, CIN, s, s, s)).astype(np.float32)
    y = rng.uniform(-1, 1, (args.batch, OUTPUTS)).astype(np.float32)
    return x, y


def our_step(grid, args):
    """``(step, model)``: one training step of CosmoFlow on ``grid`` (collective over it)."""
    xg, yg = data(args)
    m = nn.models.cosmoflow(input_size=args.size, in_channels=CIN, widths=WIDTHS, dense=DENSE,
                            outputs=OUTPUTS, negative_slope=SLOPE, output_scale=SCALE,
                            rng=np.random.default_rng(0))
    net = nn.DistributedDataParallel(m, grid)
    opt = nn.optim.Adam(m.parameters(), lr=1e-4)
    x = dt.from_global(xg, grid=grid, split=(0, None, 1, 2, 3))
    y = dt.from_global(yg, grid=grid, split=(0, None))

    def step():
        loss = F.mse_loss(net(Tensor(x)), Tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    return step, m


def torch_step(torch, model, args):
    """The same model in PyTorch, initialised with ``model``'s weights (in order)."""
    tn = torch.nn
    layers, c = [], CIN
    for w in WIDTHS:
        layers += [tn.Conv3d(c, w, 3, padding=1), tn.LeakyReLU(SLOPE), tn.MaxPool3d(2)]
        c = w
    f = c * (args.size // 2 ** len(WIDTHS)) ** 3
    layers.append(tn.Flatten())
    for d in DENSE:
        layers += [tn.Linear(f, d), tn.LeakyReLU(SLOPE)]
        f = d
    layers.append(tn.Linear(f, OUTPUTS))
    net = tn.Sequential(*layers)
    ours = [np.asarray(p.data) for p in model.parameters()]
    with torch.no_grad():
        for p, a in zip(net.parameters(), ours):
            p.copy_(torch.from_numpy(np.ascontiguousarray(a)).reshape(p.shape))
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    xg, yg = data(args)
    x, y = torch.from_numpy(xg), torch.from_numpy(yg)

    def step():
        loss = torch.nn.functional.mse_loss(SCALE * torch.tanh(net(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    return step


def member(fn, comm):
    """``fn`` on the ranks of ``comm``, nothing on the others (every rank calls it)."""
    return fn if comm is not None else (lambda: None)


def agreements_per_step(fn, steps: int = 5) -> float:
    """Status all-reduces this rank makes per call of ``fn`` (after a warm call)."""
    fn()
    seen = [0]
    orig = agreement.status_allreduce

    def counting(comm, failed, dig):
        seen[0] += 1
        return orig(comm, failed, dig)
    agreement.status_allreduce = counting
    try:
        for _ in range(steps):
            fn()
    finally:
        agreement.status_allreduce = orig
    return seen[0] / steps


def transient_bytes(fn) -> int:
    """Bytes allocated and freed again inside one call of ``fn`` (tracemalloc peak above what
    the call keeps), on this rank."""
    fn()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        fn()
        cur, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return max(0, peak - max(cur, base))


def numpy_allocations_of(fn) -> tuple[int, int]:
    """``(count, bytes)`` of the NumPy data buffers one call of ``fn`` allocates (after a warm
    call), on this rank."""
    fn()
    with numpy_allocations() as seen:
        fn()
    return seen.count, seen.nbytes


def faults_per_step(fn, steps: int = 10) -> float:
    """Minor page faults of this process per call of ``fn`` (after a warm call)."""
    fn()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        fn()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=8)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=10)
    args = p.parse_args()
    rank, size = COMM.rank, COMM.size
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        torch = None
    cases, models, comms = {}, {}, {}
    self_comm = MPI.COMM_SELF if rank == 0 else None
    comms["1 rank"] = self_comm
    if self_comm is not None:
        cases["1 rank"], models["1 rank"] = our_step(dt.ProcessGrid((1, 1, 1, 1),
                                                                    comm=self_comm), args)
    if size >= 2:
        two = COMM if size == 2 else COMM.Split(0 if rank < 2 else MPI.UNDEFINED, rank)
        two = None if two == MPI.COMM_NULL else two
        for name, dims in (("2 ranks spatial", (1, 2, 1, 1)), ("2 ranks samples", (2, 1, 1, 1))):
            comms[name] = two
            if two is not None:
                cases[name], models[name] = our_step(dt.ProcessGrid(dims, comm=two), args)
    if torch is not None:
        comms["torch"] = self_comm
        if self_comm is not None:
            cases["torch"] = torch_step(torch, models["1 rank"], args)
    names = list(comms)
    # the same model: the first losses agree (one step each, before any timing)
    first = {n: (float(cases[n]().item() if n == "torch" else cases[n]().data)
                 if n in cases else None) for n in names}
    if rank == 0:
        ref = first["1 rank"]
        bad = {n: v for n, v in first.items() if v is not None and abs(v - ref) > 1e-4 * abs(ref)}
        print(f"first-step losses {first}" + (f"  DIFFER: {bad}" if bad else " (agree)"))
    fns = {n: member(cases.get(n), comms[n]) for n in names}
    cpu = {n: [] for n in names}
    walls = {n: [] for n in names}
    med = compare(fns, args.reps, args.warmup, timer=wall_and_cpu(fns, cpu, walls))
    counts = {n: COMM.allreduce(agreements_per_step(fns[n]) if n in cases and n != "torch"
                                else 0.0, op=MPI.MAX) for n in names}
    alloc = {n: COMM.allreduce(transient_bytes(fns[n]) if n in cases else 0, op=MPI.MAX)
             for n in names}
    faults = {n: COMM.allreduce(faults_per_step(fns[n]) if n in cases else 0.0, op=MPI.MAX)
              for n in names}
    nallocs = {n: numpy_allocations_of(fns[n]) if n in cases else (0, 0) for n in names}
    nallocs = {n: (COMM.allreduce(c, op=MPI.MAX), COMM.allreduce(b, op=MPI.MAX))
               for n, (c, b) in nallocs.items()}
    if rank != 0:
        return
    load = os.getloadavg()[0]
    desc = (f"cosmoflow {args.size}^3 x {CIN} widths {WIDTHS} dense {DENSE} batch {args.batch}"
            f" adam")
    print(f"{desc}; {args.reps} interleaved reps, 1 thread per rank; MPI idle spin "
          f"{SPIN_NS / 1e6:g} ms; load {load:.2f}")
    tref = med.get("torch")
    best = {n: min(v) for n, v in walls.items() if v}
    for n in names:
        ranks = 1 if n in ("1 rank", "torch") else 2
        c = sorted(cpu[n])[len(cpu[n]) // 2]
        line = (f"  {n:16s} {1e3 * med[n]:7.3f} ms (best {1e3 * best[n]:6.3f})  "
                f"cpu {1e3 * c:7.3f} ms")
        record("step_floor", f"{desc}, {n}", "step_s", med[n], "s", better="lower", ranks=ranks)
        record("step_floor", f"{desc}, {n}", "cpu_s", c, "s", better="lower", ranks=ranks)
        if n != "torch":
            line += (f"  agreements/step {counts[n]:5.1f}  transient {alloc[n] / 1024:7.1f} KiB"
                     f"  numpy allocations {nallocs[n][0]} ({nallocs[n][1]} B)"
                     f"  faults/step {faults[n]:6.1f}")
            record("step_floor", f"{desc}, {n}", "numpy_allocations_per_step", nallocs[n][0],
                   "", better="lower", ranks=ranks)
            record("step_floor", f"{desc}, {n}", "numpy_allocated_bytes_per_step",
                   nallocs[n][1], "B", better="lower", ranks=ranks)
            record("step_floor", f"{desc}, {n}", "faults_per_step", faults[n], "",
                   better="lower", ranks=ranks)
            record("step_floor", f"{desc}, {n}", "agreements_per_step", counts[n], "",
                   better="lower", ranks=ranks)
            record("step_floor", f"{desc}, {n}", "transient_bytes", alloc[n], "B",
                   better="lower", ranks=ranks)
            if tref:
                r, rb = med[n] / tref, best[n] / best["torch"]
                rp = statistics.median(a / b for a, b in zip(walls[n], walls["torch"]))
                line += f"  x torch {r:5.2f} (best/best {rb:5.2f}, paired {rp:5.2f})"
                record("step_floor", f"{desc}, {n}", "paired_ratio_vs_torch", rp, "x",
                       better="lower", ranks=ranks)
                record("step_floor", f"{desc}, {n}", "ratio_vs_torch", r, "x",
                       target=1.2 if ranks == 1 else 1.5, better="lower", ranks=ranks)
                record("step_floor", f"{desc}, {n}", "best_ratio_vs_torch", rb, "x",
                       better="lower", ranks=ranks)
        print(line)


if __name__ == "__main__":
    main()
