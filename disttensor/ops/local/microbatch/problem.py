"""What the planner plans: a convolution pass on one shape (:class:`ConvProblem`), a division
of its mini-batch (:class:`Plan`) and a (time, workspace) configuration of a layer-pass
(:class:`Config`).  Frozen dataclasses, hashable (problems key the plan store and the
per-problem limits); plans convert to and from JSON for the disk cache.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..cpu.conv_operands import conv_out_shape
from .settings import PASSES

__all__ = ["ConvProblem", "Plan", "Config"]


@dataclass(frozen=True)
class ConvProblem:
    """One convolution pass on one shape.  ``x_shape`` is the convolution's input
    ``(N, Cin, D, H, W)`` (the shape of ``dx`` for ``backward_data``), ``w_shape`` the
    weight's ``(Cout, Cin // groups, kD, kH, kW)``; ``dtype`` a NumPy dtype string."""

    pass_: str
    x_shape: tuple
    w_shape: tuple
    stride: tuple
    dilation: tuple
    pad_lo: tuple
    pad_hi: tuple
    groups: int
    dtype: str

    @staticmethod
    def make(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups, dtype):
        if pass_ not in PASSES:
            raise ValueError(f"pass must be one of {PASSES}, got {pass_!r}")
        t = lambda v: tuple(int(a) for a in v)  # noqa: E731
        return ConvProblem(pass_, t(x_shape), t(w_shape), t(stride), t(dilation), t(pad_lo),
                           t(pad_hi), int(groups), np.dtype(dtype).str)

    @property
    def batch(self) -> int:
        return self.x_shape[0]

    def with_batch(self, b: int) -> "ConvProblem":
        return ConvProblem(self.pass_, (int(b),) + self.x_shape[1:], self.w_shape, self.stride,
                           self.dilation, self.pad_lo, self.pad_hi, self.groups, self.dtype)

    def args(self) -> tuple:
        """``(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups, dtype)``: the
        arguments of an algorithm's ``supports`` and ``workspace_bytes``."""
        return (self.pass_, self.x_shape, self.w_shape, self.stride, self.dilation,
                self.pad_lo, self.pad_hi, self.groups, np.dtype(self.dtype))

    def flops(self) -> float:
        """Multiply-adds times two of the pass (the same for all three passes)."""
        out = conv_out_shape(self.x_shape[2:], self.w_shape[2:], self.stride, self.dilation,
                             self.pad_lo, self.pad_hi)
        return 2.0 * self.x_shape[0] * self.w_shape[0] * math.prod(out) * math.prod(
            self.w_shape[1:])

    def operand_bytes(self) -> int:
        """Bytes of the pass's two activation-sized operands over the whole batch: the input
        ``x`` (or ``dx``) and the output ``y`` (or ``dy``), the same for all three passes."""
        out = conv_out_shape(self.x_shape[2:], self.w_shape[2:], self.stride, self.dilation,
                             self.pad_lo, self.pad_hi)
        n, cin = self.x_shape[:2]
        return np.dtype(self.dtype).itemsize * n * (
            cin * math.prod(self.x_shape[2:]) + self.w_shape[0] * math.prod(out))

    def fields(self) -> dict:
        return {k: getattr(self, k) for k in ("pass_", "x_shape", "w_shape", "stride",
                                              "dilation", "pad_lo", "pad_hi", "groups",
                                              "dtype")}


@dataclass(frozen=True)
class Plan:
    """A division of the mini-batch: ``micro_batches`` is ``((algorithm, size), ...)`` in
    sample order (sizes sum to N); ``seconds`` the predicted (measured or modelled) total,
    ``workspace`` the largest micro-batch's workspace in bytes, ``note`` why a limit was
    exceeded (empty otherwise)."""

    micro_batches: tuple
    seconds: float
    workspace: int
    note: str = ""

    def to_json(self) -> dict:
        return {"micro_batches": [list(m) for m in self.micro_batches],
                "seconds": self.seconds, "workspace": self.workspace, "note": self.note}

    @staticmethod
    def from_json(d) -> "Plan":
        return Plan(tuple((str(a), int(b)) for a, b in d["micro_batches"]),
                    float(d["seconds"]), int(d["workspace"]), str(d.get("note", "")))

    @property
    def algorithms(self) -> tuple:
        return tuple(sorted({a for a, _ in self.micro_batches}))


@dataclass(frozen=True)
class Config:
    """One configuration of a layer-pass for workspace division: its time, its workspace and
    (optionally) the plan that achieves them."""

    seconds: float
    workspace: int
    plan: Plan | None = field(default=None, compare=False)
