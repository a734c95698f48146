"""Window index math of sliding-window ops (convolution, pooling), pure and MPI-free.

Along one axis a window op is ``AxisWindow(kernel, stride, dilation, pad_lo, pad_hi)``: output
``o`` reads inputs ``o*stride - pad_lo + j*dilation`` for ``j < kernel`` (indices outside
``[0, n)`` are padding), and the output extent is
``(n + pad_lo + pad_hi - dilation*(kernel-1) - 1) // stride + 1``.

**Ownership of outputs.**  Output ``o`` belongs to the block that owns its *centre* input
``c(o) = o*stride - pad_lo + (dilation*(kernel-1))//2``, clamped into ``[0, n-1]``.  ``c`` is
non-decreasing, so every block gets one contiguous (possibly empty) run of outputs and no output
is computed twice; a ``'same'`` stride-1 op keeps the input's ownership exactly, a stride-2
op halves it (uneven where the input blocks are odd), and a ``'valid'`` op trims the outer
blocks.  This is the explicit ownership the distributed ops give their outputs.

**Halo.**  A block that owns outputs ``[o0, o1)`` reads inputs
``[o0*stride - pad_lo, (o1-1)*stride - pad_lo + dilation*(kernel-1) + 1)``.  The part inside
``[0, n)`` but outside the block is its halo; the part outside ``[0, n)`` is padding, which the
local kernel applies itself (``local_pads``), so halos never carry padding values and
max-pooling can pad with ``-inf``.  A ``periodic`` window (circular padding) instead reads the
padding cells as wrapped-around input through a periodic halo and the kernel pads nothing.
One halo width per side serves all blocks (the maximum need;
:class:`disttensor.core.halo.HaloExchange` takes one width per side); it can reach past the direct
neighbour and can be larger on one side than the other.  Blocks that need less read a
sub-window of their buffer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["AxisWindow", "normalize_tuple", "normalize_padding", "same_padding"]


@dataclass(frozen=True)
class AxisWindow:
    """A sliding window along one axis (all entries non-negative; kernel, stride, dilation >= 1)."""

    kernel: int
    stride: int = 1
    dilation: int = 1
    pad_lo: int = 0
    pad_hi: int = 0
    periodic: bool = False  # padding wraps around (circular), read through a periodic halo

    def __post_init__(self):
        for name in ("kernel", "stride", "dilation"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.pad_lo < 0 or self.pad_hi < 0:
            raise ValueError(f"padding must be >= 0, got ({self.pad_lo}, {self.pad_hi})")

    @property
    def span(self) -> int:
        """Number of input cells one window covers, dilation included."""
        return self.dilation * (self.kernel - 1) + 1

    def out_extent(self, n: int) -> int:
        """Number of outputs for an input extent ``n`` (``ValueError`` if the padded input is
        shorter than one window)."""
        padded = n + self.pad_lo + self.pad_hi
        if padded < self.span:
            raise ValueError(f"input extent {n} with padding ({self.pad_lo}, {self.pad_hi}) is "
                             f"shorter than the window span {self.span}")
        return (padded - self.span) // self.stride + 1

    # -- ownership ----------------------------------------------------------------------------
    @property
    def _centre_shift(self) -> int:
        return (self.span - 1) // 2 - self.pad_lo

    def centre(self, o: int, n: int) -> int:
        """The input index that decides who owns output ``o`` (clamped into ``[0, n-1]``)."""
        return min(max(o * self.stride + self._centre_shift, 0), n - 1)

    def first_output_from(self, a: int, n: int) -> int:
        """Smallest output whose (clamped) centre is ``>= a``: where a block starting at input
        ``a`` starts owning outputs."""
        m = self.out_extent(n)
        if a <= 0:
            return 0
        if a >= n:
            return m
        return min(max(-(-(a - self._centre_shift) // self.stride), 0), m)

    def output_offsets(self, in_offsets: Sequence[int]) -> tuple[int, ...]:
        """Output block offsets for input block offsets ``(0, ..., n)`` (same length)."""
        n = in_offsets[-1]
        return tuple(self.first_output_from(a, n) for a in in_offsets)

    def input_offsets(self, out_offsets: Sequence[int], n: int) -> tuple[int, ...]:
        """Input block offsets (extent ``n``) whose outputs are ``out_offsets``, when such exist
        (the inverse of :meth:`output_offsets`, used by transposed convolution); check with
        :meth:`output_offsets` — with odd padding choices no input split may match."""
        m = out_offsets[-1]
        res = []
        for o0 in out_offsets:
            if o0 <= 0:
                res.append(0)
            elif o0 >= m:
                res.append(n)
            else:
                res.append(min(max(o0 * self.stride + self._centre_shift, 0), n - 1))
        return tuple(res)

    # -- what a block reads -------------------------------------------------------------------
    def read_range(self, o0: int, o1: int, n: int) -> tuple[int, int]:
        """The global input range this block reads from its buffer: :meth:`input_range`
        clipped to ``[0, n)`` (an empty range at the boundary when every window of
        ``[o0, o1)`` lies in the padding), or unclipped when periodic (indices outside
        ``[0, n)`` are the halo's wrapped-around copies)."""
        lo, hi = self.input_range(o0, o1)
        if self.periodic:
            return lo, hi
        if hi <= 0:
            return 0, 0
        if lo >= n:
            return n, n
        return max(lo, 0), min(hi, n)

    def input_range(self, o0: int, o1: int) -> tuple[int, int]:
        """Global input range (unclipped; may leave ``[0, n)``) read by outputs ``[o0, o1)``,
        ``o0 < o1``."""
        lo = o0 * self.stride - self.pad_lo
        return lo, (o1 - 1) * self.stride - self.pad_lo + self.span

    def block_need(self, a: int, b: int, o0: int, o1: int, n: int) -> tuple[int, int]:
        """Cells below ``a`` and above ``b`` (may be negative) that the block ``[a, b)`` owning
        outputs ``[o0, o1)`` reads from inside ``[0, n)``; ``(0, 0)`` when it owns no output."""
        if o1 <= o0:
            return 0, 0
        lo, hi = self.read_range(o0, o1, n)
        if hi <= lo:
            return 0, 0
        return a - lo, hi - b

    def local_pads(self, o0: int, o1: int, n: int) -> tuple[int, int]:
        """Padding the local kernel adds below/above :meth:`read_range` so that it produces
        exactly the outputs ``[o0, o1)`` (none when periodic: the halo carries the
        wrapped-around cells)."""
        if self.periodic:
            return 0, 0
        lo, hi = self.input_range(o0, o1)
        rlo, rhi = self.read_range(o0, o1, n)
        if rhi == rlo and (hi <= 0 or lo >= n):  # only padding: all of it on one side
            return (hi - lo, 0) if hi <= 0 else (0, hi - lo)
        return rlo - lo, hi - rhi

    def halo(self, in_offsets: Sequence[int]) -> tuple[int, int]:
        """One (lo, hi) halo width that serves every block of the split ``in_offsets``."""
        n = in_offsets[-1]
        out = self.output_offsets(in_offsets)
        need_lo = need_hi = 0
        for a, b, o0, o1 in zip(in_offsets[:-1], in_offsets[1:], out[:-1], out[1:]):
            lo, hi = self.block_need(a, b, o0, o1, n)
            need_lo, need_hi = max(need_lo, lo), max(need_hi, hi)
        return need_lo, need_hi


# -- argument normalisation ----------------------------------------------------------------------
def normalize_tuple(value, nd: int, name: str) -> tuple[int, ...]:
    """An int or a length-``nd`` sequence of ints -> tuple of ``nd`` ints."""
    if isinstance(value, (int,)) or hasattr(value, "__index__"):
        return (int(value),) * nd
    value = tuple(int(v) for v in value)
    if len(value) != nd:
        raise ValueError(f"{name} needs {nd} entries (one per spatial axis), got {value}")
    return value


def same_padding(kernel: Sequence[int], dilation: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """PyTorch's ``padding='same'`` for stride 1: total ``dilation*(k-1)``, the odd cell on the
    high side."""
    res = []
    for k, d in zip(kernel, dilation):
        total = d * (k - 1)
        res.append((total // 2, total - total // 2))
    return tuple(res)


def normalize_padding(padding, nd: int, kernel: Sequence[int] | None = None,
                      dilation: Sequence[int] | None = None) -> tuple[tuple[int, int], ...]:
    """``padding`` as ``nd`` (lo, hi) pairs.  Accepts an int, ``'same'``, ``'valid'``, a
    per-axis sequence of ints (symmetric) or of (lo, hi) pairs."""
    if isinstance(padding, str):
        if padding == "valid":
            return ((0, 0),) * nd
        if padding == "same":
            if kernel is None:
                raise ValueError("padding='same' needs the kernel size")
            return same_padding(kernel, dilation or (1,) * nd)
        raise ValueError(f"padding must be an int, a tuple, 'same' or 'valid', got {padding!r}")
    if isinstance(padding, int) or hasattr(padding, "__index__"):
        p = int(padding)
        return ((p, p),) * nd
    padding = tuple(padding)
    if len(padding) != nd:
        raise ValueError(f"padding needs {nd} entries (one per spatial axis), got {padding}")
    res = []
    for p in padding:
        if isinstance(p, int) or hasattr(p, "__index__"):
            res.append((int(p), int(p)))
        else:
            lo, hi = p
            res.append((int(lo), int(hi)))
    return tuple(res)
