"""Local GPU conv3d kernels: cuDNN (through the cuDNN frontend) vs the im2col + cuBLAS fallback.

CosmoFlow's five conv layers at 128^3 (N=4, k=3, 'same' padding, stride 1): 4->32 channels on
128^3, 32->64 on 64^3, 64->128 on 32^3, 128->256 on 16^3, 256->512 on 8^3; forward,
backward-data and backward-filter; float32, and float16 where cuDNN takes it.  Three ways per
pass: ``cudnn`` (the heuristics' plan, ``backend='cudnn'``), ``im2col`` (``backend='im2col'``)
and ``planned`` (``backend=None``, what the ops call: the micro-batch planner's choice among
cuDNN's plans and im2col under ``DISTTENSOR_CONV_WORKSPACE_MB``, tuned on its first call).  All
run in the same process on the same data, interleaved rep by rep (who goes first rotates),
after warm-up calls (graph building, NVRTC compilation, tuning, memory pool); each figure is
the median over the reps of CUDA-event time on the current stream.  One line per figure:

    conv3d fwd float32 N=4 4->32 128^3: cudnn=… ms  im2col=… ms  planned=… ms  im2col/cudnn=…x  cudnn/planned=…x

(``im2col/cudnn`` > 1: cuDNN is that many times faster than the fallback; ``cudnn/planned`` < 1:
the workspace limit costs the planner that much.)  Without a GPU it says so and exits 0;
without the cuDNN frontend it times im2col (and the planner) alone.  Figures go to
``$DISTTENSOR_BENCH_CSV`` (``bench/_results.py``, device ``gpu``): ``im2col_over_cudnn``
(target 1.0: cuDNN at least as fast as the fallback), ``cudnn_over_planned`` and each way's
``ms``.  Per-rank, no MPI:

    python bench/conv_gpu_bench.py [--quick] [--reps 10] [--warmup 2] [--layers 0,1,2,3,4]
        [--dtypes float32,float16] [--no-planned]

``--quick``: 5 reps, 1 warm-up, ``planned`` for float32 only (the GPU check,
``scripts/gpu_check.sh``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import record  # noqa: E402
from _timing import gpu_module  # noqa: E402

LAYERS = [  # (N, Cin, Cout, spatial): CosmoFlow's conv layers on a 128^3 sample, batch 4
    (4, 4, 32, 128),
    (4, 32, 64, 64),
    (4, 64, 128, 32),
    (4, 128, 256, 16),
    (4, 256, 512, 8),
]
K, PAD, STRIDE, DIL = 3, 1, 1, 1


def _be(name):
    return None if name == "planned" else name


def _ops(gpu, x, w, dy, sp):
    s3, d3, p3 = (STRIDE,) * 3, (DIL,) * 3, (PAD,) * 3
    return {  # backend None ('planned'): the micro-batch planner's choice, as the ops call it
        "fwd": lambda be: gpu.conv_forward(x, w, s3, d3, p3, p3, 1, backend=_be(be)),
        "bwd_data": lambda be: gpu.conv_backward_data(dy, w, sp, s3, d3, p3, p3, 1,
                                                      backend=_be(be)),
        "bwd_filter": lambda be: gpu.conv_backward_filter(x, dy, (K,) * 3, s3, d3, p3, p3, 1,
                                                          backend=_be(be)),
    }


def _time(cp, fn):
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 reps, 1 warm-up")
    ap.add_argument("--reps", type=int, default=None, help="default 10 (quick: 5)")
    ap.add_argument("--warmup", type=int, default=None, help="default 2 (quick: 1)")
    ap.add_argument("--layers", default=",".join(str(i) for i in range(len(LAYERS))),
                    help="comma-separated indices into LAYERS")
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--no-planned", action="store_true",
                    help="leave out backend=None (the micro-batch planner under "
                         "DISTTENSOR_CONV_WORKSPACE_MB, tuned on its first call)")
    args = ap.parse_args(argv)
    args.reps = args.reps or (5 if args.quick else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)

    cp = gpu_module()
    if cp is None:
        print("conv_gpu_bench: no CUDA GPU (or no CuPy) here; nothing to measure")
        return 0
    from disttensor.ops.local import gpu

    have_cudnn = gpu.cudnn_available()
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    print(f"# device: {name}; cuDNN frontend: "
          f"{'yes' if have_cudnn else 'no (im2col only)'}; reps={args.reps} warmup={args.warmup}; "
          f"planner: DISTTENSOR_CONV_TUNE={os.environ.get('DISTTENSOR_CONV_TUNE', '(default)')} "
          f"DISTTENSOR_CONV_WORKSPACE_MB={os.environ.get('DISTTENSOR_CONV_WORKSPACE_MB', '(default)')}")
    if have_cudnn:
        import cudnn
        print(f"# cudnn frontend {getattr(cudnn, '__version__', '?')}, "
              f"backend {cudnn.backend_version()}")

    rng = cp.random.default_rng(0)
    for li in (int(i) for i in args.layers.split(",")):
        N, Cin, Cout, n = LAYERS[li]
        sp = (n, n, n)
        for dtype in (np.dtype(d).type for d in args.dtypes.split(",")):
            # generated on the device (dy of the first layer is 1 GiB in float32)
            x = rng.standard_normal((N, Cin) + sp, dtype=cp.float32).astype(dtype)
            w = (rng.standard_normal((Cout, Cin, K, K, K), dtype=cp.float32) * 0.1).astype(dtype)
            dy = rng.standard_normal((N, Cout) + sp, dtype=cp.float32).astype(dtype)
            ops = _ops(gpu, x, w, dy, sp)
            for opname, op in ops.items():
                label = f"conv3d {opname} {np.dtype(dtype).name} N={N} {Cin}->{Cout} {n}^3"
                backends, notes = [], []
                for be in ((["cudnn", "im2col"] if have_cudnn else ["im2col"])
                           + ([] if args.no_planned or (args.quick and dtype != np.float32)
                              else ["planned"])):
                    try:
                        for _ in range(max(1, args.warmup)):
                            op(be)
                    except TypeError as e:  # e.g. no __half kernels for im2col
                        notes.append(f"{be} unavailable: {e}")
                        continue
                    except Exception as e:  # noqa: BLE001 - a failure is a finding: go on
                        notes.append(f"{be} FAILED: {type(e).__name__}: {e}")
                        continue
                    if be == "cudnn" and gpu.last_conv_backend() != "cudnn":
                        notes.append("cuDNN has no engine for it")  # it fell back to im2col
                        continue
                    backends.append(be)
                cp.cuda.get_current_stream().synchronize()
                if not backends or (dtype == np.float16 and "cudnn" not in backends):
                    print(f"{label}: skipped ({'; '.join(notes)})", flush=True)
                    continue
                times = {be: [] for be in backends}
                for rep in range(args.reps):
                    order = backends[rep % len(backends):] + backends[:rep % len(backends)]
                    for be in order:
                        times[be].append(_time(cp, lambda: op(be)))
                med = {be: statistics.median(t) for be, t in times.items()}
                for be, t in med.items():
                    record("conv_gpu", f"{label} {be}", "ms", t, "ms", better="lower",
                           device="gpu")
                line = f"{label}: " + "  ".join(f"{be}={t:.3f} ms" for be, t in med.items())
                if "cudnn" in med and "im2col" in med:
                    line += f"  im2col/cudnn={med['im2col'] / med['cudnn']:.2f}x"
                    record("conv_gpu", label, "im2col_over_cudnn", med["im2col"] / med["cudnn"],
                           "x", target=1.0, better="higher", device="gpu")
                if "cudnn" in med and "planned" in med:
                    # the planner works under a workspace limit, cuDNN's heuristic plan not
                    line += f"  cudnn/planned={med['cudnn'] / med['planned']:.2f}x"
                    record("conv_gpu", label, "cudnn_over_planned", med["cudnn"] / med["planned"],
                           "x", better="higher", device="gpu")
                if notes:
                    line += f"  ({'; '.join(notes)})"
                print(line, flush=True)
            del ops, x, w, dy
            cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
