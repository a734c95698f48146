"""``CSBMatrix``: a local (one process, no MPI) sparse matrix in Compressed Sparse Blocks
(Buluç, Fineman, Frigo, Gilbert, Leiserson, SPAA'09), float32 or float64, on the CPU (NumPy
arrays, Numba kernels) or a CUDA GPU (CuPy arrays, RawKernels).

One structure serves both products at the same speed: ``A @ X`` runs over block-rows and
``A.T @ X`` over block-columns of the same blocks (no CSR/CSC copy), and ``sddmm(A, dY, X)``
gives the values of ``dY @ X.T`` at A's nonzeros, the weight gradient of ``Y = A @ X``.  The
layout (blocks, Z-Morton order, compact indices) is described in :mod:`.structure`,
:mod:`.blocking` and :mod:`.morton`.

Differences from NumPy / SciPy: operands of ``@`` and :func:`sddmm` must have the matrix's
dtype (``TypeError`` instead of a silent promotion; use :meth:`CSBMatrix.astype`) and live on
its device; ``@`` takes 1-D and 2-D right-hand sides only; construction keeps explicit zeros
of ``from_coo``/``from_scipy`` (as ``scipy.sparse`` does), ``from_dense`` stores the nonzeros
only; integer and bool input becomes float64, float16 becomes float32.
"""
from __future__ import annotations

import numpy as np

from ..core.backend import array_module, device_of, normalize_device, to_host
from .blocking import choose_block_size
from .structure import CSBStructure, assemble, value_dtype

__all__ = ["CSBMatrix", "sddmm"]


def _shape2(shape):
    try:
        m, n = (int(s) for s in shape)
    except (TypeError, ValueError):
        raise ValueError(f"shape must be a pair of ints, got {shape!r}") from None
    if m < 0 or n < 0:
        raise ValueError(f"negative dimensions in shape {(m, n)}")
    return m, n


def _block_size(shape, block_size, itemsize):
    if block_size is None:
        return choose_block_size(shape, itemsize=itemsize)
    b = int(block_size)
    if b < 1 or b & (b - 1):
        raise ValueError(f"block_size must be a power of two >= 1, got {block_size!r}")
    return b


class CSBMatrix:
    """A sparse ``(m, n)`` matrix in Compressed Sparse Blocks.

    Build it with :meth:`from_dense`, :meth:`from_coo` or :meth:`from_scipy`.  ``A @ X`` and
    ``A.T @ X`` take ``X`` of shape ``(n,)`` or ``(n, k)`` (any ``k``; NumPy on the CPU, CuPy
    on the GPU) and return a new dense array ``(m,)`` / ``(m, k)`` of A's dtype.  ``A.T`` is a
    view: the same structure and values, transposed, nothing copied.  ``values`` are the
    stored nonzeros in storage order (block-row-major blocks, Z-Morton order inside a block),
    the order :meth:`with_values`, :meth:`to_coo` and :func:`sddmm` use; ``A.T`` has the same
    storage order as ``A``."""

    __array_priority__ = 100    # ndarray @ A defers to __rmatmul__

    def __init__(self, structure: CSBStructure, values, transposed: bool = False):
        self._s = structure
        self._v = values
        self._t = bool(transposed)

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def from_coo(cls, rows, cols, values, shape, block_size=None):
        """The matrix of ``shape`` with ``values[i]`` at ``(rows[i], cols[i])`` (1-D arrays of
        one length; integer indices in range, else ``IndexError``); duplicates are summed,
        explicit zeros kept.  ``block_size`` (a power of two) overrides
        :func:`~.blocking.choose_block_size`.  CuPy ``values`` give a matrix on the GPU (the
        structure is assembled on the host)."""
        m, n = _shape2(shape)
        device = device_of(values)
        rows, cols, vals = (to_host(a) if device_of(a) != "cpu" else np.asarray(a)
                            for a in (rows, cols, values))
        beta = _block_size((m, n), block_size, value_dtype(vals.dtype).itemsize)
        structure, stored = assemble(rows, cols, vals, (m, n), beta)
        return cls(structure, stored).to_device(device)

    @classmethod
    def from_dense(cls, a, block_size=None):
        """The nonzeros of the 2-D array ``a`` (NumPy or CuPy; a CuPy input gives a matrix on
        the GPU)."""
        device = device_of(a)
        a = to_host(a) if device != "cpu" else np.asarray(a)
        if a.ndim != 2:
            raise ValueError(f"from_dense needs a 2-D array, got {a.ndim}-D")
        rows, cols = np.nonzero(a)
        out = cls.from_coo(rows, cols, a[rows, cols].astype(value_dtype(a.dtype)), a.shape,
                           block_size)
        return out.to_device(device)

    @classmethod
    def from_scipy(cls, m, block_size=None):
        """The matrix of a ``scipy.sparse`` matrix or array (any format; its stored entries,
        explicit zeros included, duplicates summed)."""
        try:
            coo = m.tocoo()
        except AttributeError:
            raise TypeError(f"from_scipy needs a scipy.sparse matrix, got "
                            f"{type(m).__name__}") from None
        if len(coo.shape) != 2:
            raise ValueError(f"from_scipy needs a 2-D matrix, got shape {coo.shape}")
        return cls.from_coo(coo.row, coo.col, coo.data, coo.shape, block_size)

    # ---- properties --------------------------------------------------------------------------
    @property
    def shape(self):
        m, n = self._s.shape
        return (n, m) if self._t else (m, n)

    @property
    def ndim(self):
        return 2

    @property
    def dtype(self):
        return self._v.dtype

    @property
    def nnz(self):
        """The number of stored nonzeros (explicit zeros included)."""
        return self._s.nnz

    @property
    def density(self):
        """``nnz / (m * n)`` (0.0 for an empty shape)."""
        m, n = self._s.shape
        return self.nnz / (m * n) if m * n else 0.0

    @property
    def block_size(self):
        return self._s.beta

    @property
    def values(self):
        """The stored nonzeros in storage order (the array itself, not a copy)."""
        return self._v

    @property
    def device(self):
        """``'cpu'`` or ``'cuda'``."""
        return self._s.device

    @property
    def structure(self) -> CSBStructure:
        """The shared sparsity structure (of the stored, untransposed matrix)."""
        return self._s

    @property
    def T(self):
        """The transpose: a view sharing this matrix's structure and values."""
        return CSBMatrix(self._s, self._v, not self._t)

    def __repr__(self):
        return (f"CSBMatrix(shape={self.shape}, nnz={self.nnz}, dtype={self.dtype}, "
                f"block_size={self.block_size}, device={self.device!r}"
                f"{', transposed view' if self._t else ''})")

    # ---- new matrices of the same structure -------------------------------------------------
    def with_values(self, v):
        """The matrix of this structure with ``v`` (1-D, ``nnz`` entries, storage order, an
        array of this matrix's device) as its values; the dtype is ``v``'s (float32/float64;
        ints become float64)."""
        xp = array_module(v)
        if device_of(v) != self.device:
            raise TypeError(f"values on {device_of(v)} for a matrix on {self.device}")
        if v.ndim != 1 or v.shape[0] != self.nnz:
            raise ValueError(f"with_values needs {self.nnz} values (1-D), got shape {v.shape}")
        v = xp.ascontiguousarray(v, dtype=value_dtype(v.dtype))
        return CSBMatrix(self._s, v, self._t)

    def astype(self, dtype, copy=True):
        """This matrix with values of ``dtype`` (float32 or float64)."""
        dt = np.dtype(dtype)
        if dt not in (np.float32, np.float64):
            raise TypeError(f"CSB matrices hold float32 or float64 values, got {dt}")
        if dt == self.dtype and not copy:
            return self
        return CSBMatrix(self._s, self._v.astype(dt), self._t)

    def to_device(self, device):
        """This matrix on ``device`` (``'cpu'`` or ``'cuda'``; no copy when already there)."""
        device = normalize_device(device)
        if device == self.device:
            return self
        s = self._s.to_device(device)
        if device == "cuda":
            import cupy as cp
            return CSBMatrix(s, cp.asarray(self._v), self._t)
        return CSBMatrix(s, self._v.get(), self._t)

    # ---- conversions ------------------------------------------------------------------------
    def to_coo(self):
        """``(rows, cols, values)`` of the stored nonzeros in storage order (indices
        ``int64``; arrays of this matrix's device)."""
        r, c = self._s.coordinates()
        if self._t:
            r, c = c, r
        if self.device != "cpu":
            import cupy as cp
            return cp.asarray(r), cp.asarray(c), self._v
        return r, c, self._v

    def to_dense(self):
        """The dense ``(m, n)`` array (of this matrix's device)."""
        r, c = self._s.coordinates()
        out = np.zeros(self._s.shape, dtype=self.dtype)
        out[r, c] = to_host(self._v)
        out = out.T.copy() if self._t else out
        if self.device != "cpu":
            import cupy as cp
            return cp.asarray(out)
        return out

    def toarray(self):
        """The dense array (``scipy.sparse`` spelling of :meth:`to_dense`)."""
        return self.to_dense()

    def to_scipy(self):
        """A ``scipy.sparse.csr_array`` with the same entries (explicit zeros kept; needs
        SciPy)."""
        import scipy.sparse as sps
        r, c = self._s.coordinates()
        if self._t:
            r, c = c, r
        return sps.csr_array((to_host(self._v), (r, c)), shape=self.shape)

    # ---- products ----------------------------------------------------------------------------
    def __matmul__(self, x):
        from .products import matmul
        return matmul(self, x)

    def __rmatmul__(self, x):
        """``x @ A`` = ``(A.T @ x.T).T`` (1-D ``x``: ``A.T @ x``)."""
        from .products import matmul
        if getattr(x, "ndim", None) == 2:
            return matmul(self.T, x.T).T
        return matmul(self.T, x)

    def matmul(self, x):
        """``self @ x``."""
        return self @ x


def sddmm(a: CSBMatrix, dy, x):
    """The values of ``dy @ x.T`` at ``a``'s nonzeros, in ``a``'s storage order (a 1-D array
    of ``a.nnz`` entries, ``a``'s dtype and device): for ``a`` of shape ``(m, n)``, ``dy`` is
    ``(m, k)`` and ``x`` ``(n, k)`` (or both 1-D: ``k = 1``).  With ``Y = A @ X`` this is
    ``dL/dA`` restricted to the structure, given ``dY = dL/dY``; ``a.with_values(...)`` turns
    it into a matrix."""
    from .products import sampled_dense_dense
    return sampled_dense_dense(a, dy, x)
