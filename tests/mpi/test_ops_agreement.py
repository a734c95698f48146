"""Argument agreement of the distributed CNN ops (issue 11): an argument that differs between
ranks raises :class:`disttensor.ArgumentMismatchError` naming it on every rank, before any
data moves, for every entry point of :mod:`disttensor.ops`; and the agreement costs at most
one small all-reduce per entry point (none for the calls that move no data: the activations,
dense, flatten without a gather and a reduced loss's gradient defer theirs to the next
agreement over the grid, which raises the mismatch naming the deferred call).

Each mismatch test expects the error with ``pytest.raises`` on every rank, then proves the
ranks are still in step (:func:`in_step`).  Arrays whose layout differs between ranks (what a
rank-dependent branch would produce) are made inside :func:`disttensor.core.agreement.disabled`,
where creation sends no message.  The counting tests monkeypatch
:func:`disttensor.core.agreement.status_allreduce` (every agreement and failure all-reduce goes
through it).
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from disttensor import ops
from disttensor.core import agreement
from disttensor.ops.local import kernels_for
from disttensor.ops.losses_pointwise import pointwise_loss_forward
from checks import different_calls, in_step, last_rank_only, mismatch  # noqa: F401
from conftest import assert_all_ranks

COMM = MPI.COMM_WORLD
SIZE = COMM.Get_size()
RANK = COMM.Get_rank()

two_ranks = pytest.mark.skipif(SIZE == 1, reason="needs two ranks to differ")


_GRIDS: dict = {}


def grid1() -> dt.ProcessGrid:
    """A 1-D grid of all ranks, for (N, C, W) arrays split along W."""
    if "1d" not in _GRIDS:
        _GRIDS["1d"] = dt.ProcessGrid((SIZE,))
    return _GRIDS["1d"]


def ncw(n=2, c=4, w=None, split=(None, None, 0), sizes=None, seed=0) -> dt.DistArray:
    """An (N, C, W) float64 array, W = 4 per rank by default, split along W."""
    w = 4 * SIZE if w is None else w
    a = np.random.default_rng(seed).standard_normal((n, c, w))
    return dt.from_global(a, grid=grid1(), split=split, sizes=sizes)


def rank_dependent(shape, split, sizes=None, fill=1.0) -> dt.DistArray:
    """An array whose layout may differ between ranks (made without agreement: creation
    sends no message then)."""
    with agreement.disabled():
        x = dt.zeros(shape, grid=grid1(), split=split, sizes=sizes)
    x.local[...] = fill
    return x


def next_agreement() -> None:
    """The next agreement over the 1-D grid: where the calls that move no data (activations,
    dense, flatten without a gather, a reduced loss's gradient) deferred theirs, a mismatch
    is raised here, naming the deferred call."""
    agreement.settle(grid1().cart)


RNG = np.random.default_rng(7)
W3 = RNG.standard_normal((4, 4, 3))


# -- convolution ----------------------------------------------------------------------------------
@two_ranks
def test_conv_forward_arguments_differ():
    x = ncw()
    with mismatch("conv_forward", "padding"):  # was: returned with inconsistent metadata
        ops.conv_forward(x, W3, padding=last_rank_only(1, 0))
    with mismatch("conv_forward", "stride"):
        ops.conv_forward(x, W3, stride=last_rank_only(2, 1))
    with mismatch("conv_forward", "dilation"):
        ops.conv_forward(x, W3, dilation=last_rank_only(2, 1))
    with mismatch("conv_forward", "groups"):  # invalid on the others: the mismatch wins
        ops.conv_forward(x, W3[:, :2], groups=last_rank_only(2, 1))
    with mismatch("conv_forward", "w"):
        ops.conv_forward(x, last_rank_only(W3[:, :, :1], W3), padding=1)
    with mismatch("conv_forward", "b"):
        ops.conv_forward(x, W3, last_rank_only(np.zeros(4), None))
    with mismatch("conv_forward", "padding_mode"):
        ops.conv_forward(x, W3, padding=1, padding_mode=last_rank_only("circular", "zeros"))
    with mismatch("conv_forward", "overlap"):
        ops.conv_forward(x, W3, padding=1, overlap=last_rank_only(True, False))
    in_step("conv forward")


def test_conv_spellings_that_agree():
    """Spellings of one geometry agree (normalized before the digest)."""
    x = ncw()
    y1, _ = ops.conv_forward(x, W3, padding=last_rank_only(1, ((1, 1),)),
                             stride=last_rank_only(1, (1,)))
    y2, _ = ops.conv_forward(x, W3, padding=last_rank_only("same", 1))
    assert_all_ranks(COMM, np.array_equal(y1.local, y2.local), "same padding spellings")
    ops.pool_forward(x, "max", last_rank_only(2, [2]), padding=last_rank_only(0, ((0, 0),)))
    ops.conv_forward(x, W3, padding=1, overlap=last_rank_only(None, False))  # CPU: no overlap
    ops.mse_backward(ops.mse_forward(x, x)[1], last_rank_only(1, 1.0))
    in_step("spellings")


@two_ranks
def test_conv_backward_arguments_differ():
    x = ncw()
    y, saved = ops.conv_forward(x, W3, np.zeros(4), padding=1)
    dy = ops.conv_forward(x, W3, padding=1)[0]
    with mismatch("conv_backward", "need_dw"):
        ops.conv_backward(saved, dy, need_dw=last_rank_only(False, True))
    with mismatch("conv_backward", "reduce"):
        ops.conv_backward(saved, dy, reduce=last_rank_only(False, True))
    # a gradient distributed differently on one rank (what a rank-dependent branch gives)
    n = y.shape[2]
    bad = rank_dependent(y.shape, (None, None, 0),
                         [None, None, last_rank_only((n,) + (0,) * (SIZE - 1), None)])
    with mismatch("conv_backward", "dy"):
        ops.conv_backward(saved, last_rank_only(bad, dy))
    # no data gradient and no sums: no data moves, agreed with the next agreement
    with mismatch("conv_backward", "need_dw"):
        ops.conv_backward(saved, dy, need_dx=False, reduce=False,
                          need_dw=last_rank_only(False, True))
        next_agreement()
    in_step("conv backward")


@two_ranks
def test_conv_transpose_arguments_differ():
    x = ncw()
    with mismatch("conv_transpose_forward", "output_padding"):
        ops.conv_transpose_forward(x, W3, stride=2, output_padding=last_rank_only(1, 0))
    with mismatch("conv_transpose_forward", "stride"):
        ops.conv_transpose_forward(x, W3, stride=last_rank_only(2, 1))
    y, saved = ops.conv_transpose_forward(x, W3, padding=1)
    with mismatch("conv_transpose_backward", "need_dy"):
        ops.conv_transpose_backward(saved, y, need_dy=last_rank_only(False, True))
    in_step("conv transpose")


# -- pooling and upsampling -----------------------------------------------------------------------
@two_ranks
def test_pool_arguments_differ():
    x = ncw()
    with mismatch("pool_forward", "kernel"):  # was: "Message truncated" on one rank, hangs
        ops.pool_forward(x, "max", last_rank_only(3, 2))
        next_agreement()  # (deferred where no halo moves)
    with mismatch("pool_forward", "mode"):
        ops.pool_forward(x, last_rank_only("avg", "max"), 2)
        next_agreement()  # (deferred where no halo moves)
    with mismatch("pool_forward", "stride"):
        ops.pool_forward(x, "max", 2, last_rank_only(1, 2))
        next_agreement()  # (deferred where no halo moves)
    with mismatch("pool_forward", "padding"):
        ops.pool_forward(x, "max", 3, 1, last_rank_only(1, 0))
        next_agreement()  # (deferred where no halo moves)
    with mismatch("pool_forward", "count_include_pad"):
        ops.pool_forward(x, "avg", 3, 1, 1, last_rank_only(False, True))
        next_agreement()  # (deferred where no halo moves)
    with mismatch("pool_forward", "kernel"):  # invalid on one rank only: the mismatch wins
        ops.pool_forward(x, "max", last_rank_only(0, 2))
        next_agreement()  # (deferred where no halo moves)
    y, saved = ops.pool_forward(x, "max", 3, 1, 1)
    with mismatch("pool_backward", "dy"):
        ops.pool_backward(saved, last_rank_only(rank_dependent(y.shape, (None, None, None)), y))
        next_agreement()  # (deferred where no halo moves)
    in_step("pool")


@two_ranks
def test_upsample_arguments_differ():
    x = ncw()
    with mismatch("upsample_forward", "scale"):  # nearest: no message, but global metadata
        ops.upsample_forward(x, last_rank_only(3, 2))
    with mismatch("upsample_forward", "mode"):
        ops.upsample_forward(x, 2, last_rank_only("linear", "nearest"))
    y, saved = ops.upsample_forward(x, 2, "linear")
    with mismatch("upsample_backward", "dy"):
        ops.upsample_backward(saved, last_rank_only(rank_dependent(y.shape, (None,) * 3), y))
    in_step("upsample")


# -- batch norm -----------------------------------------------------------------------------------
@two_ranks
def test_batch_norm_arguments_differ():
    x = ncw()
    g, b = np.ones(4), np.zeros(4)
    rm, rv = np.zeros(4), np.ones(4)
    with mismatch("batch_norm_forward", "eps"):
        ops.batch_norm_forward(x, g, b, rm, rv, eps=last_rank_only(1e-3, 1e-5))
    with mismatch("batch_norm_forward", "momentum"):
        ops.batch_norm_forward(x, g, b, rm, rv, momentum=last_rank_only(0.2, 0.1))
    with mismatch("batch_norm_forward", "training"):
        ops.batch_norm_forward(x, g, b, rm, rv, training=last_rank_only(False, True))
    with mismatch("batch_norm_forward", "stats"):
        ops.batch_norm_forward(x, g, b, rm, rv, stats=last_rank_only("local", "global"))
    with mismatch("batch_norm_forward", "running_mean", "running_var"):
        ops.batch_norm_forward(x, g, b, last_rank_only(None, rm), last_rank_only(None, rv))
    with mismatch("batch_norm_forward", "gamma"):
        ops.batch_norm_forward(x, last_rank_only(np.ones(3), g), b)
    np.testing.assert_array_equal(rm, np.zeros(4))  # no rank updated its running statistics
    y, saved = ops.batch_norm_forward(x, g, b)
    with mismatch("batch_norm_backward", "reduce"):
        ops.batch_norm_backward(saved, y, reduce=last_rank_only(False, True))
    in_step("batch norm")


# -- activations, dropout -------------------------------------------------------------------------
@two_ranks
def test_activation_arguments_differ():
    x = ncw()
    with mismatch("activation_forward", "alpha"):  # (deferred: raised at the next agreement)
        ops.leaky_relu(x, last_rank_only(0.2, 0.01))
        next_agreement()
    with mismatch("activation_forward", "alpha"):
        ops.elu(x, last_rank_only(2.0, 1.0))
        next_agreement()
    y = ops.leaky_relu(x, 0.1)
    with mismatch("activation_backward", "alpha"):
        ops.activation_backward("leaky_relu", y, x, y, last_rank_only(0.2, 0.1))
        next_agreement()
    # relu and leaky_relu both defer their agreement: a rank taking leaky_relu instead is
    # found out at the next agreement (a pooling that exchanges a halo), and all raise
    with mismatch("activation_forward", "name"):
        if RANK == SIZE - 1:
            ops.leaky_relu(x, 0.1)
        else:
            ops.relu(x)
        ops.pool_forward(x, "max", 3, 1, 1)
    with mismatch("dropout_forward", "p"):
        ops.dropout_forward(x, last_rank_only(0.3, 0.2), 5)
    with mismatch("dropout_forward", "seed"):
        ops.dropout_forward(x, 0.2, last_rank_only(6, 5))
    gen = dt.random.default_rng(3)
    if RANK == SIZE - 1:
        gen.counter += 1  # a rank that drew once more before
    with mismatch("dropout_forward", "stream"):
        ops.dropout_forward(x, 0.2, gen)
    in_step("activations")


# -- shape ops and losses -------------------------------------------------------------------------
@two_ranks
def test_shape_op_arguments_differ():
    x = ncw()
    x2 = ncw(c=2)
    with mismatch("concat_channels", "xs"):
        ops.concat_channels(last_rank_only([x, x2, x2], [x, x2]))
    y, layouts = ops.concat_channels([x, x2])
    with mismatch("concat_channels_backward", "dy"):
        ops.concat_channels_backward(layouts, last_rank_only(
            rank_dependent(y.shape, (None,) * 3), y))
    xs = ncw(split=(0, None, None), n=2 * SIZE)
    # (flatten without a gather and dense move no data: agreed with the next agreement)
    with mismatch("flatten_forward", "x"):
        ops.flatten_forward(last_rank_only(rank_dependent(xs.shape, (None,) * 3), xs))
        next_agreement()
    with mismatch("flatten_forward", "x"):  # a gather on the last rank only: agreed there
        ops.flatten_forward(last_rank_only(x, xs))
        next_agreement()
    f, fsaved = ops.flatten_forward(xs)
    w = RNG.standard_normal((3, f.shape[1]))
    with mismatch("dense_forward", "w"):
        ops.dense_forward(f, last_rank_only(w[:2], w))
        next_agreement()
    with mismatch("dense_forward", "b"):
        ops.dense_forward(f, w, last_rank_only(None, np.zeros(3)))
        next_agreement()
    d, dsaved = ops.dense_forward(f, w)
    with mismatch("dense_backward", "reduce"):  # agreed on all but the last rank (sums)
        ops.dense_backward(dsaved, d, reduce=last_rank_only(False, True))
        next_agreement()
    with mismatch("flatten_backward", "dy"):  # raises on the last rank: agreed there
        ops.flatten_backward(fsaved, last_rank_only(rank_dependent(f.shape, (None, None)), f))
        next_agreement()
    in_step("shape ops")


@two_ranks
def test_loss_arguments_differ():
    x = ncw()
    t = ncw(seed=1)
    with mismatch("mse_forward", "reduction"):
        ops.mse_forward(x, t, last_rank_only("sum", "mean"))
    with mismatch("mse_forward", "target"):
        ops.mse_forward(x, last_rank_only(rank_dependent(t.shape, (None,) * 3), t))
    loss, saved = ops.mse_forward(x, t)
    with mismatch("mse_backward", "dloss"):  # (a number: deferred, no data moves)
        ops.mse_backward(saved, last_rank_only(2.0, 1.0))
        next_agreement()
    lab = dt.from_global(np.zeros((2, 4 * SIZE), dtype=np.int64), grid=grid1(), split=(None, 0))
    with mismatch("cross_entropy_forward", "reduction"):
        ops.cross_entropy_forward(x, lab, last_rank_only("sum", "mean"))
    with mismatch("cross_entropy_forward", "labels"):
        ops.cross_entropy_forward(x, last_rank_only(
            rank_dependent(lab.shape, (None, None)), lab))
    _, csaved = ops.cross_entropy_forward(x, lab)
    with mismatch("cross_entropy_backward", "dloss"):
        ops.cross_entropy_backward(csaved, last_rank_only(0.5, 1.0))
        next_agreement()
    in_step("losses")


@two_ranks
def test_deferred_flatten_backward_and_whole_loss_differ():
    """The calls that move no data only where every rank holds all they need (flatten's
    backward after a gather, a loss of an array whole on every rank) are agreed with the next
    agreement: a rank-dependent argument raises there, on every rank; a loss whose range check
    fails on one rank only raises that rank's error on every rank."""
    x = ncw()
    f, gsaved = ops.flatten_forward(x)  # gathered
    with mismatch("flatten_backward", "dy"):  # raises on the last rank: agreed there
        ops.flatten_backward(gsaved, last_rank_only(rank_dependent(f.shape, (0, None)), f))
        next_agreement()
    xr, tr = ncw(split=(None, None, None)), ncw(split=(None, None, None), seed=1)
    with mismatch("mse_loss_forward", "reduction"):
        pointwise_loss_forward("mse", xr, tr, last_rank_only("sum", "mean"))
        next_agreement()
    p = rank_dependent(xr.shape, (None,) * 3, fill=last_rank_only(2.0, 0.5))
    suffix = "" if RANK == SIZE - 1 else rf" \(raised on rank {SIZE - 1}\)"
    with pytest.raises(ValueError, match=rf"between 0 and 1 \(\d+ are not\){suffix}$"):
        pointwise_loss_forward("bce", p, tr * 0.0)  # fails on the last rank only
        next_agreement()
    in_step("deferred whole")


@two_ranks
def test_gradient_reducer_meets_a_deferred_failure():
    """A training step whose calls after a failure all move no data (a dense model on samples
    every rank holds whole): the loss's range check fails on the last rank only, which waits
    over the grid; the others meet it when the gradient reducer agrees the step's deferred
    calls at the end of backward (not in a wait for buckets that rank never starts): every
    rank raises its error."""
    from disttensor import nn
    from disttensor.autograd import Tensor
    lin = nn.Linear(4, 4)
    lin.weight.data[...] = np.eye(4)
    lin.bias.data[...] = 0.0
    # (overlap=False: no bucket starts before the end of backward, so none is left in flight
    # on the ranks that raise; with overlap the ranks raise alike)
    net = nn.DistributedDataParallel(lin, grid1(), overlap=False)
    x = rank_dependent((3, 4), (None, None), fill=last_rank_only(5.0, 0.5)).astype("float32")
    t = dt.from_global(np.zeros((3, 4), np.float32), grid=grid1(), split=(None, None))
    suffix = "" if RANK == SIZE - 1 else rf" \(raised on rank {SIZE - 1}\)"
    with pytest.raises(ValueError, match=rf"between 0 and 1 \(\d+ are not\){suffix}$"):
        loss = nn.functional.binary_cross_entropy(net(Tensor(x)), Tensor(t))
        loss.backward()
    in_step("reducer settles")
    net.reducer.release()


def test_loss_reduction_sum():
    """``reduction='sum'``: the sum over the elements / voxels; its gradient is the mean's times
    the count."""
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((2, 3, 4 * SIZE)), rng.standard_normal((2, 3, 4 * SIZE))
    lab = rng.integers(0, 3, (2, 4 * SIZE))
    x = dt.from_global(a, grid=grid1(), split=(None, None, 0))
    t = dt.from_global(b, grid=grid1(), split=(None, None, 0))
    labels = dt.from_global(lab, grid=grid1(), split=(None, 0))
    s, ssaved = ops.mse_forward(x, t, "sum")
    m, msaved = ops.mse_forward(x, t)
    assert_all_ranks(COMM, np.isclose(s, ((a - b) ** 2).sum(), rtol=1e-12), f"mse sum {s}")
    np.testing.assert_allclose(ops.mse_backward(ssaved).to_numpy(),
                               ops.mse_backward(msaved).to_numpy() * a.size, rtol=1e-12)
    s, ssaved = ops.cross_entropy_forward(x, labels, "sum")
    m, msaved = ops.cross_entropy_forward(x, labels)
    assert_all_ranks(COMM, np.isclose(s, m * lab.size, rtol=1e-12), f"ce sum {s} mean {m}")
    np.testing.assert_allclose(ops.cross_entropy_backward(ssaved, 0.5).to_numpy(),
                               ops.cross_entropy_backward(msaved, 0.5).to_numpy() * lab.size,
                               rtol=1e-12)
    with pytest.raises(ValueError, match="reduction must be one of"):
        ops.mse_forward(x, t, "none")
    in_step("reduction sum")


# -- cost: one all-reduce per entry point ---------------------------------------------------------
def test_one_agreement_per_entry_point(counted):
    """Each entry point agrees once (nested core calls such as with_halo or redistribute add
    none, nor does the halo exchange of a convolution or pooling: its halo and boundary derive
    from the op's agreed arguments, ``_spatial.halo_input`` runs it nested; upsampling still
    exchanges through a top-level ``halo_exchange`` that agrees), and folds its agreement into
    the failure all-reduce of the local kernels that precede any message."""
    x = ncw()
    xs = ncw(split=(0, None, None), n=2 * SIZE)  # samples split: pool 2 reads no halo
    g, b = np.ones(4), np.zeros(4)
    y, csaved = ops.conv_forward(x, W3, padding=1)
    p, psaved = ops.pool_forward(xs, "max", 2)
    h, hsaved = ops.pool_forward(x, "max", 3, 1, 1)
    bn, bsaved = ops.batch_norm_forward(x, g, b, np.zeros(4), np.ones(4))
    u, usaved = ops.upsample_forward(x, 2, "linear")
    f, fsaved = ops.flatten_forward(xs)
    fg, gsaved = ops.flatten_forward(x)  # (x split along W: gathered)
    xr = ncw(split=(None, None, None))  # whole on every rank: a loss of it sums nothing
    w = RNG.standard_normal((3, f.shape[1]))
    d, dsaved = ops.dense_forward(f, w)
    _, msaved = ops.mse_forward(x, x)
    halo = ["halo_exchange"] if SIZE > 1 else []
    # (name, call, status all-reduces expected on more than one rank)
    cases = [
        ("conv_forward", lambda: ops.conv_forward(x, W3, padding=1, overlap=False),
         ["conv_forward"]),  # kernel failures agreed with the next call; halo nested
        ("conv_forward, samples split", lambda: ops.conv_forward(xs, W3, padding=1), []),
        # (no halo: deferred)
        ("conv_backward", lambda: ops.conv_backward(csaved, y),
         ["conv_backward"]),  # data and filter kernels inside the agreement
        ("conv_backward dw only, no sums",
         lambda: ops.conv_backward(csaved, y, need_dx=False, reduce=False), []),  # deferred
        ("conv_backward dw only", lambda: ops.conv_backward(csaved, y, need_dx=False),
         ["conv_backward"]),
        ("pool_forward, no halo", lambda: ops.pool_forward(xs, "max", 2), []),  # (deferred)
        ("pool_forward, halo", lambda: ops.pool_forward(x, "max", 3, 1, 1),
         ["pool_forward"]),
        ("pool_backward, no halo", lambda: ops.pool_backward(psaved, p), []),
        ("pool_backward, halo", lambda: ops.pool_backward(hsaved, h), ["pool_backward"]),
        ("batch_norm_forward", lambda: ops.batch_norm_forward(x, g, b),
         ["batch_norm_forward"]),  # local moments inside the agreement, then an Allgather
        ("batch_norm_forward eval",
         lambda: ops.batch_norm_forward(x, g, b, np.zeros(4), np.ones(4), training=False),
         ["batch_norm_forward"]),
        ("batch_norm_backward", lambda: ops.batch_norm_backward(bsaved, bn),
         ["batch_norm_backward"]),
        ("upsample_forward nearest", lambda: ops.upsample_forward(x, 2), ["upsample_forward"]),
        ("upsample_forward linear", lambda: ops.upsample_forward(x, 2, "linear"),
         ["upsample_forward"] + halo + [None]),
        ("upsample_backward linear", lambda: ops.upsample_backward(usaved, u),
         ["upsample_backward"] + halo),
        ("leaky_relu", lambda: ops.leaky_relu(x, 0.1), []),  # (deferred: no data moves)
        ("leaky_relu backward",
         lambda: ops.activation_backward("leaky_relu", x, x, x, 0.1), []),
        ("relu", lambda: ops.relu(x), []),
        ("softmax", lambda: ops.softmax(x), []),
        ("dropout_forward", lambda: ops.dropout_forward(x, 0.5, 1), ["dropout_forward"]),
        ("flatten_forward", lambda: ops.flatten_forward(xs), []),  # (no gather: deferred)
        ("flatten_forward, gather", lambda: ops.flatten_forward(x), ["flatten_forward"]),
        ("flatten_backward", lambda: ops.flatten_backward(fsaved, f), []),
        ("flatten_backward after a gather", lambda: ops.flatten_backward(gsaved, fg), []),
        # (each rank keeps its slice of the replica: no data moves, deferred)
        ("dense_forward", lambda: ops.dense_forward(f, w), []),
        ("dense_backward", lambda: ops.dense_backward(dsaved, d), ["dense_backward"]),
        ("dense_backward, no sums", lambda: ops.dense_backward(dsaved, d, reduce=False), []),
        ("concat_channels", lambda: ops.concat_channels([x, x]), ["concat_channels"]),
        ("mse_forward", lambda: ops.mse_forward(x, x), ["mse_forward"]),
        ("mse_loss_forward, whole on every rank",
         lambda: pointwise_loss_forward("mse", xr, xr), []),
        ("mse_backward", lambda: ops.mse_backward(msaved), []),
    ]
    for name, fn, want in cases:
        fn()  # warm (sub-communicators, caches)
        counted.clear()
        fn()
        want = want if SIZE > 1 else []
        assert_all_ranks(COMM, counted == want, f"{name}: status all-reduces {counted}, "
                                                f"expected {want}")
    in_step("one agreement")


@contextlib.contextmanager
def kernel_fails_on_last_rank(k, kernel: str):
    """The block calls an op whose local kernel ``kernel`` (of the kernel set ``k``) raises
    ``MemoryError`` on the last rank only; every rank must raise it (the others naming the
    rank it was raised on)."""
    suffix = "" if RANK == SIZE - 1 else rf" \(raised on rank {SIZE - 1}\)"
    with pytest.MonkeyPatch.context() as mp:
        if RANK == SIZE - 1:
            def fail(*args, **kwargs):
                raise MemoryError(f"{kernel} ran out")
            mp.setattr(k, kernel, fail)
        with pytest.raises(MemoryError, match=rf"^{kernel} ran out{suffix}$"):
            yield


@two_ranks
def test_kernel_failure_after_the_halo_raises_on_every_rank(counted):
    """A convolution or pooling kernel that fails on one rank after the halo exchange (which
    has no failure all-reduce of its own: the failing rank agrees at once, the others meet it
    in their next agreement over the grid) raises that rank's error on every rank."""
    x = ncw()
    k = kernels_for(x.local)
    cases = [("conv_forward", lambda: ops.conv_forward(x, W3, padding=1, overlap=False)),
             ("pool_forward", lambda: ops.pool_forward(x, "max", 3, 1, 1))]
    for kernel, call in cases:
        counted.clear()
        with kernel_fails_on_last_rank(k, kernel):
            y, _ = call()   # returns on the ranks whose kernel ran
            ops.mse_forward(y, y)  # their next agreement over the grid meets the failure
        assert_all_ranks(COMM, len(counted) == 2, f"{kernel}: all-reduces {counted}")
    in_step("kernel failure")


@two_ranks
def test_failure_before_a_reverse_halo_raises_on_every_rank(counted):
    """A convolution backward that sends a reverse halo agrees before the exchange moves data,
    also where everything it agrees was agreed by its forward: a rank may wait in an
    at-once agreement of an earlier call (a deferred call that failed there, here a
    ``leaky_relu`` backward given a gradient laid out differently on the last rank), and only
    an agreement of the others meets it (a backward that went straight to its exchange would
    wait for that rank's halo: a hang).  And the backward's own local kernels, which run
    before the exchange, have their failure agreed in that same all-reduce: every rank raises
    it, one status all-reduce each."""
    x = ncw()
    y, saved = ops.conv_forward(x, W3, padding=1, overlap=False)
    dy = ops.conv_forward(x, W3, padding=1, overlap=False)[0]
    n = y.shape[2]
    bad = rank_dependent(y.shape, (None, None, 0),
                         [None, None, last_rank_only((n,) + (0,) * (SIZE - 1), None)])
    counted.clear()
    for name in ("leaky_relu", "relu"):  # (relu, with no hyper-parameter, defers as well)
        counted.clear()
        with mismatch("activation_backward", "dy"):
            g = ops.activation_backward(name, last_rank_only(bad, dy), y, y, 0.1)
            ops.conv_backward(saved, g, need_dw=False)  # the last rank does not get here
        assert_all_ranks(COMM, len(counted) == 1, f"{name}: status all-reduces {counted}")
    in_step("failure before the reverse halo")
    k = kernels_for(x.local)
    for kernel in ("conv_backward_data", "conv_backward_filter"):
        counted.clear()
        with kernel_fails_on_last_rank(k, kernel):
            ops.conv_backward(saved, dy, reduce=False)
        assert_all_ranks(COMM, counted == ["conv_backward"], f"{kernel}: {counted}")
    in_step("backward kernel failure")


def test_no_message_with_agreement_off_for_local_ops(counted):
    """With agreement disabled, the ops that move no data make no message at all."""
    x = ncw()
    xs = ncw(split=(0, None, None), n=2 * SIZE)
    f, _ = ops.flatten_forward(xs)
    w = RNG.standard_normal((3, f.shape[1]))
    with agreement.disabled():
        counted.clear()
        ops.leaky_relu(x, 0.1)
        ops.relu(x)
        ops.upsample_forward(x, 2)
        ops.flatten_forward(xs)
        ops.dense_forward(f, w)
        ops.batch_norm_forward(x, np.ones(4), np.zeros(4), np.zeros(4), np.ones(4),
                               training=False)
    assert_all_ranks(COMM, not counted, f"{counted} all-reduces with agreement off")
    in_step("agreement off")


@two_ranks
@pytest.mark.skipif(not agreement.DEBUG, reason="weights are compared by value under "
                                                "DISTTENSOR_DEBUG=1 only")
def test_debug_mode_compares_weights_by_value():
    x = ncw()
    with mismatch("conv_forward", "w"):
        ops.conv_forward(x, last_rank_only(W3 + 1.0, W3), padding=1)
    with mismatch("batch_norm_forward", "gamma"):
        ops.batch_norm_forward(x, last_rank_only(np.full(4, 2.0), np.ones(4)), np.zeros(4))
    in_step("debug values")
