"""512-bit SIMD vectors for Numba: the vector type and intrinsics the register-blocked
micro-kernels of :mod:`.microkernels` are written in.

:class:`Vec512` is an LLVM ``<16 x float>`` / ``<8 x double>`` value; :func:`vload`,
:func:`vstore`, :func:`vzero`, :func:`vbcast`, :func:`vfma` and :func:`vadd` are Numba
``@intrinsic`` s emitting one LLVM instruction each, so LLVM emits AVX-512 where the CPU has it
(and splits the vectors into AVX2/SSE halves where it has not: still correct, slower).
Loads and stores take a 1-d contiguous array and a flat element index and do no bounds
check; :func:`vlanes` is the lane count as a compile-time constant and
:func:`item_unchecked` a scalar load without Numba's wraparound and bounds logic.  Usable only
inside ``@njit`` code.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

__all__ = ["Vec512", "vload", "vstore", "vzero", "vbcast", "vfma", "vadd", "vlanes",
           "item_unchecked"]


class Vec512(types.Type):
    """A 512-bit SIMD value of ``dtype`` lanes (16 float32 or 8 float64)."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.lanes = 512 // dtype.bitwidth
        super().__init__(name=f"Vec512({dtype})")


@register_model(Vec512)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(
            dmm.lookup(fe_type.dtype).get_value_type(), fe_type.lanes))


def _elem_ptr(context, builder, aty, arr, idxty, idx):
    a = context.make_array(aty)(context, builder, arr)
    return builder.gep(a.data, [context.cast(builder, idx, idxty, types.intp)])


@intrinsic
def vload(typingctx, arr, idx):
    """``arr[idx : idx + lanes]`` as a vector (1-d contiguous ``arr``; no bounds check)."""
    vt = Vec512(arr.dtype)

    def codegen(context, builder, sig, args):
        vty = context.get_value_type(vt)
        p = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        return builder.load(builder.bitcast(p, vty.as_pointer()),
                            align=arr.dtype.bitwidth // 8)
    return vt(arr, idx), codegen


@intrinsic
def vstore(typingctx, arr, idx, v):
    """``arr[idx : idx + lanes] = v`` (no bounds check)."""
    def codegen(context, builder, sig, args):
        vty = context.get_value_type(sig.args[2])
        p = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        builder.store(args[2], builder.bitcast(p, vty.as_pointer()),
                      align=arr.dtype.bitwidth // 8)
        return context.get_dummy_value()
    return types.none(arr, idx, v), codegen


@intrinsic
def vzero(typingctx, arr):
    """A zero vector of ``arr``'s dtype."""
    vt = Vec512(arr.dtype)

    def codegen(context, builder, sig, args):
        return ir.Constant(context.get_value_type(vt), None)
    return vt(arr), codegen


@intrinsic
def vbcast(typingctx, arr, idx):
    """``arr[idx]`` in every lane."""
    vt = Vec512(arr.dtype)

    def codegen(context, builder, sig, args):
        vty = context.get_value_type(vt)
        p = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        v = builder.insert_element(ir.Constant(vty, ir.Undefined), builder.load(p),
                                   ir.Constant(ir.IntType(32), 0))
        return builder.shuffle_vector(
            v, ir.Constant(vty, ir.Undefined),
            ir.Constant(ir.VectorType(ir.IntType(32), vt.lanes), [0] * vt.lanes))
    return vt(arr, idx), codegen


@intrinsic
def vfma(typingctx, a, b, c):
    """``a * b + c`` lane by lane, fused (``llvm.fma``)."""
    def codegen(context, builder, sig, args):
        vt = sig.args[0]
        vty = context.get_value_type(vt)
        name = f"llvm.fma.v{vt.lanes}{'f32' if vt.dtype.bitwidth == 32 else 'f64'}"
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty] * 3),
                                            name)
        return builder.call(fn, args)
    return a(a, b, c), codegen


@intrinsic
def vadd(typingctx, a, b):
    """``a + b`` lane by lane."""
    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])
    return a(a, b), codegen


@intrinsic
def vlanes(typingctx, arr):
    """Lanes of a 512-bit vector of ``arr``'s dtype, as a compile-time constant."""
    lanes = 512 // arr.dtype.bitwidth

    def codegen(context, builder, sig, args):
        return context.get_constant(types.intp, lanes)
    return types.intp(arr), codegen


@intrinsic
def item_unchecked(typingctx, arr, idx):
    """``arr[idx]`` without the negative-index wraparound and bounds logic."""
    def codegen(context, builder, sig, args):
        return builder.load(_elem_ptr(context, builder, sig.args[0], args[0], sig.args[1],
                                      args[1]))
    return arr.dtype(arr, idx), codegen
