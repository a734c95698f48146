"""Machine descriptions for planning past one machine: what a device computes per second,
how much memory it has, and its links inside and between nodes.

A :class:`Machine` (a plain, frozen value) gives the simulator (:mod:`.simulate`) three
things, all pure:

* **compute per layer and pass** (:meth:`Machine.layer_times`): a convolution (or a
  transposed one) costs its multiply-adds at ``peak_flops * conv_efficiency`` (forward;
  backward: the input gradient, unless the layer is the first, plus the weight gradient, each
  as many flops as the forward, at the backward efficiency), or its bytes at ``bandwidth`` when
  that is slower; linear layers their GEMM flops at ``dense_efficiency``; pooling, pointwise
  layers (activations, batch norm), flatten and concatenation their bytes moved at
  ``bandwidth`` (forward: read the input, write the output, batch norm reads twice; backward:
  read the output gradient and the saved input, write the input gradient); every kernel pays
  ``launch_s`` and every op and pass ``host_op_s`` (the framework's host side); a
  convolution kernel on ``n`` output elements runs at ``rate * n / (n + conv_half_elems)``
  (Hockney's half-performance size: a GPU needs a full wave of output tiles to reach its
  rate, so thin blocks of small deep layers run far below it; the halo a block reads is in
  its input bytes);
* **sample I/O** (:meth:`Machine.io_time`): each step's samples read from storage per node,
  optionally under a shared file-system limit, plus a latency per sample read and the copy
  to the device; the simulator prefetches it behind the previous step;
* **links** (:meth:`Machine.halo_link`, :meth:`Machine.allreduce`): alpha-beta models inside a
  node (``intra``: NVLink) and between nodes (``inter``: InfiniBand, the bandwidth each
  device gets when every device of its node sends at once); a sample's spatial group sits in
  one node when it fits (ranks are numbered ``w`` fastest, then ``h``, ``d``, sample), else
  its halos cross nodes; the gradient all-reduce over ``n`` devices is hierarchical
  (reduce-scatter inside the node, ring or tree across nodes on the node's share, all-gather
  inside the node), the faster of ring and tree per message (``allreduce="auto"``, as NCCL
  picks);
* **memory**: ``memory_bytes`` per device of which ``reserved_bytes`` go to the runtime
  (context, library workspaces).

Shipped: :data:`V100_EDR` (16 GB V100 SXM2, 4 per node, NVLink 2, 2 x EDR InfiniBand per node:
an ABCI-like system, the one of Oyama's published figures), :data:`H100_NDR` (80 GB H100 SXM,
8 per node, NVLink 4 through NVSwitch, one NDR InfiniBand per GPU: a prediction, nothing
measured), and :func:`measure_machine` (collective) builds one from measurements on the
communicator it runs on (measured links, layer throughputs fitted to :class:`LayerTimer`
timings of a model's own layers), so the same simulator predicts here.  The figures and
where they come from are listed in each description's ``sources`` and in
``docs/performance.md``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .links import AlphaBeta

__all__ = ["Machine", "HierarchicalAllreduce", "V100_EDR", "H100_NDR", "MACHINES",
           "measure_machine"]

_MEMORY_BOUND = ("pointwise", "flatten", "concat")


@dataclass(frozen=True)
class HierarchicalAllreduce(AlphaBeta):
    """An all-reduce time model over ``ndev`` devices: ``alpha``/``beta`` are the ring's
    (across nodes), ``tree_alpha``/``tree_beta`` the tree's; ``auto`` takes the faster per
    message size (``algorithm``: ``ring``, ``tree``, ``auto``).  Called as
    :class:`AlphaBeta`: ``t(nbytes)``."""
    tree_alpha: float = 0.0
    tree_beta: float = 0.0
    algorithm: str = "auto"

    def __call__(self, nbytes: float, messages: int = 1) -> float:
        if nbytes <= 0 or messages <= 0:
            return 0.0
        ring = messages * self.alpha + nbytes * self.beta
        tree = messages * self.tree_alpha + nbytes * self.tree_beta
        return {"ring": ring, "tree": tree}.get(self.algorithm, min(ring, tree))

    @property
    def latency(self) -> float:
        """Seconds of a tiny all-reduce (an agreement, batch-norm statistics)."""
        return self(8)


@dataclass(frozen=True)
class Machine:
    """A system of devices (see the module docstring for the model; all figures per
    device).  ``conv_efficiency``: fraction of ``peak_flops`` a 3D convolution reaches
    (forward, backward); ``bandwidth``: bytes/s memory-bound kernels reach; ``launch_s``:
    fixed seconds per kernel; ``host_op_s``: this library's host-side seconds per op and pass
    (Python dispatch, bookkeeping: they do not shrink with a faster device);
    ``conv_roofline``: a convolution is never faster than its bytes at ``bandwidth`` (off for
    a measured machine, whose ``bandwidth`` is that of its pooling and pointwise kernels);
    ``intra``/``inter``: per-message alpha and per-byte beta of a
    neighbour transfer inside / between nodes; ``allreduce``: ``auto``, ``ring`` or ``tree``
    across nodes; ``agreement``: every distributed op agrees its arguments in one tiny
    all-reduce per pass over the grid (this library's collective contract);
    ``measured_allreduce`` / ``measured_op_s``: measured models that replace the hierarchical
    all-reduce and the per-op cost (:func:`measure_machine`); ``conv_half_elems``: output
    elements per convolution kernel at which it reaches half its rate (``0``: no size
    effect); ``io_node_bandwidth`` (``0``: no sample I/O), ``io_aggregate_bandwidth`` (``0``:
    no shared limit), ``io_latency_s`` per sample read, ``h2d_bandwidth`` (``0``: no copy):
    the sample reader (:meth:`io_time`)."""
    name: str
    memory_bytes: float
    devices_per_node: int
    peak_flops: float
    bandwidth: float
    intra: AlphaBeta
    inter: AlphaBeta
    conv_efficiency: tuple = (0.45, 0.35)
    dense_efficiency: float = 0.6
    launch_s: float = 5e-6
    host_op_s: float = 0.0
    conv_roofline: bool = True
    reserved_bytes: float = 0.0
    allreduce_algorithm: str = "auto"
    agreement: bool = True
    measured_allreduce: AlphaBeta | None = None
    measured_op_s: tuple | None = None
    conv_half_elems: float = 0.0
    io_node_bandwidth: float = 0.0
    io_aggregate_bandwidth: float = 0.0
    io_latency_s: float = 0.0
    h2d_bandwidth: float = 0.0
    description: str = ""
    sources: tuple = field(default=(), compare=False)

    def __post_init__(self):
        if self.memory_bytes <= 0 or self.devices_per_node < 1 or self.peak_flops <= 0 \
                or self.bandwidth <= 0:
            raise ValueError(f"Machine {self.name!r}: memory, devices per node, peak flops "
                             "and bandwidth must be positive")
        if self.allreduce_algorithm not in ("auto", "ring", "tree"):
            raise ValueError(f"Machine {self.name!r}: allreduce_algorithm must be auto, ring "
                             f"or tree, got {self.allreduce_algorithm!r}")

    @property
    def usable_bytes(self) -> float:
        """Memory per device left for the model (``memory_bytes - reserved_bytes``)."""
        return self.memory_bytes - self.reserved_bytes

    # -- compute ---------------------------------------------------------------------------
    @staticmethod
    def layer_work(layer, geom, input_grad: bool = True, itemsize: int = 4):
        """What ``layer`` does on the block ``geom`` (pure): ``(kind, forward, backward)``
        with ``kind`` ``conv``, ``dense`` or ``memory`` and each pass ``(flops, bytes,
        kernels)`` (flops 0 for memory-bound layers); ``None`` when the device owns no
        output."""
        if not geom.time_shape:
            return None
        from .geometry import layer_type
        kind, tname = geom.kind, layer_type(layer)
        i_b, o_b = float(geom.in_bytes), float(geom.out_bytes)
        gin = 1 if input_grad else 0
        if kind in ("window", "upsample") and tname.startswith("Conv"):
            cin = geom.time_shape[1] // max(int(getattr(layer, "groups", 1) or 1), 1)
            taps = 1 if kind == "upsample" else math.prod(layer.kernel_size)
            flops = 2.0 * cin * taps * o_b / itemsize
            pb = float(geom.param_bytes)
            return ("conv", (flops, i_b + o_b + pb, 1),
                    (flops * (1 + gin), o_b + i_b * (1 + gin) + 2 * pb, 1 + gin))
        if kind == "window":                       # pooling
            return "memory", (0.0, i_b + o_b, 1), (0.0, o_b + i_b * (1 + gin), 1)
        if kind == "dense":
            flops = 2.0 * (i_b / itemsize) * layer.out_features
            return "dense", (flops, i_b + o_b, 1), (flops * (1 + gin), i_b + o_b, 1 + gin)
        if kind in _MEMORY_BOUND:
            reads = 2.0 if tname.startswith("BatchNorm") else 1.0
            back = (o_b + i_b * (reads - 1 + gin)) if kind == "pointwise" else o_b * gin
            return "memory", (0.0, i_b * reads + o_b, 1), (0.0, back, 1)
        raise ValueError(f"Machine.layer_times: cannot model layer {geom.name} of kind "
                         f"{kind!r} (describe the model layer by layer, "
                         "disttensor.nn.perfmodel.layerspec)")

    def layer_times(self, layer, geom, input_grad: bool = True,
                    itemsize: int = 4) -> tuple[float, float]:
        """``(forward_s, backward_s)`` of ``layer`` on the block ``geom``
        (:class:`~.geometry.LayerGeometry`) of the slowest device (pure).  ``input_grad``:
        whether backward computes the input's gradient (not for the first layer)."""
        work = self.layer_work(layer, geom, input_grad, itemsize)
        if work is None:
            return 0.0, 0.0
        kind, *passes = work
        out = []
        for (flops, nbytes, kernels), eff in zip(passes, self.conv_efficiency):
            if kind == "dense":
                eff = self.dense_efficiency
            if flops:
                t = flops / (self.peak_flops * eff)
                if kind == "conv" and self.conv_half_elems:
                    n = geom.out_bytes / itemsize     # output elements of the kernel
                    t *= (n + self.conv_half_elems) / n
                if self.conv_roofline:
                    t = max(t, nbytes / self.bandwidth)
            else:
                t = nbytes / self.bandwidth
            out.append(t + kernels * self.launch_s + self.host_op_s)
        return out[0], out[1]

    def io_time(self, grid, batch: int, sample_bytes: float, spatial: bool = True) -> float:
        """Seconds to read one step's samples (``batch`` x ``sample_bytes`` on storage) on
        ``grid`` (pure): each node reads its devices' share at ``io_node_bandwidth``, all nodes
        together at most ``io_aggregate_bandwidth``, each device pays ``io_latency_s`` per
        sample it reads a part of and copies its bytes to the device at ``h2d_bandwidth``.
        ``spatial``: each device reads only its block of the sample (the spatially
        partitioned reader); else every device of a sample's group reads the whole sample.
        ``0`` when the machine has no I/O figures (``io_node_bandwidth == 0``) or nothing is
        read."""
        if not self.io_node_bandwidth or sample_bytes <= 0:
            return 0.0
        s = int(grid[0])
        n = math.prod(grid)
        per_sample_group = batch / s                     # samples each device reads part of
        dev = per_sample_group * sample_bytes / (math.prod(grid[1:]) if spatial else 1)
        node = dev * min(self.devices_per_node, n)
        t = max(node / self.io_node_bandwidth,
                dev * n / self.io_aggregate_bandwidth if self.io_aggregate_bandwidth else 0.0)
        if self.h2d_bandwidth:
            t += dev / self.h2d_bandwidth
        return t + math.ceil(per_sample_group) * self.io_latency_s

    def optimizer_time(self, param_bytes: float, state: float) -> float:
        """One optimizer step: read parameters and gradients, read and write the state and
        the parameters (memory bound; ``state`` in parameter sizes)."""
        return (2 + 2 * state + 1) * param_bytes / self.bandwidth + self.launch_s

    # -- links -----------------------------------------------------------------------------
    def spans_nodes(self, devices: int) -> bool:
        """Whether a group of ``devices`` consecutive ranks can span two nodes."""
        g = self.devices_per_node
        return devices > g or g % devices != 0

    def halo_link(self, grid) -> AlphaBeta:
        """The link of the slowest device's halo exchange on ``grid`` ``(s, d, h, w)``."""
        sp = math.prod(grid[1:])
        return self.inter if sp > 1 and self.spans_nodes(sp) else self.intra

    def allreduce(self, ndev: int) -> AlphaBeta:
        """The all-reduce time model over ``ndev`` devices (measured, or hierarchical)."""
        if ndev <= 1:
            return AlphaBeta()
        if self.measured_allreduce is not None:
            return self.measured_allreduce
        g = min(ndev, self.devices_per_node)
        nodes = -(-ndev // self.devices_per_node)
        a = 2 * (g - 1) * self.intra.alpha
        b = 2 * (g - 1) / g * self.intra.beta
        if nodes == 1:
            return HierarchicalAllreduce(a, b, a, b, self.allreduce_algorithm)
        ring_a = a + 2 * (nodes - 1) * self.inter.alpha
        ring_b = b + 2 * (nodes - 1) / nodes / g * self.inter.beta
        tree_a = a + 2 * math.ceil(math.log2(nodes)) * self.inter.alpha
        tree_b = b + 2 / g * self.inter.beta
        return HierarchicalAllreduce(ring_a, ring_b, tree_a, tree_b, self.allreduce_algorithm)

    def op_overhead(self, ndev: int) -> tuple[float, float]:
        """Seconds every distributed op adds per (forward, backward) pass over ``ndev``
        devices: measured, or one tiny all-reduce (its argument agreement) when
        ``agreement``."""
        if ndev <= 1:
            return 0.0, 0.0
        if self.measured_op_s is not None:
            return tuple(self.measured_op_s)
        t = self.allreduce(ndev)(8) if self.agreement else 0.0
        return t, t

    def with_(self, **changes) -> "Machine":
        """A copy with some fields changed (``dataclasses.replace``)."""
        return replace(self, **changes)


GB = 1e9

#: 16 GB V100 SXM2, 4 per node, NVLink 2, two EDR InfiniBand HCAs per node (ABCI-like)
V100_EDR = Machine(
    name="v100-edr", memory_bytes=16 * 2 ** 30, devices_per_node=4,
    peak_flops=15.7e12, bandwidth=0.8 * 900 * GB,
    intra=AlphaBeta(3e-6, 1 / (50 * GB)), inter=AlphaBeta(2e-6, 1 / (2 * 12.5 * GB / 4)),
    conv_efficiency=(0.45, 0.35), dense_efficiency=0.6, launch_s=5e-6, host_op_s=50e-6,
    reserved_bytes=1 * 2 ** 30, conv_half_elems=80 * 2 * 128 * 128,
    io_node_bandwidth=10 * GB, io_aggregate_bandwidth=0.0, io_latency_s=1e-3,
    h2d_bandwidth=12 * GB,
    description="NVIDIA V100 SXM2 16 GB, 4 per node, NVLink 2, 2 x EDR InfiniBand per node",
    sources=("V100 FP32 peak 15.7 TFLOP/s, HBM2 900 GB/s, 16 GB (NVIDIA V100 datasheet)",
             "HBM2 reached by memory-bound kernels: 80% (STREAM-like figures ~720-790 GB/s)",
             "cuDNN 3D convolution FP32: 45% of peak forward, 35% backward (assumption)",
             "NVLink 2: 25 GB/s per link per direction, 2 links between neighbours",
             "EDR InfiniBand 100 Gb/s = 12.5 GB/s per HCA, 2 per node shared by 4 GPUs",
             "latency: 2 us across InfiniBand, 3 us inside the node, 5 us per kernel launch",
             "host side of an op and pass: 50 us (this library's one-rank overhead floor)",
             "1 GB per GPU reserved for the CUDA context and library workspaces (assumption)",
             "convolution half-performance size 2,621,440 output elements per kernel: "
             "CALIBRATED on the seed's CosmoFlow 1.77x (bisection: 2.62e6); it equals one "
             "wave of 128 x 128 output tiles on 80 SMs at 2 resident blocks each",
             "sample read: 10 GB/s per node from the parallel file system (assumption; the "
             "node's 2 x EDR carry 25 GB/s), no shared limit below that (assumption), 1 ms "
             "per sample read (file open, hyperslab; assumption), host to GPU 12 GB/s "
             "(PCIe gen3 x16)"))

#: 80 GB H100 SXM, 8 per node, NVLink 4 (NVSwitch), one NDR InfiniBand HCA per GPU
H100_NDR = Machine(
    name="h100-ndr", memory_bytes=80 * 2 ** 30, devices_per_node=8,
    peak_flops=67e12, bandwidth=0.8 * 3350 * GB,
    intra=AlphaBeta(2.5e-6, 1 / (370 * GB)), inter=AlphaBeta(2e-6, 1 / (50 * GB)),
    conv_efficiency=(0.45, 0.35), dense_efficiency=0.6, launch_s=4e-6, host_op_s=50e-6,
    reserved_bytes=2 * 2 ** 30, conv_half_elems=132 * 2 * 128 * 128,
    io_node_bandwidth=25 * GB, io_aggregate_bandwidth=0.0, io_latency_s=1e-3,
    h2d_bandwidth=50 * GB,
    description="NVIDIA H100 SXM 80 GB, 8 per node, NVLink 4 via NVSwitch, 1 x NDR "
                "InfiniBand per GPU (a prediction: nothing here was measured on it)",
    sources=("H100 SXM FP32 (CUDA cores, no TF32) 67 TFLOP/s, HBM3 3.35 TB/s, 80 GB "
             "(NVIDIA H100 datasheet)",
             "same efficiencies as the V100 description (assumption)",
             "NVLink 4: 900 GB/s per GPU both directions; 370 GB/s one direction reached",
             "NDR InfiniBand 400 Gb/s = 50 GB/s per HCA, one per GPU (DGX H100-like)",
             "2 GB per GPU reserved (assumption)",
             "convolution half-performance size: one wave of 128 x 128 output tiles on 132 "
             "SMs at 2 resident blocks each (the V100 figure's rule; assumption)",
             "sample read: 25 GB/s per node (assumption), 1 ms per sample read, host to GPU "
             "50 GB/s (PCIe gen5 x16)"))

MACHINES = {m.name: m for m in (V100_EDR, H100_NDR)}


def measure_machine(comm, layers=None, input_shape=None, batch: int = 2, *, memory_bytes=None,
                    quick: bool = True, repeats: int = 3, name: str = "here") -> Machine:
    """A :class:`Machine` of the devices of ``comm`` from measurements (collective; the
    same value on every rank): the links (:func:`~.links.measure_links`: point to point as
    both ``intra`` and ``inter``, one node of ``comm.size`` devices, the measured all-reduce
    and per-op cost), and the compute rates fitted to :class:`~.timing.LayerTimer` timings
    of ``layers`` (the model's own, :func:`~disttensor.nn.module.sequential_layers`, or
    :class:`~.layerspec.LayerSpec` descriptions, built small to be timed) on its
    share of ``batch`` samples of ``input_shape`` (``batch / gcd(ranks, batch)`` whole
    samples: the blocks of the sample split) timed on every rank at once (ranks sharing
    cores measure the speed they get): the per-op host cost ``host_op_s`` is the ``alpha``
    of ``t = alpha + beta * bytes`` fitted to the memory-bound layers
    (:meth:`~.links.AlphaBeta.fit`); each rate (convolution flops forward and
    backward, memory-bound bytes, linear-layer flops) is the kind's total work over its total
    time less ``host_op_s`` per layer (large layers weigh by their time, as in a step).
    ``memory_bytes``: per device (default: physical memory / ranks).  Without ``layers``,
    a small CosmoFlow (widths 8, 16, 32 on 32^3 x 4, dense 32) calibrates the rates."""
    import os
    import numpy as np
    from .geometry import analyze_layers, timing_layer
    from .links import measure_links
    from .timing import LayerTimer
    if layers is None:
        from ..models import cosmoflow
        from ..module import sequential_layers
        layers = sequential_layers(cosmoflow(input_size=32, in_channels=4, widths=(8, 16, 32),
                                             dense=(32,), outputs=4,
                                             rng=np.random.default_rng(0)))
        input_shape = (4, 32, 32, 32)
    links = measure_links(comm, quick=quick)
    share = math.gcd(comm.size, batch)     # each rank times its share of the batch
    geoms = analyze_layers(layers, input_shape, batch, (share, 1, 1, 1))
    timer = LayerTimer(comm, np.float32, "cpu", repeats=repeats, warmup=1)
    from .layerspec import LayerSpec, materialize
    real = [materialize(l) if isinstance(l, LayerSpec) else l for l in layers]
    jobs = [(timing_layer(r, g), g.time_shape, i > 0)
            for i, (r, g) in enumerate(zip(real, geoms)) if r is not None]
    measured = iter(timer.time_all(jobs))
    times = [next(measured) if r is not None else (0.0, 0.0) for r in real]
    if memory_bytes is None:
        memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / comm.size
    pairs = {}   # (kind, pass) -> ([work units], [seconds]); units: flops, else bytes
    for i, (l, g, ts, r) in enumerate(zip(layers, geoms, times, real)):
        w = Machine.layer_work(l, g, i > 0)
        if w is None or r is None:
            continue
        kind, *passes = w
        for j, ((flops, nbytes, _), t) in enumerate(zip(passes, ts)):
            key = (kind, j if kind == "conv" else 0)
            pairs.setdefault(key, ([], []))
            pairs[key][0].append(flops or nbytes)
            pairs[key][1].append(t)

    def per_unit(key, host):
        """Seconds per unit of a kind: its total time less ``host`` per layer, over its
        total work (large layers weigh by their time, as in a step)."""
        n, t = pairs.get(key, ([], []))
        rest = sum(t) - host * len(t)
        return rest / sum(n) if n and sum(n) > 0 and rest > 0 else None
    n_mem, t_mem = pairs.get(("memory", 0), ([], []))
    host = AlphaBeta.fit(n_mem, t_mem).alpha if len(set(n_mem)) >= 2 else 0.0
    mem_beta = per_unit(("memory", 0), host)
    conv = [per_unit(("conv", j), host) for j in (0, 1)]
    dense_beta = per_unit(("dense", 0), host)
    bw = 1.0 / mem_beta if mem_beta else 1e10
    rates = [1.0 / b if b else 1e10 for b in conv]
    peak = max(rates)
    dense = (1.0 / dense_beta / peak) if dense_beta else 1.0
    return Machine(name, float(memory_bytes), comm.size, peak, bw, links.p2p, links.p2p,
                   conv_efficiency=(rates[0] / peak, rates[1] / peak),
                   dense_efficiency=min(dense, 1.0), launch_s=0.0, host_op_s=host,
                   conv_roofline=False,
                   measured_allreduce=links.allreduce if comm.size > 1 else None,
                   measured_op_s=(links.op_forward_s, links.op_backward_s),
                   description=f"this machine, {comm.size} ranks, measured",
                   sources=("links, all-reduce and per-op cost: measure_links",
                            "compute rates: LayerTimer on the model's one-rank problem"))
