"""Pure parts of collective argument agreement: tokens and digests (no MPI traffic)."""
import copy
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from disttensor.core import agreement
from disttensor.core.agreement import describe, digest, token
from disttensor.core.distribution import Distribution

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8),
                    st.floats(allow_nan=True), st.binary(max_size=8))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner),
    st.dictionaries(st.text(max_size=4), inner, max_size=3)), max_leaves=12)


@given(values)
def test_equal_values_give_equal_digests(v):
    """What another rank would compute from an equal value (a copy, or one that went through
    pickling as if sent by MPI) has the same digest."""
    for w in (copy.deepcopy(v), pickle.loads(pickle.dumps(v))):
        assert digest("call", {"a": v}) == digest("call", {"a": w})


@given(values, values)
def test_different_tokens_give_different_digests(v, w):
    if repr(token(v)) != repr(token(w)):
        assert digest("call", {"a": v}) != digest("call", {"a": w})


def test_the_call_name_and_argument_names_count():
    assert digest("sum", {"axis": 0}) != digest("max", {"axis": 0})
    assert digest("sum", {"axis": 0}) != digest("sum", {"keepdims": 0})
    assert digest("sum", {"a": 1, "b": 2}) != digest("sum", {"a": 2, "b": 1})


def test_tokens_tell_apart_what_numpy_equality_would_merge():
    def d(v):
        return digest("f", {"v": v})
    assert d(1) != d(1.0) and d(True) != d(1)
    assert d(0.0) != d(-0.0)           # a sign that changes a result
    assert d(float("nan")) == d(float("nan"))  # and NaN equals itself
    assert d([1, 2]) != d((1, 2))
    assert token(np.float32) == token(np.dtype("float32")) != token(np.float64)
    assert token(np.int64(3)) == token(3)
    assert token(slice(0, 4)) != token(slice(0, 4, 2))


def test_arrays_compare_by_shape_and_dtype_unless_debug(monkeypatch):
    a, b = np.zeros((2, 3)), np.ones((2, 3))
    assert token(a) == token(b) != token(a.astype(np.float32)) and token(a) != token(a.T)
    monkeypatch.setattr(agreement, "DEBUG", True)
    assert token(a) != token(b) and token(a) == token(a.copy())
    assert "digest=" in describe(a)


def test_distributions_compare_by_value():
    d1 = Distribution((6, 4), (2,), (0, None))
    d2 = Distribution((6, 4), (2,), (0, None), sizes=((3, 3), None))
    d3 = Distribution((6, 4), (2,), (0, None), sizes=((4, 2), None))
    assert digest("f", {"d": d1}) == digest("f", {"d": d2}) != digest("f", {"d": d3})


def test_describe_is_short():
    assert describe(list(range(1000)), 40).endswith("...") and len(describe(list(range(1000)),
                                                                          40)) == 40


@pytest.mark.parametrize("v", [object(), lambda: 0, print])
def test_tokens_of_odd_values_do_not_raise(v):
    token(v)
    digest("f", {"v": v})


def test_object_addresses_do_not_count():
    """Two processes hold equal objects at different addresses."""
    class Opaque:
        pass
    assert token(Opaque()) == token(Opaque())
