"""The performance model's pure parts (no MPI communication): grid enumeration, layer geometry
and halo bytes from the window math, the alpha-beta fit, bucket packing, the overlapped
all-reduce and summation formulas, and the memory estimate."""
from __future__ import annotations

import math

import numpy as np
import pytest

from disttensor import nn
from disttensor.nn.perfmodel import (AlphaBeta, InvalidGrid, LayerGeometry, LinkModel,
                                     allreduce_exposed, analyze_layers, buckets_of,
                                     enumerate_grids, estimate_memory, predict_grid,
                                     timing_layer)


def cosmo(size=32, widths=(8, 16, 32), dense=(32, 16)):
    return nn.models.cosmoflow(input_size=size, in_channels=4, widths=widths, dense=dense,
                               outputs=4, rng=np.random.default_rng(0))


def layers_of(model):
    return nn.sequential_layers(model)


# -- grids ---------------------------------------------------------------------------------
def test_enumerate_grids_cube_symmetric():
    assert set(enumerate_grids(4, 4, (32, 32, 32))) == {
        (4, 1, 1, 1), (2, 2, 1, 1), (1, 4, 1, 1), (1, 2, 2, 1)}
    # fastest-first order of the listing: sample axis descending
    assert enumerate_grids(4, 4, (32, 32, 32))[0] == (4, 1, 1, 1)


def test_enumerate_grids_all_permutations_and_batch():
    full = enumerate_grids(4, 4, (32, 32, 32), symmetric=False)
    assert len(full) == 1 + 3 + 6 and len(set(full)) == len(full)
    assert all(math.prod(g) == 4 for g in full)
    # a batch of 2 excludes the 4-rank sample axis; odd batch: only s = 1
    assert all(g[0] != 4 for g in enumerate_grids(4, 2, (32,) * 3, symmetric=False))
    assert {g[0] for g in enumerate_grids(4, 3, (32,) * 3)} == {1}
    # non-cubic samples: every permutation is a different grid
    assert set(enumerate_grids(2, 1, (32, 16, 8))) == {(1, 2, 1, 1), (1, 1, 2, 1),
                                                       (1, 1, 1, 2)}
    # more ranks than cells along an axis
    assert (1, 1, 1, 4) not in enumerate_grids(4, 1, (8, 8, 2), symmetric=False)
    with pytest.raises(ValueError):
        enumerate_grids(0, 4, (8, 8, 8))


# -- geometry ------------------------------------------------------------------------------
def test_conv_halo_bytes_and_pieces():
    layers = layers_of(cosmo())
    b, C, it = 4, 4, 4
    g = analyze_layers(layers, (4, 32, 32, 32), 4, (1, 4, 1, 1))[0]
    # an inner block along depth receives one 32x32 face on each side
    assert g.kind == "window" and g.halo_bytes == 2 * 32 * 32 * b * C * it
    # its local problem: the read window (8 cells + the halo) padded only across the
    # unsplit axes (global boundaries)
    assert g.halo_pieces == 2 and g.time_shape == (4, 4, 10, 32, 32)
    assert g.time_pads == ((0, 0), (1, 1), (1, 1))
    clone = timing_layer(layers[0], g)
    assert clone is not layers[0] and clone.padding == g.time_pads
    assert clone.weight is layers[0].weight and layers[0].padding == (1, 1, 1)
    g2 = analyze_layers(layers, (4, 32, 32, 32), 4, (1, 2, 1, 1))[0]
    assert g2.halo_bytes == 32 * 32 * b * C * it and g2.halo_pieces == 1
    g3 = analyze_layers(layers, (4, 32, 32, 32), 4, (1, 2, 2, 1))[0]
    # two faces and the edge between them: (16+1)^2 - 16^2 cells per depth row of 32
    assert g3.halo_bytes == ((17 * 17 - 16 * 16) * 32) * b * C * it and g3.halo_pieces == 3
    # pure sample parallelism: no halo, the whole sample, batch / s samples
    g4 = analyze_layers(layers, (4, 32, 32, 32), 4, (4, 1, 1, 1))[0]
    assert g4.halo_bytes == 0 and g4.halo_pieces == 0 and g4.time_shape == (1, 4, 32, 32, 32)
    assert g4.time_pads == ((1, 1),) * 3
    pool = analyze_layers(layers, (4, 32, 32, 32), 4, (1, 2, 1, 1))[2]
    assert pool.time_pads == ((0, 0),) * 3 and timing_layer(layers[2], pool).padding == \
        ((0, 0),) * 3 and layers[2].padding == 0


def test_pool_halo_only_on_odd_blocks():
    layers = layers_of(cosmo())
    even = analyze_layers(layers, (4, 32, 32, 32), 4, (1, 2, 1, 1))
    assert even[2].kind == "window" and even[2].halo_bytes == 0
    # 32 over 3 ranks: blocks 11, 11, 10; the first owns outputs 0..5, reading input 11
    odd = analyze_layers(layers, (4, 32, 32, 32), 1, (1, 3, 1, 1))
    pool = odd[2]
    # halo (0, 1): one 32x32 face of the 8 channels from the upper neighbour
    assert pool.halo_bytes == 32 * 32 * 8 * 4 and pool.halo_pieces == 1
    assert pool.time_shape[2] == 12  # 6 outputs of a k2 s2 window read 12 cells
    # the next conv's input is split by pool ownership: 6, 5, 5; the first block is the
    # slowest: 6 outputs reading 7 cells, padded below only
    assert odd[3].time_shape[2] == 7 and odd[3].time_pads[0] == (1, 0)


def test_flatten_gather_and_dense():
    layers = layers_of(cosmo())
    geo = analyze_layers(layers, (4, 32, 32, 32), 4, (1, 2, 1, 1))
    flat = next(g for g in geo if g.kind == "flatten")
    full = 4 * 32 * 4 * 4 * 4 * 4  # batch x channels x 4^3 x float32
    assert flat.gather_peers == 1 and flat.gather_bytes == full // 2 and flat.out_bytes == full
    dense = [g for g in geo if g.kind == "dense"]
    assert [g.time_shape for g in dense] == [(4, 32 * 64), (4, 32), (4, 16)]
    geo_s = analyze_layers(layers, (4, 32, 32, 32), 4, (2, 1, 1, 1))
    assert next(g for g in geo_s if g.kind == "flatten").gather_bytes == 0


def test_invalid_grids():
    layers = layers_of(cosmo())
    with pytest.raises(InvalidGrid, match="not divisible"):
        analyze_layers(layers, (4, 32, 32, 32), 3, (2, 1, 1, 1))
    # 8^3 with three pooling stages: the last conv sees 2 cells over 4 ranks
    small = layers_of(cosmo(size=8, widths=(2, 3, 4), dense=(4,)))
    with pytest.raises(InvalidGrid, match="too fine"):
        analyze_layers(small, (4, 8, 8, 8), 1, (1, 4, 1, 1))
    analyze_layers(small, (4, 8, 8, 8), 1, (1, 2, 1, 1))  # 2 ranks are fine
    with pytest.raises(InvalidGrid, match="ranks along"):
        analyze_layers(small, (4, 8, 8, 8), 1, (1, 1, 1, 16))


def test_unknown_layer_must_be_last():
    unet = nn.models.unet3d(in_channels=1, classes=2, encoder=((2, 2),), bottom=(2, 2),
                            input_size=8, rng=np.random.default_rng(0))
    geo = analyze_layers(layers_of(unet), (1, 8, 8, 8), 2, (1, 2, 1, 1))
    assert [g.kind for g in geo] == ["opaque"] and geo[0].time_shape == (2, 1, 4, 8, 8)
    # 8 over 3 ranks: blocks of 3, 3, 2; a one-level U-Net needs even extents: timed on 4
    geo3 = analyze_layers(layers_of(unet), (1, 8, 8, 8), 2, (1, 3, 1, 1))
    assert geo3[0].time_shape == (2, 1, 4, 8, 8)
    seq = nn.Sequential(unet, nn.ReLU())
    with pytest.raises(ValueError, match="cannot model"):
        analyze_layers(layers_of(seq), (1, 8, 8, 8), 2, (1, 2, 1, 1))


# -- alpha-beta ----------------------------------------------------------------------------
def test_alpha_beta_fit_recovers_exact_model():
    sizes = [8, 4096, 65536, 1 << 20]
    truth = AlphaBeta(12e-6, 1 / 3e9)
    fit = AlphaBeta.fit(sizes, [truth(n) for n in sizes])
    assert fit.alpha == pytest.approx(12e-6, rel=1e-6)
    assert fit.beta == pytest.approx(1 / 3e9, rel=1e-6)
    assert fit.bandwidth == pytest.approx(3e9, rel=1e-6)
    assert fit(0) == 0.0 and fit(100, messages=3) == pytest.approx(3 * 12e-6 + 100 / 3e9)


def test_alpha_beta_fit_clamps_and_rejects():
    # times falling with size: no negative bandwidth cost
    fit = AlphaBeta.fit([10, 1000, 100000], [3e-5, 2e-5, 1e-5])
    assert fit.beta == 0.0 and 1e-5 <= fit.alpha <= 3e-5
    # pure bandwidth: no negative latency
    fit = AlphaBeta.fit([1000, 2000, 4000], [0.5e-6, 1.1e-6, 2.0e-6])
    assert fit.alpha >= 0.0 and fit.beta > 0
    with pytest.raises(ValueError):
        AlphaBeta.fit([8], [1e-6])
    with pytest.raises(ValueError):
        AlphaBeta.fit([8, 8], [1e-6, 2e-6])


# -- overlap and summation -----------------------------------------------------------------
def test_buckets_of_packs_in_reverse_order():
    # (layer, bytes) per parameter in registration order
    params = [(0, 10), (0, 2), (2, 10), (2, 2)]
    assert buckets_of(params, 12) == [(12, 2), (12, 0)]
    assert buckets_of(params, 100) == [(24, 0)]
    assert buckets_of(params, 1) == [(2, 2), (10, 2), (2, 0), (10, 0)]


def test_allreduce_exposed_formulas():
    two_s = AlphaBeta(0.0, 1.0)  # n bytes take n seconds
    # buckets ready at 1 s and 2 s of a 3 s backward, 0.5 s each: fully hidden
    assert allreduce_exposed([1.0, 2.0], [0.5, 0.5], 3.0, two_s) == 0.0
    # 2 s each: bucket 0 runs 1..3, bucket 1 waits for it, 3..5: 2 s past the end
    assert allreduce_exposed([1.0, 2.0], [2, 2], 3.0, two_s) == pytest.approx(2.0)
    # without overlap all run after backward
    assert allreduce_exposed([1.0, 2.0], [2, 2], 3.0, two_s, overlap=False) == \
        pytest.approx(4.0)
    # one bucket completed by the last layer: nothing overlaps
    assert allreduce_exposed([3.0], [1.5], 3.0, two_s) == pytest.approx(1.5)
    assert allreduce_exposed([], [], 3.0, two_s) == 0.0


def geom(name, kind="window", halo=0, pieces=0, saved=0, inb=0, outb=0, **kw):
    return LayerGeometry(name, kind, (1, 1, 1, 1, 1), inb, outb, halo, pieces,
                         saved_bytes=saved, **kw)


def test_predict_grid_sums_layers_and_halos():
    links = LinkModel(p2p=AlphaBeta(1e-3, 1e-6), allreduce=AlphaBeta(2e-3, 1e-6), nranks=2,
                      op_forward_s=2e-3, op_backward_s=3e-3)
    geoms = [geom("a", halo=1000, pieces=2), geom("b", kind="pointwise")]
    times = [(0.1, 0.2), (0.01, 0.02)]
    # parameters: 500 bytes on layer 0 (one bucket, ready at the end of backward)
    pred = predict_grid((1, 2, 1, 1), geoms, times, links, [(0, 500)], optimizer_s=0.05)
    halo = 2 * 1e-3 + 1000 * 1e-6
    agree = 2e-3
    assert pred.layers[0].comm_forward_s == pytest.approx(halo + agree)
    assert pred.forward_s == pytest.approx(0.1 + 0.01 + halo + 2 * agree)
    assert pred.backward_s == pytest.approx(0.2 + 0.02 + halo + 2 * 3e-3)
    assert pred.allreduce_s == pytest.approx(2e-3 + 500 * 1e-6)
    assert pred.step_s == pytest.approx(pred.forward_s + pred.backward_s + pred.allreduce_s
                                        + 0.05)
    # overlapped halo: max(compute, halo) + the per-op overhead
    ov = predict_grid((1, 2, 1, 1), geoms, times, links, [(0, 500)], halo_overlap=True)
    assert ov.layers[0].forward_s == pytest.approx(max(0.1, halo) + agree)
    slow_link = LinkModel(p2p=AlphaBeta(1.0, 0.0), allreduce=AlphaBeta(), nranks=2)
    ov2 = predict_grid((1, 2, 1, 1), geoms, times, slow_link, [(0, 500)], halo_overlap=True)
    assert ov2.layers[0].forward_s == pytest.approx(2.0)  # the exchange dominates
    # one rank: no communication at all
    one = predict_grid((1, 1, 1, 1), [geom("a"), geom("b", kind="pointwise")], times,
                       LinkModel(op_forward_s=1.0), [(0, 500)])
    assert one.step_s == pytest.approx(sum(f + b for f, b in times))


def test_predict_grid_batch_norm_allreduces():
    links = LinkModel(allreduce=AlphaBeta(1e-3, 0.0), nranks=2, op_forward_s=1e-4,
                      op_backward_s=2e-4)
    bn = geom("bn", kind="pointwise", allreduces=2)
    pred = predict_grid((2, 1, 1, 1), [bn], [(0.5, 0.5)], links, [])
    assert pred.forward_s == pytest.approx(0.5 + 1e-4 + 2e-3)
    assert pred.backward_s == pytest.approx(0.5 + 2e-4 + 2e-3)


def test_predict_grid_flatten_gather():
    links = LinkModel(p2p=AlphaBeta(1e-3, 1e-6), allreduce=AlphaBeta(), nranks=4)
    g = geom("f", kind="flatten", gather_bytes=3000, gather_peers=3)
    pred = predict_grid((1, 4, 1, 1), [g], [(0.0, 0.0)], links, [])  # no op overhead
    assert pred.forward_s == pytest.approx(3 * 1e-3 + 3000 * 1e-6)
    assert pred.backward_s == 0.0


def test_estimate_memory():
    geoms = [geom("a", saved=100, inb=100, outb=50), geom("b", saved=40, inb=40, outb=40)]
    m = estimate_memory(geoms, param_bytes=1000, optimizer_state=2.0)
    assert m == {"params": 3000, "optimizer": 2000, "activations": 140, "workspace": 150,
                 "total": 5290}
    # spatial splits shrink the activations of a real model, parameters stay
    layers = layers_of(cosmo())
    pbytes = sum(p.data.nbytes for p in cosmo().parameters())
    one = estimate_memory(analyze_layers(layers, (4, 32, 32, 32), 4, (1, 1, 1, 1)), pbytes)
    four = estimate_memory(analyze_layers(layers, (4, 32, 32, 32), 4, (1, 4, 1, 1)), pbytes)
    assert four["params"] == one["params"]
    assert 0.25 < four["activations"] / one["activations"] < 0.4  # a quarter plus halos
