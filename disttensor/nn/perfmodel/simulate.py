"""The scaling simulator: the step time and memory of a model on every grid of a machine
that is not this one (pure).

:func:`simulate_grid` predicts one grid ``(sample, d, h, w)``: the layer geometry of
:func:`~.geometry.analyze_layers` (on the layers themselves or on their pure descriptions,
:mod:`.layerspec`, so no array of the model is allocated), compute per layer from the
:class:`~.machine.Machine` (:meth:`~.machine.Machine.layer_times`), the machine's links as a
:class:`~.links.LinkModel` of that grid (halos inside or across nodes, the hierarchical
all-reduce over all devices, the per-op agreement), combined by the same
:func:`~.prediction.predict_grid` that :func:`~.plan.plan_grid` uses on measured figures.
:func:`simulate` does it for every grid of a device count (:func:`~.plan.enumerate_grids`),
excludes the grids the model cannot run on (:class:`~.geometry.InvalidGrid`) or whose
memory per device (:func:`~.prediction.estimate_memory`) is over the machine's usable memory,
and ranks the rest (a :class:`SimulatedPlan`).  Nothing here communicates.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import Sequence

from ..parallel import DEFAULT_BUCKET_BYTES
from .geometry import InvalidGrid, analyze_layers, layer_param_bytes
from .links import LinkModel
from .machine import Machine
from .plan import GridPlan, enumerate_grids
from .prediction import OPTIMIZER_STATE, GridPrediction, estimate_memory, predict_grid

__all__ = ["SimulatedPlan", "simulate_grid", "simulate", "speedup"]


def _param_layers(layers) -> list[tuple[int, int]]:
    return [(i, layer_param_bytes(l)) for i, l in enumerate(layers) if layer_param_bytes(l)]


def grid_links(machine: Machine, grid) -> LinkModel:
    """The machine's links as seen by the slowest device of ``grid`` (pure)."""
    n = math.prod(grid)
    of, ob = machine.op_overhead(n)
    return LinkModel(p2p=machine.halo_link(grid), allreduce=machine.allreduce(n), nranks=n,
                     op_forward_s=of, op_backward_s=ob)


def simulate_grid(layers: Sequence, input_shape: Sequence[int], batch: int, grid,
                  machine: Machine, *, optimizer: str = "adam", halo_overlap: bool = True,
                  bucket_bytes: int = DEFAULT_BUCKET_BYTES, overlap: bool = True,
                  itemsize: int = 4, geoms=None, sample_bytes: float = 0.0,
                  spatial_io: bool = True) -> GridPrediction:
    """The predicted step of ``layers`` (a model's :func:`~disttensor.nn.module.
    sequential_layers` or :class:`~.layerspec.LayerSpec` list) on ``grid`` of ``machine``
    for a global batch ``batch`` of samples ``input_shape`` ``(C, D, H, W)`` (pure).
    ``halo_overlap``: windowed ops overlap their halo exchange with compute (as on GPU);
    ``optimizer``: its state and step (memory bound); ``sample_bytes``: one sample's bytes on
    storage (``0``: no sample I/O), read for the next step while this one computes
    (prefetch), so only the part of :meth:`~.machine.Machine.io_time` over the step is added
    (``io_s``); ``spatial_io``: each device reads only its block.  Raises
    :class:`~.geometry.InvalidGrid` for a grid the model cannot run on."""
    if optimizer not in OPTIMIZER_STATE:
        raise ValueError(f"simulate: optimizer must be one of {tuple(OPTIMIZER_STATE)}, got "
                         f"{optimizer!r}")
    layers = list(layers)
    grid = tuple(int(g) for g in grid)
    if geoms is None:
        geoms = analyze_layers(layers, input_shape, batch, grid, itemsize)
    times = [machine.layer_times(l, g, i > 0, itemsize)
             for i, (l, g) in enumerate(zip(layers, geoms))]
    params = _param_layers(layers)
    state = OPTIMIZER_STATE[optimizer]
    opt_s = machine.optimizer_time(sum(n for _, n in params), state) if state or \
        optimizer != "none" else 0.0
    pred = predict_grid(grid, geoms, times, grid_links(machine, grid), params, opt_s,
                        bucket_bytes, overlap, halo_overlap, state)
    io = machine.io_time(grid, batch, sample_bytes, spatial_io)
    exposed = max(0.0, io - pred.step_s)      # prefetched: hidden behind the previous step
    return replace(pred, step_s=pred.step_s + exposed, io_s=exposed) if exposed else pred


@dataclass
class SimulatedPlan(GridPlan):
    """:func:`simulate`'s result: a :class:`~.plan.GridPlan` (``ranked`` fastest first,
    ``excluded`` ``(grid, reason)``) of ``machine`` for ``devices`` devices."""
    machine: Machine | None = None
    devices: int = 0

    def report(self, top: int | None = None) -> str:
        m = self.machine
        rows = self.ranked if top is None else self.ranked[:top]
        lines = [f"{self.devices} devices of {m.name} ({m.description}): predicted step per "
                 f"grid (sample, d, h, w), {m.usable_bytes / 2 ** 30:.1f} GiB usable per "
                 "device"]
        lines.append(f"  {'rank':>4s}  {'grid':14s} {'step ms':>9s} {'fwd+bwd':>9s} "
                     f"{'allreduce':>9s} {'optim':>7s} {'I/O':>6s} {'GiB/dev':>8s}")
        for k, p in enumerate(rows):
            lines.append(f"  {k + 1:4d}  {'x'.join(map(str, p.grid)):14s} "
                         f"{p.step_s * 1e3:9.2f} {(p.forward_s + p.backward_s) * 1e3:9.2f} "
                         f"{p.allreduce_s * 1e3:9.2f} {p.optimizer_s * 1e3:7.2f} "
                         f"{p.io_s * 1e3:6.2f} "
                         f"{p.memory['total'] / 2 ** 30:8.2f}")
        if top is not None and len(self.ranked) > top:
            lines.append(f"  ... {len(self.ranked) - top} more")
        mem = [(g, why) for g, why in self.excluded if "memory" in why]
        bad = [(g, why) for g, why in self.excluded if "memory" not in why]
        if mem:
            lines.append(f"  excluded for memory ({len(mem)}): " + ", ".join(
                f"{'x'.join(map(str, g))} ({why.split(' GiB')[0].split()[-1]} GiB)"
                for g, why in mem[:8]) + (" ..." if len(mem) > 8 else ""))
        if bad:
            lines.append(f"  excluded as invalid ({len(bad)}): " + ", ".join(
                "x".join(map(str, g)) for g, _ in bad[:8]) + (" ..." if len(bad) > 8 else ""))
        return "\n".join(lines)


def simulate(layers: Sequence, input_shape: Sequence[int], batch: int, devices: int,
             machine: Machine, *, candidates=None, optimizer: str = "adam",
             halo_overlap: bool = True, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
             overlap: bool = True, itemsize: int = 4, symmetric: bool = True,
             sample_bytes: float = 0.0, spatial_io: bool = True) -> SimulatedPlan:
    """Rank every grid of ``devices`` devices of ``machine`` for training ``layers`` on a
    global batch ``batch`` of samples ``input_shape`` (pure; see :func:`simulate_grid`).
    Grids the model cannot run on, or whose predicted memory per device is over
    ``machine.usable_bytes``, are listed in ``excluded`` with the reason.  Raises
    ``ValueError`` for bad arguments (the plan's ``ranked`` may be empty: nothing fits)."""
    layers = list(layers)
    try:
        input_shape = tuple(int(v) for v in input_shape)
    except (TypeError, ValueError):
        raise ValueError(f"simulate: input_shape must be (C, D, H, W), got "
                         f"{input_shape!r}") from None
    if len(input_shape) != 4 or min(input_shape) < 1:
        raise ValueError(f"simulate: input_shape must be (C, D, H, W), got {input_shape}")
    for nm, v in (("batch", batch), ("devices", devices)):
        if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < 1:
            raise ValueError(f"simulate: {nm} must be a positive integer, got {v!r}")
    if not layers:
        raise ValueError("simulate: the model has no layers")
    grids = enumerate_grids(devices, batch, input_shape[1:], symmetric) if candidates is None \
        else [tuple(int(v) for v in c) for c in candidates]
    for g in grids:
        if len(g) != 4 or math.prod(g) != devices:
            raise ValueError(f"simulate: candidate {g} is not a 4-axis grid of {devices} "
                             "devices")
    pbytes = sum(n for _, n in _param_layers(layers))
    state = OPTIMIZER_STATE.get(optimizer, 0.0)
    ranked, excluded = [], []
    for g in grids:
        try:
            geoms = analyze_layers(layers, input_shape, batch, g, itemsize)
        except InvalidGrid as e:
            excluded.append((g, str(e)))
            continue
        mem = estimate_memory(geoms, pbytes, state)["total"]
        if mem > machine.usable_bytes:
            excluded.append((g, f"predicted memory {mem / 2 ** 30:.1f} GiB per device over "
                                f"the usable {machine.usable_bytes / 2 ** 30:.1f} GiB"))
            continue
        ranked.append(simulate_grid(layers, input_shape, batch, g, machine,
                                    optimizer=optimizer, halo_overlap=halo_overlap,
                                    bucket_bytes=bucket_bytes, overlap=overlap,
                                    itemsize=itemsize, geoms=geoms,
                                    sample_bytes=sample_bytes, spatial_io=spatial_io))
    ranked.sort(key=lambda p: (p.step_s, p.grid))
    return SimulatedPlan(ranked, excluded, grid_links(machine, (devices, 1, 1, 1)),
                         machine.usable_bytes, machine=machine, devices=devices)


def speedup(layers, input_shape, batch: int, devices_from: int, devices_to: int,
            machine: Machine, **kw) -> tuple[float, SimulatedPlan, SimulatedPlan]:
    """Strong scaling: the best grid's step on ``devices_from`` over the best on
    ``devices_to`` (same global batch), and the two plans."""
    a = simulate(layers, input_shape, batch, devices_from, machine, **kw)
    b = simulate(layers, input_shape, batch, devices_to, machine, **kw)
    if not a.ranked or not b.ranked:
        raise ValueError(f"speedup: no grid fits on "
                         f"{devices_from if not a.ranked else devices_to} devices")
    return a.best.step_s / b.best.step_s, a, b
