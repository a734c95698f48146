"""The CPU convolutions' workspace limit relative to a layer-pass's operands
(:func:`disttensor.ops.local.microbatch.settings.relative_workspace_limit`,
:func:`~disttensor.ops.local.microbatch.planner.limit_for`) and its place in the plan key."""
from __future__ import annotations

import numpy as np
import pytest

from disttensor.ops.local import microbatch as mb
from disttensor.ops.local.microbatch.problem import ConvProblem
from disttensor.ops.local.microbatch.settings import (relative_workspace_limit, workspace_ratio,
                                                      workspace_rule)
from disttensor.ops.local.microbatch.sharing import family_of, nearest_similar

MiB = 2 ** 20


def _problem(pass_="forward", x=(4, 4, 16, 16, 16), w=(16, 4, 3, 3, 3), pad=1, dtype="f4"):
    p = (pad,) * 3
    return ConvProblem.make(pass_, x, w, (1, 1, 1), (1, 1, 1), p, p, 1, dtype)


@pytest.mark.parametrize("pass_", ["forward", "backward_data", "backward_filter"])
@pytest.mark.parametrize("pad,dtype", [(1, "f4"), (0, "f8")])
def test_operand_bytes_counts_input_and_output_over_the_batch(pass_, pad, dtype):
    prob = _problem(pass_, x=(3, 4, 10, 9, 8), w=(6, 4, 3, 3, 3), pad=pad, dtype=dtype)
    out = tuple(n + 2 * pad - 2 for n in (10, 9, 8))
    x = np.zeros((3, 4, 10, 9, 8), dtype)
    y = np.zeros((3, 6) + out, dtype)
    assert prob.operand_bytes() == x.nbytes + y.nbytes


def test_relative_limit_is_the_larger_of_the_floor_and_the_ratio():
    assert relative_workspace_limit(10 * MiB, None, 0.5) == 64 * MiB          # floor
    assert relative_workspace_limit(640 * MiB, None, 0.5) == 320 * MiB
    assert relative_workspace_limit(640 * MiB, None, 0.0) == 64 * MiB         # ratio off
    assert relative_workspace_limit(640 * MiB, "8", 0.5) == 8 * MiB           # explicit cap
    assert relative_workspace_limit(640 * MiB, "1000", 0.0) == 1000 * MiB


def test_rule_from_the_environment(monkeypatch):
    monkeypatch.delenv("DISTTENSOR_CONV_WORKSPACE_MB", raising=False)
    monkeypatch.delenv("DISTTENSOR_CONV_WORKSPACE_RATIO", raising=False)
    assert workspace_rule() == (None, 0.5)
    monkeypatch.setenv("DISTTENSOR_CONV_WORKSPACE_RATIO", "off")
    assert workspace_ratio() == 0.0 and workspace_rule() == (None, 0.0)
    monkeypatch.setenv("DISTTENSOR_CONV_WORKSPACE_RATIO", "-1")
    with pytest.raises(ValueError, match="RATIO"):
        workspace_ratio()
    monkeypatch.setenv("DISTTENSOR_CONV_WORKSPACE_MB", "32")   # an explicit limit: no ratio
    assert workspace_rule() == ("32", 0.0)


def test_limit_for_relative_only_where_asked_and_overrides_win(monkeypatch):
    monkeypatch.delenv("DISTTENSOR_CONV_WORKSPACE_MB", raising=False)
    monkeypatch.setenv("DISTTENSOR_CONV_WORKSPACE_RATIO", "0.5")
    big = _problem(x=(4, 4, 128, 128, 128))   # 640 MiB of operands in float32
    assert big.operand_bytes() == 640 * MiB
    assert mb.limit_for(big) == 64 * MiB
    assert mb.limit_for(big, relative=True) == 320 * MiB
    assert mb.limit_for(_problem(), relative=True) == 64 * MiB
    monkeypatch.setenv("DISTTENSOR_CONV_WORKSPACE_MB", "16")
    assert mb.limit_for(big, relative=True) == 16 * MiB
    try:
        mb.set_limit_override(big, 5 * MiB)
        assert mb.limit_for(big, relative=True) == 5 * MiB
    finally:
        mb.set_limit_override(big, None)


def _fields(x, limit, rule):
    f = dict(fingerprint={"device": "cpu"}, problem=_problem(x=x).fields(), limit=limit,
             policy="powerOfTwo", mode="benchmark", algorithms=["a"], margin=0.1)
    if rule is not None:
        f["limit_rule"] = rule
    return f


def test_similar_shapes_under_the_same_rule_share_a_family_whatever_their_limits():
    a = _fields((4, 4, 64, 64, 64), 320 * MiB, [None, 0.5])
    b = _fields((4, 4, 34, 64, 64), 170 * MiB, [None, 0.5])
    assert family_of(a) == family_of(b)
    assert nearest_similar(b, [{"key": a, "plan": "p"}], 2) == "p"
    assert family_of(a) != family_of(_fields((4, 4, 64, 64, 64), 320 * MiB, [None, 0.25]))
    # without a rule the limit's value stays part of the family
    assert family_of(_fields((4, 4, 64, 64, 64), 1, None)) != \
        family_of(_fields((4, 4, 34, 64, 64), 2, None))
