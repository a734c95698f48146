"""``python -m disttensor.plan``: rank the grids of a model on a machine, past this one.

Prints, for a model (CosmoFlow or a 3D U-Net, described layer by layer without allocating
it: :mod:`disttensor.nn.perfmodel.layerspec`), an input size, a global batch, one or more
device counts and a machine description (:mod:`disttensor.nn.perfmodel.machine`), the grids
``(sample, d, h, w)`` ranked by the simulated step time (:func:`~disttensor.nn.perfmodel.
simulate.simulate`), their memory per device, the grids excluded for memory or as invalid,
and with several device counts the strong-scaling speedup of the best grids::

    python -m disttensor.plan --model cosmoflow --size 512 --batch 64 --gpus 512,2048
    python -m disttensor.plan --model unet --size 256 --batch 16 --gpus 256,512 --machine h100-ndr
    mpiexec -n 2 python -m disttensor.plan --machine here --size 32 --batch 4 --gpus 2

``--machine here`` measures this machine first (collective over ``COMM_WORLD``: the links,
and the layer throughputs of the model itself built at ``--calibrate-size``, one sample per
rank, :func:`~disttensor.nn.perfmodel.machine.measure_machine`); the shipped descriptions need
no MPI job.  Only rank 0 prints.
:func:`main` returns the exit status (2 for bad arguments, with the reason on stderr).
"""
from __future__ import annotations

import argparse
import sys

from ..nn.perfmodel.layerspec import (cosmoflow_layers, cosmoflow_sample_bytes, unet_layers,
                                     unet_sample_bytes)
from ..nn.perfmodel.machine import MACHINES
from ..nn.perfmodel.simulate import simulate

__all__ = ["main", "parse_args", "model_layers", "COSMOFLOW_WIDTHS", "COSMOFLOW_DENSE"]

#: the CosmoFlow of the strong-scaling study (7 convolution stages, dense 2048 -> 256)
COSMOFLOW_WIDTHS = (16, 32, 64, 128, 256, 256, 256)
COSMOFLOW_DENSE = (2048, 256)


def _ints(text: str, what: str) -> tuple:
    try:
        vals = tuple(int(v) for v in str(text).split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be comma-separated integers, got "
                                         f"{text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"{what} must be positive integers, got {text!r}")
    return vals


def parse_args(argv=None) -> argparse.Namespace:
    """The options (``argv``: default ``sys.argv[1:]``); exits with status 2 on bad ones."""
    p = argparse.ArgumentParser(
        prog="python -m disttensor.plan",
        description="Rank the grids (sample x d x h x w) of a model on a machine by simulated "
                    "step time and memory per device.")
    p.add_argument("--model", choices=("cosmoflow", "unet"), default="cosmoflow")
    p.add_argument("--size", type=int, default=512, help="spatial extent of a (cubic) sample")
    p.add_argument("--batch", type=int, default=64, help="global batch (samples)")
    p.add_argument("--gpus", type=lambda t: _ints(t, "--gpus"), default=(512, 2048),
                   help="device count(s), comma-separated (speedups between them)")
    p.add_argument("--machine", choices=tuple(MACHINES) + ("here",), default="v100-edr")
    p.add_argument("--top", type=int, default=10, help="rows of the ranking per device count")
    p.add_argument("--widths", type=lambda t: _ints(t, "--widths"), default=None,
                   help="CosmoFlow: filters per stage (default 16,32,64,128,256,256,256, "
                        "the stages limited to those the size allows); U-Net: the "
                        "encoder's second widths (default 64,128,256, bottom 512)")
    p.add_argument("--dense", type=lambda t: _ints(t, "--dense"), default=COSMOFLOW_DENSE,
                   help="CosmoFlow dense sizes (default 2048,256)")
    p.add_argument("--channels", type=int, default=None,
                   help="input channels (default CosmoFlow 4, U-Net 1)")
    p.add_argument("--optimizer", choices=("adam", "adamw", "sgd", "none"), default="adam")
    p.add_argument("--calibrate-size", type=int, default=None,
                   help="--machine here: the sample size the model's layers are timed at "
                        "(default: the smallest its pooling allows, at least 32)")
    p.add_argument("--no-halo-overlap", action="store_true",
                   help="halo exchange not hidden behind compute (the CPU default)")
    args = p.parse_args(argv)
    for name in ("size", "batch", "top"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if args.channels is not None and args.channels < 1:
        p.error(f"--channels must be a positive integer, got {args.channels}")
    return args


def model_layers(args) -> tuple[list, tuple]:
    """The layer descriptions and the sample shape ``(C, D, H, W)`` of ``args``."""
    if args.model == "cosmoflow":
        widths = args.widths or COSMOFLOW_WIDTHS
        if args.widths is None:  # as many stages as the size allows
            stages = max(1, min(len(widths), args.size.bit_length() - 1))
            widths = widths[:stages]
        c = args.channels or 4
        return cosmoflow_layers(args.size, c, widths, args.dense, 4), (c,) + (args.size,) * 3
    enc = args.widths or (64, 128, 256)
    encoder = tuple((w // 2, w) for w in enc)
    c = args.channels or 1
    if args.size % 2 ** len(encoder):
        raise ValueError(f"a U-Net of {len(encoder)} levels needs a size divisible by "
                         f"{2 ** len(encoder)}, got {args.size}")
    return unet_layers(c, 3, encoder, (enc[-1], 2 * enc[-1])), (c,) + (args.size,) * 3


def _machine(args, layers):
    """The machine description; ``here``: measured on the model itself at a small size
    (``--calibrate-size``: default the smallest its pooling allows, at least 32), one sample
    per rank."""
    if args.machine != "here":
        return MACHINES[args.machine]
    import argparse as _a
    from mpi4py import MPI
    from ..nn.perfmodel.layerspec import levels_of
    from ..nn.perfmodel.machine import measure_machine
    comm = MPI.COMM_WORLD
    size = args.calibrate_size or min(args.size, max(32, 2 ** levels_of(layers)))
    small = _a.Namespace(**{**vars(args), "size": size})
    cal, shape = model_layers(small)
    return measure_machine(comm, cal, shape, comm.size)


def main(argv=None, out=None) -> int:
    """Run the command (``argv``: default ``sys.argv[1:]``; ``out``: default stdout)."""
    out = sys.stdout if out is None else out
    try:
        args = parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        layers, shape = model_layers(args)
        machine = _machine(args, layers)
        nbytes = (cosmoflow_sample_bytes if args.model == "cosmoflow" else
                  unet_sample_bytes)(shape)
        plans = [simulate(layers, shape, args.batch, n, machine, optimizer=args.optimizer,
                          halo_overlap=not args.no_halo_overlap, sample_bytes=nbytes)
                 for n in args.gpus]
    except ValueError as e:
        print(f"python -m disttensor.plan: error: {e}", file=sys.stderr)
        return 2
    if args.machine == "here":
        from mpi4py import MPI
        if MPI.COMM_WORLD.rank:
            return 0
    pbytes = sum(l.param_bytes for l in layers)
    print(f"{args.model} {'x'.join(map(str, shape))} (C x D x H x W), batch {args.batch}, "
          f"{len(layers)} layers, {pbytes / 4e6:.1f} M parameters, optimizer "
          f"{args.optimizer}, halo overlap {'off' if args.no_halo_overlap else 'on'}", file=out)
    if args.machine == "here":
        cf, cb = (machine.peak_flops * e / 1e9 for e in machine.conv_efficiency)
        print(f"measured: convolution {cf:.1f} / {cb:.1f} GFLOP/s forward / backward, "
              f"memory-bound layers {machine.bandwidth / 1e9:.2f} GB/s + "
              f"{machine.host_op_s * 1e6:.0f} us per op and pass", file=out)
    for plan in plans:
        print(plan.report(top=args.top), file=out)
        if not plan.ranked:
            print(f"  no grid of {plan.devices} devices fits", file=out)
    fits = [p for p in plans if p.ranked]
    for a, b in zip(fits, fits[1:]):
        print(f"speedup {a.devices} -> {b.devices} devices (best grids "
              f"{'x'.join(map(str, a.best.grid))} -> {'x'.join(map(str, b.best.grid))}): "
              f"{a.best.step_s / b.best.step_s:.2f}x", file=out)
    return 0
