"""CosmoFlow and the 3D U-Net on process grids against the same model on one rank.

The reference is the same model (same seed, so the same weights) run on a ``(1, 1, 1, 1)``
grid over ``MPI.COMM_SELF`` on every rank.  On sample-only, spatial-only, hybrid grids, with
uneven blocks (3 ranks along an 8-wide axis, explicit sizes with an empty input block) and
with blocks smaller than a halo or empty in the deeper layers, with no wrapper, with
:class:`~disttensor.nn.DistributedDataParallel` (small buckets, overlap on and off) and with a
backward through the bare module of a wrapped model: the loss, every parameter gradient (to
1e-10 of that gradient's largest entry), the batch-norm running statistics after the training
forward, and the inference output afterwards equal the reference.

Also: ``check_replicas`` / ``DistributedDataParallel`` raise on every rank naming the
parameter or buffer that differs; ``state_dict`` names and shapes follow PyTorch's scheme and
``load_state_dict`` round-trips; model input checks; and (4 ranks) the peak activation memory
per rank of a forward + backward on a ``(1, 2, 2, 1)`` grid against one rank (tracemalloc).
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from disttensor.autograd import Tensor, no_grad
from disttensor.nn import DistributedDataParallel, check_replicas
from disttensor.nn import functional as F
from disttensor.nn.models import CosmoFlow, UNet3D

from checks import COMM, SIZE, expect, grid
from conftest import assert_all_ranks, assert_raises_all
from gradchecks import close, guarded, rel_err, self_grid

N = 4          # samples per batch
TOL = 1e-10    # relative to the largest entry of each reference gradient


# -- models and data ---------------------------------------------------------------------------
def cosmoflow(seed: int = 1, input_size=8, dtype="float64"):
    return CosmoFlow(input_size=input_size, in_channels=2, widths=(3, 4), dense=(5,),
                     outputs=3, dtype=dtype, rng=np.random.default_rng(seed))


def unet(seed: int = 1, dtype="float64"):
    return UNet3D(in_channels=2, classes=3, encoder=((2, 3), (3, 4)), bottom=(4, 4),
                  dtype=dtype, rng=np.random.default_rng(seed))


MODELS = {"cosmoflow": cosmoflow, "unet": unet}


def batch(model: str, spatial, seed: int = 0):
    """Global ``(x, y)``: inputs ``(N, 2, *spatial)`` and targets ``(N, 3)`` (CosmoFlow) or
    labels ``(N, *spatial)`` in ``[0, 3)`` (U-Net)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, 2, *spatial))
    if model == "cosmoflow":
        return x, rng.standard_normal((N, 3)) * 0.5
    return x, rng.integers(0, 3, (N, *spatial))


def distribute(model: str, x, y, g: dt.ProcessGrid, sizes=None):
    """``x`` split ``(0, None, 1, 2, 3)`` over the 4-d grid ``g`` (``sizes``: explicit
    per-axis sizes of x or None), targets split along the samples (and labels like x)."""
    xd = dt.from_global(x, grid=g, split=(0, None, 1, 2, 3),
                        sizes=None if sizes is None else list(sizes))
    if model == "cosmoflow":
        yd = dt.from_global(y, grid=g, split=(0, None),
                            sizes=None if sizes is None else [sizes[0], None])
    else:
        yd = dt.from_global(y, grid=g, split=(0, 1, 2, 3),
                            sizes=None if sizes is None else [sizes[0], *sizes[2:]])
    return Tensor(xd), Tensor(yd)


def loss_of(model: str, out, y):
    return F.mse_loss(out, y) if model == "cosmoflow" else F.cross_entropy(out, y)


def train_pass(model: str, net, m, x, y):
    """One training forward + backward of ``net`` (``m`` the bare module); returns the loss,
    the gradients by name, the buffers by name (copies) and the inference output after."""
    m.train()
    m.zero_grad()
    loss = loss_of(model, net(x), y)
    loss.backward()
    grads = {n: (None if p.grad is None else np.array(p.grad)) for n, p in m.named_parameters()}
    buffers = {n: np.array(b) for n, b in m.named_buffers()}
    m.eval()
    with no_grad():
        out = m(x).numpy()
    m.train()
    return loss.item(), grads, buffers, out


_REFERENCE: dict = {}


def reference(model: str, spatial):
    """The one-rank result for ``model`` on the batch of ``spatial`` (computed once)."""
    key = (model, tuple(spatial))
    if key not in _REFERENCE:
        m = MODELS[model](input_size=spatial) if model == "cosmoflow" else MODELS[model]()
        x, y = batch(model, spatial)
        xt, yt = distribute(model, x, y, self_grid())
        _REFERENCE[key] = train_pass(model, m, m, xt, yt)
    return _REFERENCE[key]


# -- the grids ---------------------------------------------------------------------------------
def _configs():
    """id -> (grid dims, spatial size, explicit sizes of x or None, models), for this SIZE."""
    n = SIZE
    both = ("cosmoflow", "unet")
    out = {}
    if n == 1:
        out["one"] = ((1, 1, 1, 1), (8, 8, 8), None, both)
        return out
    out[f"sample{n}"] = ((n, 1, 1, 1), (8, 8, 8), None, both)
    out[f"depth{n}"] = ((1, n, 1, 1), (8, 8, 8), None, both)      # n = 3: blocks 3, 3, 2
    out[f"height{n}"] = ((1, 1, n, 1), (8, 8, 8), None, both)
    # explicit uneven depth blocks, an empty one from 3 ranks on
    d = {2: (6, 2), 3: (1, 0, 7), 4: (3, 0, 4, 1)}[n]
    out[f"depth{n}-uneven"] = ((1, n, 1, 1), (8, 8, 8), (None, None, d, None, None), both)
    # CosmoFlow on a 6-deep sample: after the pools 3 and 1 deep, blocks of 1 voxel or none
    out[f"depth{n}-tiny"] = ((1, n, 1, 1), (6, 8, 8), None, ("cosmoflow",))
    if n == 4:
        out["depth2-height2"] = ((1, 2, 2, 1), (8, 8, 8), None, both)
        out["sample2-depth2"] = ((2, 2, 1, 1), (8, 8, 8), None, both)
        out["sample2-height2"] = ((2, 1, 2, 1), (8, 8, 8), None, both)
        out["sample2-width2-uneven"] = ((2, 1, 1, 2), (8, 8, 8),
                                        ((3, 1), None, None, None, (5, 3)), both)
    return out


CONFIGS = _configs()
CASES = [(model, cid) for cid, (_, _, _, models) in CONFIGS.items() for model in models]
MODES = ("plain", "ddp", "ddp-sync", "ddp-bare")


def compare(what, got, want, check_grads=True):
    loss, grads, buffers, out = got
    rloss, rgrads, rbuffers, rout = want
    close(loss, rloss, f"{what}: loss", rtol=TOL, atol=0)
    if check_grads:
        expect(sorted(grads) == sorted(rgrads), f"{what}: parameters {sorted(grads)}")
        for name, rg in rgrads.items():
            g = grads.get(name)
            if g is None:
                expect(False, f"{what}: no gradient for {name}")
                continue
            err = rel_err(g, rg)
            expect(err <= TOL, f"{what}: gradient of {name}: relative error {err:.3g}")
    for name, rb in rbuffers.items():
        b = buffers.get(name)
        expect(b is not None and rel_err(b, rb) <= TOL,
               f"{what}: buffer {name} {b} != reference {rb}")
    err = rel_err(out, rout)
    expect(err <= TOL, f"{what}: inference output after training: relative error {err:.3g}")


@pytest.mark.parametrize("model,cid", CASES, ids=[f"{m}-{c}" for m, c in CASES])
@guarded
def test_model_matches_one_rank(model, cid):
    dims, spatial, sizes, _ = CONFIGS[cid]
    want = reference(model, spatial)
    x, y = batch(model, spatial)
    g = grid(dims)
    xt, yt = distribute(model, x, y, g, sizes)
    for mode in MODES:
        m = MODELS[model](input_size=spatial) if model == "cosmoflow" else MODELS[model]()
        net = m
        if mode != "plain":
            net = DistributedDataParallel(m, g, bucket_bytes=512, overlap=mode != "ddp-sync")
            expect(len(net.reducer.buckets) > 1, f"{mode}: {len(net.reducer.buckets)} bucket")
        try:
            got = train_pass(model, m if mode == "ddp-bare" else net, m, xt, yt)
            compare(f"{model} on {dims} sizes={sizes} [{mode}]", got, want)
            if mode == "ddp":  # a second pass: the reducer's buckets start clean again (a
                # training forward normalizes with the batch statistics: the same loss and
                # gradients as the first pass)
                loss2, grads2, _, _ = train_pass(model, net, m, xt, yt)
                close(loss2, want[0], f"{model} [{mode}] second pass loss", rtol=TOL, atol=0)
                for name, rg in want[1].items():
                    err = rel_err(grads2[name], rg)
                    expect(err <= TOL, f"{model} [{mode}] second pass gradient of {name}: "
                                       f"relative error {err:.3g}")
        finally:
            if mode != "plain":
                net.reducer.release()


@guarded
def test_ddp_parameters_backward_does_not_reach():
    """A backward that reaches only part of a wrapped model (a loss on the features of
    CosmoFlow, after a full pass): the features' gradients equal the reference's, the head's
    stay None after zero_grad (no rank had a gradient for them: the reducer leaves them, as
    PyTorch's DDP), not left over from the previous pass."""
    spatial = (8, 8, 8)
    dims = (1, SIZE, 1, 1) if SIZE != 4 else (2, 2, 1, 1)
    x, y = batch("cosmoflow", spatial)
    r = np.random.default_rng(5).standard_normal((N, 4, 2, 2, 2))

    def features_loss(m, g):
        xt, _ = distribute("cosmoflow", x, y, g)
        out = m.features(xt)
        rt = Tensor(dt.from_global(r, grid=g, split=out.data.split,
                                   sizes=out.data.distribution.split_sizes))
        return (out * rt).sum()

    ref = cosmoflow()
    features_loss(ref, self_grid()).backward()
    m = cosmoflow()
    g = grid(dims)
    ddp = DistributedDataParallel(m, g, bucket_bytes=256)
    try:
        xt, yt = distribute("cosmoflow", x, y, g)
        loss_of("cosmoflow", ddp(xt), yt).backward()
        m.zero_grad()
        features_loss(m, g).backward()  # through the bare module
        for name, p in m.named_parameters():
            if name.startswith("features"):
                err = rel_err(p.grad, dict(ref.named_parameters())[name].grad)
                expect(err <= TOL, f"gradient of {name}: relative error {err:.3g}")
            else:
                expect(p.grad is None,
                       f"{name}: gradient {p.grad} of a parameter backward did not reach")
    finally:
        ddp.reducer.release()


# -- replicas ----------------------------------------------------------------------------------
needs_two = pytest.mark.skipif(SIZE < 2, reason="needs at least 2 ranks")


@needs_two
@pytest.mark.parametrize("model,name", [("cosmoflow", "features.3.weight"),
                                        ("cosmoflow", "head.1.bias"),
                                        ("unet", "dec.1.0.0.weight"),
                                        ("unet", "down.0.0.1.running_mean")])
def test_check_replicas_names_the_difference(model, name):
    g = grid((1, SIZE, 1, 1))
    m = MODELS[model]()
    check_replicas(m, g.cart)  # identical: no error
    DistributedDataParallel(m, g).reducer.release()
    m = MODELS[model]()
    if COMM.rank == SIZE - 1:  # one rank's copy differs in one entry
        arr = m.state_dict()[name]
        arr.reshape(-1)[arr.size // 2] += 1e-9
    pattern = rf"'{name.replace('.', '[.]')}' differs"
    assert_raises_all(COMM, ValueError, pattern, lambda: check_replicas(m, g.cart))
    assert_raises_all(COMM, ValueError, pattern, lambda: check_replicas(m, COMM, "net"))
    assert_raises_all(COMM, ValueError, pattern,
                      lambda: DistributedDataParallel(m, g, bucket_bytes=512))
    # nothing above left the ranks out of step
    assert_all_ranks(COMM, COMM.allreduce(1) == SIZE, "ranks out of step")


@needs_two
def test_check_replicas_different_parameter_sets():
    m = cosmoflow() if COMM.rank else unet()
    assert_raises_all(COMM, ValueError, "different sets", lambda: check_replicas(m, COMM))


@needs_two
def test_check_replicas_debug_reports_the_largest_difference(monkeypatch):
    """DISTTENSOR_DEBUG: every value is compared and the error gives the largest spread."""
    import disttensor.core.agreement as agreement
    monkeypatch.setattr(agreement, "DEBUG", True)
    g = grid((1, SIZE, 1, 1))
    m = cosmoflow()
    check_replicas(m, g.cart)  # identical: no error, also by value
    if COMM.rank == SIZE - 1:
        m.state_dict()["head.1.bias"][0] += 0.25
    assert_raises_all(COMM, ValueError, r"'head[.]1[.]bias' differs .*largest difference "
                      r"between ranks 0[.]25", lambda: check_replicas(m, g.cart))


@needs_two
def test_replicas_rechecked_every_n_forwards(monkeypatch):
    """DISTTENSOR_CHECK_REPLICAS=N: a replica that drifts after construction is caught at the
    N-th training forward, naming the parameter."""
    monkeypatch.setenv("DISTTENSOR_CHECK_REPLICAS", "2")
    g = grid((1, SIZE, 1, 1))
    ddp = DistributedDataParallel(cosmoflow(), g)
    try:
        x = dt.from_global(batch("cosmoflow", (8, 8, 8))[0], grid=g, split=(0, None, 1))
        ddp(Tensor(x))  # forward 1: not checked
        if COMM.rank == SIZE - 1:
            ddp.module.state_dict()["features.0.weight"].reshape(-1)[0] += 1.0
        assert_raises_all(COMM, ValueError, r"'features[.]0[.]weight' differs",
                          lambda: ddp(Tensor(x)))
    finally:
        ddp.reducer.release()


@needs_two
def test_reducer_bucket_layout_must_agree():
    g = grid((SIZE, 1, 1, 1))
    m = cosmoflow()
    bucket = 1024 if COMM.rank == SIZE - 1 else 4096
    assert_raises_all(COMM, ValueError, "GradientReducer: arguments differ between ranks.*"
                      "bucket_bytes", lambda: DistributedDataParallel(m, g, bucket_bytes=bucket))


def test_ddp_rejects_non_module():
    g = grid((SIZE, 1, 1, 1))
    assert_raises_all(COMM, TypeError, "wraps a Module",
                      lambda: DistributedDataParallel(object(), g))


# -- state dicts -------------------------------------------------------------------------------
def _bn(prefix, c):
    return [(f"{prefix}.weight", (c,)), (f"{prefix}.bias", (c,)),
            (f"{prefix}.running_mean", (c,)), (f"{prefix}.running_var", (c,)),
            (f"{prefix}.num_batches_tracked", ())]


def _block(prefix, cin, cout):  # Conv3d(k3, no bias) -> BatchNorm3d -> LeakyReLU
    return [(f"{prefix}.0.weight", (cout, cin, 3, 3, 3))] + _bn(f"{prefix}.1", cout)


EXPECTED_STATE = {
    # torch: nn.Sequential indices of Conv3d / LeakyReLU / MaxPool3d, Flatten / Linear / ...
    "cosmoflow": [("features.0.weight", (3, 2, 3, 3, 3)), ("features.0.bias", (3,)),
                  ("features.3.weight", (4, 3, 3, 3, 3)), ("features.3.bias", (4,)),
                  ("head.1.weight", (5, 32)), ("head.1.bias", (5,)),
                  ("head.3.weight", (3, 5)), ("head.3.bias", (3,))],
    "unet": (_block("down.0.0", 2, 2) + _block("down.0.1", 2, 3)
             + _block("down.1.0", 3, 3) + _block("down.1.1", 3, 4)
             + _block("bottom.0", 4, 4) + _block("bottom.1", 4, 4)
             + [("up.0.weight", (4, 4, 2, 2, 2)), ("up.0.bias", (4,)),
                ("up.1.weight", (4, 4, 2, 2, 2)), ("up.1.bias", (4,))]
             + _block("dec.0.0", 8, 4) + _block("dec.0.1", 4, 4)
             + _block("dec.1.0", 7, 3) + _block("dec.1.1", 3, 3)
             + [("out.weight", (3, 3, 1, 1, 1)), ("out.bias", (3,))]),
}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_state_dict_names(model):
    m = MODELS[model]()
    got = [(k, tuple(np.shape(v))) for k, v in m.state_dict().items()]
    want = EXPECTED_STATE[model]
    missing = [k for k in want if k not in got]
    extra = [k for k in got if k not in want]
    assert_all_ranks(COMM, got == want, f"state_dict: missing {missing}, unexpected {extra}, "
                                        f"order {[k for k, _ in got]}")
    params = [n for n, _ in m.named_parameters()]
    want_params = [k for k, _ in want if not k.split(".")[-1].startswith(
        ("running_", "num_batches"))]
    assert_all_ranks(COMM, params == want_params, f"named_parameters {params}")
    # a training forward (batch norm counts batches) keeps every name in place
    x, y = batch(model, (8, 8, 8))
    xt, _ = distribute(model, x, y, grid((SIZE, 1, 1, 1)))
    with no_grad():
        m(xt)
    after = [(k, tuple(np.shape(v))) for k, v in m.state_dict().items()]
    assert_all_ranks(COMM, after == want, f"state_dict after a training forward: "
                                          f"{[k for k, _ in after]}")
    if model == "unet":
        assert_all_ranks(COMM, int(m.state_dict()["down.0.0.1.num_batches_tracked"]) == 1,
                         "num_batches_tracked after one training forward")
    ddp = DistributedDataParallel(m, grid((SIZE, 1, 1, 1)))
    try:
        assert_all_ranks(COMM, list(ddp.state_dict()) == [k for k, _ in want],
                         "the DDP wrapper's state_dict names (no 'module.' prefix)")
    finally:
        ddp.reducer.release()


@pytest.mark.parametrize("model", sorted(MODELS))
@guarded
def test_load_state_dict_round_trip(model):
    src, dst = MODELS[model](seed=1), MODELS[model](seed=2)
    # make the buffers non-trivial: one training forward of src
    spatial = (8, 8, 8)
    x, y = batch(model, spatial)
    xt, yt = distribute(model, x, y, grid((SIZE, 1, 1, 1)))
    with no_grad():
        src(xt)
    state = {k: np.array(v) for k, v in src.state_dict().items()}
    differs = any(not np.array_equal(v, dst.state_dict()[k]) for k, v in state.items())
    expect(differs, "models of two seeds hold the same state")
    missing, unexpected = dst.load_state_dict(state)
    expect(missing == [] and unexpected == [], f"missing {missing}, unexpected {unexpected}")
    for k, v in dst.state_dict().items():
        expect(np.array_equal(v, state[k]) and v.dtype == state[k].dtype,
               f"{k} after load_state_dict")
    state[next(iter(state))] += 1.0  # loading copied: changing the source changes nothing
    expect(not np.array_equal(dst.state_dict()[next(iter(state))], state[next(iter(state))]),
           "load_state_dict kept a reference to the source array")
    src.eval()
    dst.eval()
    with no_grad():
        a, b = src(xt).numpy(), dst(xt).numpy()
    close(b, a, f"{model}: output after load_state_dict", rtol=0, atol=0)
    # into a float32 model: cast
    f32 = MODELS[model](seed=3, dtype="float32")
    f32.load_state_dict(src.state_dict())
    for k, v in f32.state_dict().items():
        want = src.state_dict()[k]
        expect(v.dtype == (np.float32 if want.dtype.kind == "f" else want.dtype)
               and np.allclose(v, want, rtol=1e-6), f"{k} cast to float32")
    # errors (the same on every rank)
    bad = dict(src.state_dict())
    bad.pop(next(iter(bad)))
    assert_raises_all(COMM, KeyError, "missing keys", lambda: dst.load_state_dict(bad))
    extra = dict(src.state_dict(), extra=np.zeros(1))
    assert_raises_all(COMM, KeyError, "unexpected keys", lambda: dst.load_state_dict(extra))
    missing, unexpected = dst.load_state_dict(extra, strict=False)
    expect(unexpected == ["extra"], f"non-strict load: unexpected {unexpected}")
    name = EXPECTED_STATE[model][0][0]
    wrong = dict(src.state_dict(), **{name: np.zeros((1, 2))})
    assert_raises_all(COMM, ValueError, "shape", lambda: dst.load_state_dict(wrong))


# -- input checks ------------------------------------------------------------------------------
def test_cosmoflow_input_too_small():
    for size in (3, (8, 8, 3), (2, 8, 8)):
        assert_raises_all(COMM, ValueError, "too small", lambda size=size: cosmoflow(
            input_size=size))
    assert_raises_all(COMM, ValueError, "at least one stage",
                      lambda: CosmoFlow(input_size=8, widths=(), dtype="float64"))


@pytest.mark.parametrize("model", sorted(MODELS))
def test_wrong_input_raises_on_every_rank(model):
    g = grid((1, SIZE, 1, 1))
    m = MODELS[model]()
    rng = np.random.default_rng(0)
    x3 = Tensor(dt.from_global(rng.standard_normal((2, 3, 8, 8, 8)), grid=g,
                               split=(0, None, 1, 2, 3)))
    pattern = "expects samples of shape" if model == "cosmoflow" else "expects \\(N, 2,"
    assert_raises_all(COMM, ValueError, pattern, lambda: m(x3))
    x6 = Tensor(dt.from_global(rng.standard_normal((2, 2, 8, 6, 8)), grid=g,
                               split=(0, None, 1, 2, 3)))
    pattern = "expects samples of shape" if model == "cosmoflow" else "divisible by 4"
    assert_raises_all(COMM, ValueError, pattern, lambda: m(x6))
    if model == "unet":
        built = UNet3D(in_channels=2, classes=3, encoder=((2, 3), (3, 4)), bottom=(4, 4),
                       input_size=16, dtype="float64", rng=np.random.default_rng(1))
        x8 = Tensor(dt.from_global(rng.standard_normal((2, 2, 8, 8, 8)), grid=g,
                                   split=(0, None, 1, 2, 3)))
        assert_raises_all(COMM, ValueError, "built for samples", lambda: built(x8))
        assert_raises_all(COMM, ValueError, "divisible",
                          lambda: UNet3D(in_channels=2, encoder=((2, 3), (3, 4)),
                                         bottom=(4, 4), input_size=(8, 8, 6)))
    assert_all_ranks(COMM, COMM.allreduce(1) == SIZE, "ranks out of step")


# -- memory ------------------------------------------------------------------------------------
def _peak_bytes(g: dt.ProcessGrid) -> int:
    """Peak bytes NumPy allocates (tracemalloc) during one training forward + backward of a
    U-Net on one 2 x 16^3 sample, the model built (and run once, for JIT and communicators)
    beforehand."""
    m = UNet3D(in_channels=2, classes=3, encoder=((4, 4), (8, 8)), bottom=(8, 8),
               dtype="float64", rng=np.random.default_rng(1))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 16, 16, 16))
    labels = rng.integers(0, 3, (1, 16, 16, 16))
    xt = Tensor(dt.from_global(x, grid=g, split=(0, None, 1, 2, 3)))
    yt = Tensor(dt.from_global(labels, grid=g, split=(0, 1, 2, 3)))
    F.cross_entropy(m(xt), yt).backward()
    m.zero_grad()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        F.cross_entropy(m(xt), yt).backward()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@pytest.mark.skipif(SIZE != 4, reason="the memory target is for 4 ranks")
def test_activation_memory_per_rank():
    one = _peak_bytes(self_grid())
    four = COMM.allreduce(_peak_bytes(grid((1, 2, 2, 1))), op=MPI.MAX)
    ratio = four / one
    if COMM.rank == 0:
        print(f"\npeak activation memory per rank, forward + backward of a 2 x 16^3 sample: "
              f"one rank {one} B, (1, 2, 2, 1) grid {four} B (max over ranks), ratio "
              f"{ratio:.3f}")
    assert_all_ranks(COMM, one > 2 * 16 ** 3 * 8 * 4, f"implausibly small peak {one} B")
    assert_all_ranks(COMM, ratio < 0.5, f"peak per rank {four} B vs one rank {one} B: ratio "
                                        f"{ratio:.3f} >= 0.5")
