"""The pure index math of read-time crops and augmentation (disttensor.io.augment): reading
the box read_box names and orienting it gives exactly the output block of np.flip/np.transpose
of the whole cropped array, for any view and any block."""
from __future__ import annotations

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

from disttensor.io import augment as au  # noqa: E402


@st.composite
def cases(draw):
    cubic = draw(st.booleans())
    if cubic:
        n = draw(st.integers(1, 7))
        spatial = (n, n, n)
    else:
        spatial = tuple(draw(st.integers(1, 7)) for _ in range(3))
    if cubic:
        c = draw(st.integers(1, spatial[0]))
        size = (c, c, c)
    else:
        size = tuple(draw(st.integers(1, n)) for n in spatial)
    offset = tuple(draw(st.integers(0, n - c)) for n, c in zip(spatial, size))
    flips = tuple(draw(st.booleans()) for _ in range(3))
    perm = tuple(draw(st.permutations(range(3)))) if len(set(size)) == 1 else (0, 1, 2)
    view = au.View(offset, size, flips, perm)
    out = view.out_shape
    lo = tuple(draw(st.integers(0, n)) for n in out)
    hi = tuple(draw(st.integers(a, n)) for a, n in zip(lo, out))
    lead = draw(st.sampled_from([0, 1]))
    return spatial, view, lo, hi, lead


@settings(max_examples=300, deadline=None)
@given(cases())
def test_block_of_view_equals_numpy_flip_transpose(case):
    spatial, view, lo, hi, lead = case
    shape = ((2,) if lead else ()) + spatial
    x = np.arange(int(np.prod(shape))).reshape(shape)
    want = au.apply_view(view, x, lead)
    # the reference: crop, np.flip, np.transpose of the whole array
    sl = tuple([slice(None)] * lead + [slice(o, o + c) for o, c in zip(view.offset, view.size)])
    ref = x[sl]
    for a in range(3):
        if view.flips[a]:
            ref = np.flip(ref, lead + a)
    ref = np.transpose(ref, tuple(range(lead)) + tuple(lead + p for p in view.perm))
    np.testing.assert_array_equal(want, ref)
    assert want.shape[lead:] == view.out_shape
    rs, re = au.read_box(view, lo, hi)
    assert all(0 <= a <= b <= n for a, b, n in zip(rs, re, spatial))
    block = x[tuple([slice(None)] * lead + [slice(a, b) for a, b in zip(rs, re)])]
    got = au.orient(view, block, lead)
    np.testing.assert_array_equal(got, ref[tuple([slice(None)] * lead +
                                                 [slice(a, b) for a, b in zip(lo, hi)])])


def test_draw_view_is_a_pure_function_of_seed_epoch_sample():
    a = au.draw_view(3, 1, 7, (9, 8, 8), (4, 4, 4), flip=True, permute=True)
    assert a == au.draw_view(3, 1, 7, (9, 8, 8), (4, 4, 4), flip=True, permute=True)
    views = {au.draw_view(3, e, s, (9, 8, 8), (4, 4, 4), flip=True, permute=True)
             for e in range(3) for s in range(10)}
    assert len(views) > 20
    # switching augmentation on keeps the crop offsets
    plain = au.draw_view(3, 1, 7, (9, 8, 8), (4, 4, 4))
    assert plain.offset == a.offset and plain.is_identity
    assert all(0 <= o <= n - 4 for o, n in zip(a.offset, (9, 8, 8)))
    # centred crops
    c = au.draw_view(3, 1, 7, (9, 8, 8), (4, 3, 4), random_crop=False)
    assert c.offset == (2, 2, 2)
    # every flip and permutation is drawn
    seen = [au.draw_view(0, 0, s, (4, 4, 4), (4, 4, 4), flip=True, permute=True)
            for s in range(200)]
    assert {v.perm for v in seen} == {(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1),
                                      (2, 1, 0)}
    assert all(0.3 < np.mean([v.flips[a] for v in seen]) < 0.7 for a in range(3))


def test_check_crop():
    assert au.check_crop((8, 8, 8), None) == (8, 8, 8)
    assert au.check_crop((8, 9, 8), 4) == (4, 4, 4)
    assert au.check_crop((8, 9, 8), (4, 5, 6)) == (4, 5, 6)
    with pytest.raises(ValueError, match="larger than"):
        au.check_crop((8, 8, 8), (4, 9, 4))
    with pytest.raises(ValueError, match="positive"):
        au.check_crop((8, 8, 8), (4, 0, 4))
    with pytest.raises(ValueError, match="positive"):
        au.check_crop((8, 8, 8), (4, 4))
    with pytest.raises(ValueError, match="cubic"):
        au.check_crop((8, 8, 8), (4, 5, 4), permute=True)
    with pytest.raises(ValueError, match="cubic"):
        au.check_crop((8, 6, 8), None, permute=True)
