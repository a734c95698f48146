"""The CPU convolutions take the read window of a halo'd buffer with its strides
(``strided_x`` of :mod:`disttensor.ops.local.cpu.conv_operands`): every direct variant and the
micro-batch planner's entry give what they give on a contiguous copy of it, and leave the
buffer untouched."""
from __future__ import annotations

import numpy as np
import pytest

from disttensor.ops.local.cpu import conv_direct as D
from disttensor.ops.local.microbatch import cpu_entry

GEO = ((1, 1, 1), (1, 1, 1), (0, 1, 1), (1, 1, 1))   # stride, dilation, pad_lo, pad_hi


def _window(dtype):
    """A depth window of a halo'd buffer (non-contiguous: halo planes cut off) and weights."""
    rng = np.random.default_rng(0)
    buf = rng.standard_normal((3, 4, 9, 5, 6)).astype(dtype)
    return buf, buf[:, :, 1:7], rng.standard_normal((5, 4, 3, 3, 3)).astype(dtype)


@pytest.mark.parametrize("algo", sorted(a for a in D.ALGORITHMS if a != "gemm1x1"))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_direct_passes_on_a_strided_window(algo, dtype):
    buf, x, w = _window(dtype)
    keep = buf.copy()
    assert not x.flags.c_contiguous
    alg, xc = D.ALGORITHMS[algo], np.ascontiguousarray(x)
    y = alg.forward(x, w, *GEO)
    np.testing.assert_array_equal(y, alg.forward(xc, w, *GEO))
    dw = alg.backward_filter(x, y, w.shape[2:], *GEO)
    np.testing.assert_array_equal(dw, alg.backward_filter(xc, y, w.shape[2:], *GEO))
    np.testing.assert_array_equal(buf, keep)


def test_planner_entry_on_a_strided_window():
    buf, x, w = _window(np.float32)
    xc = np.ascontiguousarray(x)
    y = cpu_entry.conv_forward(x, w, *GEO)
    np.testing.assert_allclose(y, cpu_entry.conv_forward(xc, w, *GEO), rtol=1e-5, atol=1e-5)
    dw = cpu_entry.conv_backward_filter(x, y, w.shape[2:], *GEO)
    np.testing.assert_allclose(dw, cpu_entry.conv_backward_filter(xc, y, w.shape[2:], *GEO),
                               rtol=1e-4, atol=1e-4)
