"""Property tests of the window index math (disttensor.ops.window): output ownership tiles the
outputs, halos cover every read, local pads make the local kernel produce exactly the owned
outputs, and the inverse used by transposed convolution round-trips."""
from hypothesis import given, strategies as st

from disttensor.ops.window import AxisWindow, normalize_padding, same_padding

from disttensor.testing.strategies import explicit_sizes as compositions


@st.composite
def window_and_split(draw):
    k = draw(st.integers(1, 6))
    s = draw(st.integers(1, 4))
    d = draw(st.integers(1, 3))
    lo = draw(st.integers(0, 4))
    hi = draw(st.integers(0, 4))
    w = AxisWindow(k, s, d, lo, hi)
    n = draw(st.integers(max(1, w.span - lo - hi), 40))
    p = draw(st.integers(1, 6))
    sizes = draw(compositions(n, p))
    offs = [0]
    for v in sizes:
        offs.append(offs[-1] + v)
    return w, tuple(offs)


def _centre(w, o, n):
    return min(max(o * w.stride - w.pad_lo + (w.span - 1) // 2, 0), n - 1)


@given(window_and_split())
def test_outputs_are_tiled_by_centre_owner(ws):
    w, offs = ws
    n = offs[-1]
    m = w.out_extent(n)
    out = w.output_offsets(offs)
    assert out[0] == 0 and out[-1] == m
    assert all(a <= b for a, b in zip(out[:-1], out[1:]))
    for c in range(len(offs) - 1):
        for o in range(out[c], out[c + 1]):
            assert offs[c] <= _centre(w, o, n) < offs[c + 1]


@given(window_and_split())
def test_halo_covers_reads_and_local_pads_give_owned_outputs(ws):
    w, offs = ws
    n = offs[-1]
    out = w.output_offsets(offs)
    hl, hh = w.halo(offs)
    assert 0 <= hl <= n and 0 <= hh <= n
    for a, b, o0, o1 in zip(offs[:-1], offs[1:], out[:-1], out[1:]):
        if o1 <= o0:
            continue
        lo, hi = w.input_range(o0, o1)
        # every input index a window of these outputs reads, clipped to [0, n), is in the buffer
        for o in range(o0, o1):
            for j in range(w.kernel):
                i = o * w.stride - w.pad_lo + j * w.dilation
                if 0 <= i < n:
                    assert a - hl <= i < b + hh
        pl, ph = w.local_pads(o0, o1, n)
        rlo, rhi = w.read_range(o0, o1, n)
        assert 0 <= rlo <= rhi <= n and pl >= 0 and ph >= 0
        assert rhi == rlo or a - hl <= rlo and rhi <= b + hh
        length = rhi - rlo
        assert (length + pl + ph - w.span) // w.stride + 1 == o1 - o0
        assert (length + pl + ph - w.span) % w.stride == 0


@given(window_and_split())
def test_input_offsets_inverts_output_offsets(ws):
    w, offs = ws
    n = offs[-1]
    out = w.output_offsets(offs)
    back = w.input_offsets(out, n)
    assert back[0] == 0 and back[-1] == n
    assert all(a <= b for a, b in zip(back[:-1], back[1:]))
    assert w.output_offsets(back) == out


def test_same_stride_one_keeps_ownership():
    offs = (0, 5, 5, 11, 16)
    for k, d in ((3, 1), (5, 2), (4, 1), (2, 3)):
        (lo, hi), = same_padding((k,), (d,))
        w = AxisWindow(k, 1, d, lo, hi)
        assert w.output_offsets(offs) == offs


def test_stride_two_pool_halves_blocks():
    w = AxisWindow(2, 2)
    assert w.output_offsets((0, 5, 10, 16)) == (0, 3, 5, 8)
    assert w.halo((0, 5, 10, 16)) == (0, 1)   # block [0, 5) owns output 2, reading input 5


def test_normalize_padding_forms():
    assert normalize_padding(1, 3) == ((1, 1),) * 3
    assert normalize_padding("valid", 2) == ((0, 0), (0, 0))
    assert normalize_padding((1, (0, 2)), 2) == ((1, 1), (0, 2))
    assert normalize_padding("same", 2, kernel=(3, 4), dilation=(1, 1)) == ((1, 1), (1, 2))


@given(window_and_split())
def test_periodic_halo_covers_wrapped_reads_without_local_pads(ws):
    w, offs = ws
    w = AxisWindow(w.kernel, w.stride, w.dilation, w.pad_lo, w.pad_hi, periodic=True)
    n = offs[-1]
    out = w.output_offsets(offs)
    hl, hh = w.halo(offs)
    for a, b, o0, o1 in zip(offs[:-1], offs[1:], out[:-1], out[1:]):
        if o1 <= o0:
            continue
        assert w.local_pads(o0, o1, n) == (0, 0)
        lo, hi = w.read_range(o0, o1, n)
        assert a - hl <= lo and hi <= b + hh
        assert (hi - lo - w.span) // w.stride + 1 == o1 - o0
