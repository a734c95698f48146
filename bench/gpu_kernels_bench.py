"""Achieved memory bandwidth of the GPU local kernels (CuPy RawKernels of the package
``disttensor/ops/local/gpu/``) against the device's peak and against a device-to-device copy.

Memory-bound kernels should run near the memory system's speed.  For each kernel this times
the public function of ``gpu`` (launch and output allocation from CuPy's pool included, as
the ops call it) on a tensor much larger than the L2 cache, counts the bytes the kernel must
move at least (each input read once, each output written once: its compulsory traffic), and
prints

    <kernel> float32 (N, C, D, H, W): 1.234 ms  2.71 TB/s  peak 0.81  copy 0.93

* ``peak``: achieved / theoretical peak bandwidth, ``2 * memory clock * bus width`` (the
  clock and width from ``cudaDeviceGetAttribute`` (``cudaDevAttrMemoryClockRate`` = 36,
  ``cudaDevAttrGlobalMemoryBusWidth`` = 37), since CUDA 13 dropped ``memoryClockRate`` from
  ``cudaDeviceProp``; ``getDeviceProperties`` where it still has them);
* ``copy``: achieved / the bandwidth of a device-to-device ``cudaMemcpyAsync`` moving the same
  number of bytes (half read, half written), measured in the same run: what this GPU really
  sustains (H100 80GB HBM3: about 3.0 TB/s of a 3.35 TB/s peak).

Kernels: max/avg pooling forward and backward (k2 s2, CosmoFlow's), per-channel sums
(batch-norm statistics) and their backward, batch-norm apply forward and backward, the five
activations forward and backward, channel softmax forward and backward, and the halo
pack/unpack (``disttensor.core.comm.copy_into`` of the six 1-wide faces of a halo'd block into
contiguous buffers and back: what a GPU halo exchange does around its messages).

Each figure is the mean over ``--reps`` back-to-back calls between two CUDA events, after
warm-up calls (NVRTC compilation, memory pool); the NVRTC compile time of each RawModule is
printed (and recorded) too.  Figures go to ``$DISTTENSOR_BENCH_CSV`` (``bench/_results.py``):
``bandwidth_fraction`` (of peak, target 0.7) and ``bandwidth_fraction_of_copy`` (target 0.7).
Without CuPy or a GPU it says so and exits 0.

    python bench/gpu_kernels_bench.py [--quick] [--shape 8,32,64,64,64] [--reps 20]
        [--dtypes float32,float16] [--only pool,bn,act,softmax,halo]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import record  # noqa: E402
from _timing import gpu_module  # noqa: E402

TARGET = 0.7
GROUPS = ("pool", "bn", "act", "softmax", "halo")


def peak_bandwidth(cp) -> tuple[float, str]:
    """(bytes/s, how it was found): 2 * memory clock (kHz) * 1e3 * bus width (bits) / 8."""
    dev = cp.cuda.Device().id
    clock = width = 0
    try:
        props = cp.cuda.runtime.getDeviceProperties(dev)
        clock = int(props.get("memoryClockRate", 0) or 0)
        width = int(props.get("memoryBusWidth", 0) or 0)
        how = "getDeviceProperties"
    except Exception:  # noqa: BLE001
        props = {}
    if not clock or not width:
        try:
            clock = clock or int(cp.cuda.runtime.deviceGetAttribute(36, dev))  # MemoryClockRate
            width = width or int(cp.cuda.runtime.deviceGetAttribute(37, dev))  # GlobalMemoryBusWidth
            how = "cudaDeviceGetAttribute"
        except Exception:  # noqa: BLE001
            return 0.0, "unknown"
    return 2.0 * clock * 1e3 * width / 8.0, f"{how}: {clock / 1e3:.0f} MHz x {width} bit"


def device_name(cp) -> str:
    try:
        n = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
        return n.decode() if isinstance(n, bytes) else str(n)
    except Exception:  # noqa: BLE001
        return "?"


def time_ms(cp, fn, reps: int, warmup: int) -> float:
    """Mean milliseconds of ``fn()`` over ``reps`` back-to-back calls (CUDA events on the
    current stream), after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    stream = cp.cuda.get_current_stream()
    stream.synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    for _ in range(reps):
        fn()
    end.record(stream)
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / reps


def copy_bandwidth(cp, nbytes: int, reps: int, warmup: int) -> float:
    """Bytes/s of a device-to-device memcpy moving ``nbytes`` (nbytes/2 read + nbytes/2
    written)."""
    half = max(1, nbytes // 2)
    src = cp.ones(half, dtype=cp.uint8)
    dst = cp.empty(half, dtype=cp.uint8)
    def copy():
        dst.data.copy_from_device_async(src.data, half, cp.cuda.get_current_stream())
    ms = time_ms(cp, copy, reps, warmup)
    del src, dst
    return 2 * half / (ms * 1e-3)


def _cases(cp, gpu, shape, dtype, groups, rng):
    """(name, fn, compulsory bytes) for every kernel of ``groups`` on ``shape``/``dtype``."""
    it = np.dtype(dtype).itemsize
    N, C = shape[:2]
    n = int(np.prod(shape))
    x = cp.asarray(rng.standard_normal(shape, dtype=np.float32), dtype=dtype)
    cases = []
    if "pool" in groups:
        k = s = (2, 2, 2)
        z = (0, 0, 0)
        y, am = gpu.pool_forward(x, "max", k, s, z, z)
        m = y.size
        dy = cp.asarray(rng.standard_normal(y.shape, dtype=np.float32), dtype=dtype)
        sp = shape[2:]
        cases += [
            ("max_pool3d fwd k2s2", lambda: gpu.pool_forward(x, "max", k, s, z, z),
             n * it + m * it + m * 4),
            ("avg_pool3d fwd k2s2", lambda: gpu.pool_forward(x, "avg", k, s, z, z),
             n * it + m * it),
            ("max_pool3d bwd k2s2", lambda: gpu.pool_backward(dy, am, "max", sp, k, s, z, z),
             m * it + m * 4 + n * it),
            ("avg_pool3d bwd k2s2", lambda: gpu.pool_backward(dy, None, "avg", sp, k, s, z, z),
             m * it + n * it),
        ]
    if any(g in groups for g in ("bn", "act", "softmax")):
        d = cp.asarray(rng.standard_normal(shape, dtype=np.float32), dtype=dtype)
    if "bn" in groups:
        mean = cp.asarray(rng.standard_normal(C))
        invstd = cp.asarray(rng.uniform(0.5, 2.0, C))
        gamma = cp.asarray(rng.uniform(0.5, 2.0, C))
        a1 = cp.asarray(rng.standard_normal(C))
        a2 = cp.asarray(rng.standard_normal(C))
        cases += [
            ("channel_sums (bn stats)", lambda: gpu.channel_sums(x), n * it),
            ("bn_forward_apply", lambda: gpu.bn_forward_apply(x, invstd, mean), 2 * n * it),
            ("channel_sums_backward", lambda: gpu.channel_sums_backward(d, x, mean, invstd),
             2 * n * it),
            ("bn_backward_apply",
             lambda: gpu.bn_backward_apply(d, x, mean, invstd, gamma, a1, a2), 3 * n * it),
        ]
    if "act" in groups:
        for name in ("relu", "leaky_relu", "elu", "sigmoid", "tanh"):
            yv = gpu.activation_forward(name, x)
            cases.append((f"{name} fwd", lambda name=name: gpu.activation_forward(name, x),
                          2 * n * it))
            # backward reads dy and x (relu, leaky_relu), dy, x and y (elu), dy and y
            reads = {"relu": 2, "leaky_relu": 2, "elu": 3, "sigmoid": 2, "tanh": 2}[name]
            # (x and y are both passed, as the autograd layer does; the kernel reads only the
            # ones its mode needs)
            cases.append((f"{name} bwd",
                          lambda name=name, yv=yv: gpu.activation_backward(name, d, x, yv),
                          (reads + 1) * n * it))
    if "softmax" in groups:
        ys = gpu.softmax_channels(x)
        cases += [
            ("softmax_channels fwd", lambda: gpu.softmax_channels(x), 2 * n * it),
            ("log_softmax_channels fwd", lambda: gpu.log_softmax_channels(x), 2 * n * it),
            ("softmax_channels bwd", lambda: gpu.softmax_channels_backward(d, ys), 3 * n * it),
        ]
    if "halo" in groups:
        cases += _halo_cases(cp, shape, dtype, it)
    return cases


def _halo_cases(cp, shape, dtype, it):
    """Pack and unpack of the six 1-wide faces of a (N, C, D+2, H+2, W+2) halo'd buffer."""
    try:
        from disttensor.core.comm import copy_into
    except Exception:  # noqa: BLE001 - mpi4py missing: the same CuPy assignment it does
        def copy_into(dst, src):
            dst[...] = src
    N, C, D, H, W = shape
    buf = cp.zeros((N, C, D + 2, H + 2, W + 2), dtype=dtype)
    inner = (slice(None), slice(None), slice(1, D + 1), slice(1, H + 1), slice(1, W + 1))
    faces = []
    for ax in (2, 3, 4):
        for lo in (True, False):
            sl = list(inner)
            n_ax = buf.shape[ax]
            # the owned cells next to the halo (sent) and the halo itself (received)
            send = list(sl)
            send[ax] = slice(1, 2) if lo else slice(n_ax - 2, n_ax - 1)
            recv = list(sl)
            recv[ax] = slice(0, 1) if lo else slice(n_ax - 1, n_ax)
            faces.append((ax, buf[tuple(send)], buf[tuple(recv)]))
    cases = []
    for ax, name in ((2, "depth (runs of H*W)"), (3, "height (runs of W)"),
                     (4, "width (runs of 1)")):
        sel = [(s, r) for a, s, r in faces if a == ax]
        scratch = [cp.empty(s.shape, dtype=dtype) for s, _ in sel]
        nbytes = sum(2 * s.size * it for s, _ in sel)

        def pack(sel=sel, scratch=scratch):
            for (s, _), b in zip(sel, scratch):
                copy_into(b, s)

        def unpack(sel=sel, scratch=scratch):
            for (_, r), b in zip(sel, scratch):
                copy_into(r, b)
        cases += [(f"halo pack faces {name}", pack, nbytes),
                  (f"halo unpack faces {name}", unpack, nbytes)]
    return cases


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="smaller tensor (4,32,64,64,64), fewer reps, float32 only")
    ap.add_argument("--shape", default=None, help="N,C,D,H,W (default 8,32,64,64,64)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--dtypes", default=None, help="default float32,float16 (quick: float32)")
    ap.add_argument("--only", default=",".join(GROUPS), help=f"subset of {','.join(GROUPS)}")
    args = ap.parse_args(argv)
    shape = tuple(int(v) for v in (args.shape or ("4,32,64,64,64" if args.quick
                                                   else "8,32,64,64,64")).split(","))
    if len(shape) != 5:
        ap.error("--shape takes 5 extents N,C,D,H,W")
    reps = args.reps or (10 if args.quick else 30)
    dtypes = (args.dtypes or ("float32" if args.quick else "float32,float16")).split(",")
    groups = set(args.only.split(","))

    cp = gpu_module()
    if cp is None:
        print("gpu_kernels_bench: no CUDA GPU (or no CuPy) here; nothing to measure")
        return 0
    from disttensor.ops.local import gpu

    peak, how = peak_bandwidth(cp)
    print(f"# device: {device_name(cp)}; peak memory bandwidth "
          f"{peak / 1e12:.3f} TB/s ({how}); shape {shape}; reps {reps}")
    for mod in ("pool", "pointwise", "im2col"):
        t0 = time.perf_counter()
        try:
            _, half = gpu.rawmodules.load_module(mod)
        except Exception as e:  # noqa: BLE001 - a compile error is a finding: report, go on
            print(f"NVRTC {mod}.cu: FAILED ({type(e).__name__}: {e})", flush=True)
            continue
        dt_ = time.perf_counter() - t0
        print(f"NVRTC {mod}.cu: {dt_:.2f} s{'' if half else ' (no __half instances)'}")
        record("gpu_kernels", f"nvrtc {mod}.cu", "compile_s", dt_, "s", better="lower",
               device="gpu")

    rng = np.random.default_rng(0)
    copy_bw = {}
    worst = []
    for dtype in dtypes:
        try:
            cases = _cases(cp, gpu, shape, np.dtype(dtype), groups, rng)
        except Exception as e:  # noqa: BLE001
            print(f"{dtype}: could not set up the cases ({type(e).__name__}: {e})", flush=True)
            continue
        for name, fn, nbytes in cases:
            label = f"{name} {dtype} {shape}"
            try:
                ms = time_ms(cp, fn, reps, args.warmup)
            except Exception as e:  # noqa: BLE001 - one broken kernel must not hide the rest
                print(f"{label}: FAILED ({type(e).__name__}: {e})", flush=True)
                continue
            bw = nbytes / (ms * 1e-3)
            key = round(nbytes, -6)
            if key not in copy_bw:
                copy_bw[key] = copy_bandwidth(cp, nbytes, reps, args.warmup)
            fp = bw / peak if peak else float("nan")
            fc = bw / copy_bw[key]
            worst.append((fp, label))
            print(f"{label}: {ms:8.3f} ms  {bw / 1e12:5.2f} TB/s  peak {fp:4.2f}  "
                  f"copy {fc:4.2f}  ({nbytes / 2**20:.0f} MiB moved; copy "
                  f"{copy_bw[key] / 1e12:.2f} TB/s)", flush=True)
            if peak:
                record("gpu_kernels", label, "bandwidth_fraction", fp, "fraction",
                       target=TARGET, device="gpu")
            record("gpu_kernels", label, "bandwidth_fraction_of_copy", fc, "fraction",
                   target=TARGET, device="gpu")
        del cases
        cp.get_default_memory_pool().free_all_blocks()
    if copy_bw:
        best = max(copy_bw.values())
        print(f"# device-to-device copy: {best / 1e12:.2f} TB/s"
              + (f" = {best / peak:.2f} of peak" if peak else ""))
        if peak:
            record("gpu_kernels", "cudaMemcpy D2D", "bandwidth_fraction", best / peak,
                   "fraction", device="gpu")
    if worst:
        below = sorted(w for w in worst if w[0] < TARGET)
        print(f"# {len(worst) - len(below)} of {len(worst)} kernels at >= {TARGET} of peak"
              + ("; slowest: " + "; ".join(f"{lab} {f:.2f}" for f, lab in below[:5])
                 if below else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
