"""The scaling simulator's pure parts (no MPI): layer descriptions against the real models,
memory per device against a hand count, the machine's compute and link models, grid
enumeration at 2,048 devices, memory exclusion, and ``python -m disttensor.plan``."""
from __future__ import annotations

import io
import itertools
import math

import numpy as np
import pytest

from disttensor import nn
from disttensor.nn.perfmodel import analyze_layers, enumerate_grids
from disttensor.nn.perfmodel.geometry import layer_param_bytes
from disttensor.nn.perfmodel.layerspec import (LayerSpec, cosmoflow_layers,
                                               cosmoflow_sample_bytes, materialize,
                                               spec_param_bytes, unet_layers, unet_sample_bytes)
from disttensor.nn.perfmodel.links import AlphaBeta
from disttensor.nn.perfmodel.machine import H100_NDR, V100_EDR, Machine
from disttensor.nn.perfmodel.simulate import simulate, simulate_grid, speedup
from disttensor.plan import main

CF512 = cosmoflow_layers(512, 4, (16, 32, 64, 128, 256, 256, 256), (2048, 256), 4)


# -- layer descriptions ------------------------------------------------------------------------
@pytest.mark.parametrize("grid", [(1, 1, 1, 1), (2, 2, 1, 1), (1, 1, 3, 1)])
def test_cosmoflow_spec_matches_the_model(grid):
    kw = dict(in_channels=4, widths=(4, 8), dense=(8,), outputs=4)
    real = nn.sequential_layers(nn.models.cosmoflow(input_size=16, rng=np.random.default_rng(0),
                                                    **kw))
    spec = cosmoflow_layers(16, **kw)
    assert [layer_param_bytes(l) for l in spec] == [layer_param_bytes(l) for l in real]
    a = analyze_layers(real, (4, 16, 16, 16), 2, grid)
    b = analyze_layers(spec, (4, 16, 16, 16), 2, grid)
    assert a == b


def test_unet_spec_parameters_and_shapes():
    enc, bottom = ((2, 4), (4, 8)), (8, 16)
    real = nn.models.unet3d(in_channels=1, classes=2, encoder=enc, bottom=bottom,
                            rng=np.random.default_rng(0))
    spec = unet_layers(1, 2, enc, bottom)
    assert spec_param_bytes(spec) == sum(p.data.nbytes for p in real.parameters())
    g = analyze_layers(spec, (1, 16, 16, 16), 2, (1, 2, 1, 1))
    kinds = [x.kind for x in g]
    assert kinds.count("upsample") == 2 and kinds.count("concat") == 2
    up = g[kinds.index("upsample")]
    # the bottom's 16 channels at 4^3 (half of it per rank) become 16 channels at 8^3
    assert up.in_bytes == 2 * 16 * 2 * 4 * 4 * 4 and up.out_bytes == 8 * up.in_bytes
    assert up.halo_bytes == 0
    cat = g[kinds.index("concat")]
    assert cat.out_bytes == cat.in_bytes * (16 + 8) // 16
    # the output: 2 classes on the rank's half of 16^3
    assert g[-1].out_bytes == 2 * 2 * 8 * 16 * 16 * 4


def test_materialize_builds_the_described_layers():
    for layers in (cosmoflow_layers(16, 4, (4, 8), (8,), 4),
                   unet_layers(1, 2, ((2, 4), (4, 8)), (8, 16))):
        for spec in layers:
            real = materialize(spec)
            if spec.layer_type == "Concat":
                assert real is None
                continue
            assert type(real).__name__ == spec.layer_type
            assert layer_param_bytes(real) == spec.param_bytes


def test_transposed_conv_with_overlap_stays_opaque():
    layers = [LayerSpec("ConvTranspose3d", 2, 2, (3,) * 3, (2,) * 3)]
    assert analyze_layers(layers, (2, 8, 8, 8), 1, (1, 1, 1, 1))[0].kind == "opaque"


# -- memory ------------------------------------------------------------------------------------
def test_memory_per_device_hand_count():
    layers = [LayerSpec("Conv3d", 1, 2, (3,) * 3, (1,) * 3, (1,) * 3, params=1 * 2 * 27 + 2),
              LayerSpec("LeakyReLU"), LayerSpec("Flatten"),
              LayerSpec("Linear", in_features=2 * 64, out_features=3, params=128 * 3 + 3)]
    p = simulate_grid(layers, (1, 4, 4, 4), 2, (1, 1, 1, 1), V100_EDR, optimizer="adam")
    pb = 4 * (56 + 387)
    saved = 2 * 64 * 4 * (1 + 2 + 2)          # conv input, activation input, linear input
    work = 2 * 2 * 64 * 4 * 2                 # the largest input + output (activation, flatten)
    assert p.memory == {"params": 3 * pb, "optimizer": 2 * pb, "activations": saved,
                        "workspace": work, "total": 5 * pb + saved + work}


def test_cosmoflow_512_needs_spatial_splits_on_16_gb():
    one = simulate(CF512, (4, 512, 512, 512), 1, 1, V100_EDR)
    assert not one.ranked and "memory" in one.excluded[0][1]
    eight = simulate(CF512, (4, 512, 512, 512), 1, 8, V100_EDR)
    assert eight.ranked and all(math.prod(p.grid[1:]) == 8 for p in eight.ranked)
    assert all(p.memory["total"] <= V100_EDR.usable_bytes for p in eight.ranked)
    # 80 GB holds the whole sample
    assert simulate(CF512, (4, 512, 512, 512), 1, 1, H100_NDR).ranked


# -- grids -------------------------------------------------------------------------------------
def test_grid_enumeration_at_2048_devices():
    grids = enumerate_grids(2048, 64, (512, 512, 512))
    brute = {(s, d, h, w) for s, d, h, w in itertools.product(
        [2 ** k for k in range(12)], repeat=4)
        if s * d * h * w == 2048 and 64 % s == 0 and 512 >= d >= h >= w}
    assert set(grids) == brute and len(grids) == len(brute)
    plan = simulate(CF512, (4, 512, 512, 512), 64, 2048, V100_EDR)
    assert len(plan.ranked) + len(plan.excluded) == len(grids)
    steps = [p.step_s for p in plan.ranked]
    assert steps == sorted(steps) and plan.ranked
    # a split finer than a deep layer's extent is invalid, not ranked
    assert any("too fine" in why or "ranks along" in why for _, why in plan.excluded)


# -- machine model -----------------------------------------------------------------------------
def test_machine_monotonic_properties():
    layers, shape = cosmoflow_layers(64, 4, (8, 16, 32), (32,), 4), (4, 64, 64, 64)
    base = simulate_grid(layers, shape, 8, (2, 2, 2, 1), V100_EDR).step_s
    faster = V100_EDR.with_(peak_flops=2 * V100_EDR.peak_flops,
                            bandwidth=2 * V100_EDR.bandwidth)
    assert simulate_grid(layers, shape, 8, (2, 2, 2, 1), faster).step_s < base
    slow_net = V100_EDR.with_(inter=AlphaBeta(1e-4, 1e-8))
    assert simulate_grid(layers, shape, 8, (2, 2, 2, 1), slow_net).step_s > base
    assert simulate_grid(layers, shape, 8, (2, 2, 2, 1), V100_EDR,
                         halo_overlap=False).step_s >= base
    # strong scaling is never superlinear
    s8 = simulate(layers, shape, 8, 8, V100_EDR).best.step_s
    s32 = simulate(layers, shape, 8, 32, V100_EDR).best.step_s
    assert s8 < 4 * s32
    # all-reduce: grows with bytes and devices; inside a node it uses the intra link only
    ar = [V100_EDR.allreduce(n)(1e8) for n in (2, 4, 8, 64, 2048)]
    assert ar == sorted(ar) and V100_EDR.allreduce(1)(1e8) == 0
    assert V100_EDR.allreduce(4)(1e8) == pytest.approx(2 * 3 / 4 * 1e8 * V100_EDR.intra.beta
                                                       + 6 * V100_EDR.intra.alpha)
    assert V100_EDR.halo_link((64, 2, 2, 1)) is V100_EDR.intra
    assert V100_EDR.halo_link((64, 2, 2, 2)) is V100_EDR.inter


def test_conv_time_from_flops_and_roofline():
    m = Machine("t", 1e9, 1, 1e12, 1e11, AlphaBeta(), AlphaBeta(), conv_efficiency=(0.5, 0.25),
                launch_s=0.0)
    layers = [LayerSpec("Conv3d", 4, 8, (3,) * 3, (1,) * 3, (1,) * 3, params=4 * 8 * 27 + 8)]
    g = analyze_layers(layers, (4, 8, 8, 8), 1, (1, 1, 1, 1))[0]
    flops = 2 * 4 * 27 * 8 * 512
    f, b = m.layer_times(layers[0], g, input_grad=True)
    assert f == pytest.approx(flops / 0.5e12) and b == pytest.approx(2 * flops / 0.25e12)
    assert m.layer_times(layers[0], g, input_grad=False)[1] == pytest.approx(flops / 0.25e12)
    starved = m.with_(bandwidth=1e3)
    assert starved.layer_times(layers[0], g)[0] == pytest.approx(
        (g.in_bytes + g.out_bytes + g.param_bytes) / 1e3)
    with pytest.raises(ValueError, match="positive"):
        Machine("bad", 0, 1, 1, 1, AlphaBeta(), AlphaBeta())


# -- kernel efficiency and sample I/O ----------------------------------------------------------
def test_conv_half_performance_size():
    """Hockney: a kernel on n output elements runs at rate * n / (n + n_half)."""
    m = Machine("t", 1e9, 1, 1e12, 1e15, AlphaBeta(), AlphaBeta(), conv_efficiency=(0.5, 0.25),
                launch_s=0.0)
    layers = [LayerSpec("Conv3d", 4, 8, (3,) * 3, (1,) * 3, (1,) * 3, params=4 * 8 * 27 + 8)]
    g = analyze_layers(layers, (4, 8, 8, 8), 1, (1, 1, 1, 1))[0]
    n = 8 * 512                                  # output elements
    f0, b0 = m.layer_times(layers[0], g)
    f1, b1 = m.with_(conv_half_elems=n).layer_times(layers[0], g)
    assert f1 == pytest.approx(2 * f0) and b1 == pytest.approx(2 * b0)
    f3, _ = m.with_(conv_half_elems=3 * n).layer_times(layers[0], g)
    assert f3 == pytest.approx(4 * f0)
    # thinner blocks: the same global layer costs more in total over the devices
    g2 = analyze_layers(layers, (4, 8, 8, 8), 1, (1, 2, 1, 1))[0]
    f2, _ = m.with_(conv_half_elems=n).layer_times(layers[0], g2)
    assert f2 == pytest.approx(f0 / 2 * (n / 2 + n) / (n / 2))


def test_sample_io_time_hand_count():
    m = Machine("t", 1e9, 4, 1e12, 1e11, AlphaBeta(), AlphaBeta(), io_node_bandwidth=1e9,
                io_latency_s=1e-3, h2d_bandwidth=2e9)
    # 8 samples of 1 GB on 16 devices, 4 sample groups of 4: each device reads a quarter of 2
    dev = 2 * 1e9 / 4
    assert m.io_time((4, 2, 2, 1), 8, 1e9) == pytest.approx(4 * dev / 1e9 + dev / 2e9 + 2e-3)
    # without the spatially partitioned reader each device reads its 2 samples whole
    assert m.io_time((4, 2, 2, 1), 8, 1e9, spatial=False) == pytest.approx(
        4 * 2e9 / 1e9 + 2e9 / 2e9 + 2e-3)
    # a shared file-system limit binds when it is below the nodes' sum
    shared = m.with_(io_aggregate_bandwidth=2e9)
    assert shared.io_time((4, 2, 2, 1), 8, 1e9) == pytest.approx(8e9 / 2e9 + dev / 2e9 + 2e-3)
    assert m.with_(io_node_bandwidth=0.0).io_time((4, 2, 2, 1), 8, 1e9) == 0.0
    # prefetched: only the part over the step is exposed
    layers, shape = cosmoflow_layers(16, 4, (4,), (8,), 4), (4, 16, 16, 16)
    base = simulate_grid(layers, shape, 2, (2, 1, 1, 1), V100_EDR)
    small = simulate_grid(layers, shape, 2, (2, 1, 1, 1), V100_EDR, sample_bytes=1e3)
    assert small.step_s == base.step_s and small.io_s == 0
    big = simulate_grid(layers, shape, 2, (2, 1, 1, 1), V100_EDR, sample_bytes=1e10)
    io = V100_EDR.io_time((2, 1, 1, 1), 2, 1e10)
    assert big.step_s == pytest.approx(io) and big.io_s == pytest.approx(io - base.step_s)


# -- the seed's published speedups -------------------------------------------------------------
SEEDS = {"cosmoflow": (CF512, (4, 512, 512, 512), 64, 512, 2048, 1.77),
         "unet": (unet_layers(1, 3), (1, 256, 256, 256), 16, 256, 512, 1.42)}


def _seed(name, machine=V100_EDR, **kw):
    layers, shape, batch, a, b, _ = SEEDS[name]
    nbytes = (cosmoflow_sample_bytes if name == "cosmoflow" else unet_sample_bytes)(shape)
    return speedup(layers, shape, batch, a, b, machine, sample_bytes=nbytes, **kw)


def test_seed_speedup_cosmoflow_calibrated():
    """Oyama: 1.77x from 512 to 2,048 V100s (CosmoFlow 512^3, batch 64).  The V100
    description's ``conv_half_elems`` was calibrated on this figure: held here, with the
    kernel-size effect as what brings it down from about 3x."""
    r, pa, pb = _seed("cosmoflow")
    assert abs(r / 1.77 - 1) < 0.03
    assert math.prod(pa.best.grid) == 512 and math.prod(pb.best.grid) == 2048
    # on the same grids: without the kernel-size effect about 3x; without the spatially
    # partitioned reader the step is bound by reading whole samples
    layers, shape, batch, *_ = SEEDS["cosmoflow"]
    nbytes = cosmoflow_sample_bytes(shape)

    def step(grid, machine=V100_EDR, **kw):
        return simulate_grid(layers, shape, batch, grid, machine, sample_bytes=nbytes, **kw)
    ga, gb = pa.best.grid, pb.best.grid
    flat = V100_EDR.with_(conv_half_elems=0.0)
    assert step(ga, flat).step_s / step(gb, flat).step_s > 2.5
    sa, sb = step(ga, spatial_io=False), step(gb, spatial_io=False)
    assert sa.step_s / sb.step_s < 1.1 and sa.io_s > 0 and sb.io_s > 0


def test_seed_speedup_unet_predicted():
    """Oyama: 1.42x from 256 to 512 V100s (3D U-Net 256^3, batch 16).  Nothing was fitted
    to this figure: the prediction must be within 25%, and sub-linear."""
    r, pa, pb = _seed("unet")
    assert abs(r / 1.42 - 1) < 0.25
    assert 1 < r < 2


# -- the command line --------------------------------------------------------------------------
def test_plan_cli_prints_a_ranking():
    out = io.StringIO()
    rc = main(["--model", "unet", "--size", "32", "--batch", "2", "--gpus", "4,8", "--top",
               "2", "--widths", "8,16,32"], out=out)
    text = out.getvalue()
    assert rc == 0
    assert text.count("  rank  grid") == 2 and "speedup 4 -> 8 devices" in text
    assert "     1  " in text and "... " in text


@pytest.mark.parametrize("argv, msg", [
    (["--gpus", "0"], "--gpus must be positive"),
    (["--gpus", "a,b"], "--gpus must be comma-separated"),
    (["--model", "unet", "--size", "100"], "divisible by 8"),
    (["--machine", "tpu"], "invalid choice"),
    (["--batch", "0"], "--batch must be a positive"),
])
def test_plan_cli_bad_arguments(argv, msg, capsys):
    assert main(argv) == 2
    assert msg in capsys.readouterr().err
