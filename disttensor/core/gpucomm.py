"""How CuPy arrays travel between ranks: NCCL communicators bootstrapped over MPI, CUDA-aware
MPI, or reused pinned host buffers; and which of them runs (``python -m disttensor.info``).

Three paths, chosen per MPI communicator, the same on every rank of it:

* **NCCL** (``cupy.cuda.nccl``) for sums of device arrays (:func:`device_allreduce`): one
  ``NcclCommunicator`` per MPI communicator, made on first use (collective): rank 0 draws the
  unique id, MPI broadcasts it, every rank joins with its MPI rank.  Calls are stream-ordered:
  the all-reduce is queued on the caller's (or CuPy's current) stream, after the kernels that
  produced the buffer and before those that read it, with no host synchronisation.  NCCL is
  tried only where every rank of the communicator drives a different GPU (an all-gather of
  ``(host, device PCI bus id)`` first: NCCL refuses two ranks on one device), where
  ``DISTTENSOR_NCCL`` is not ``0``, and where ``cupy.cuda.nccl`` imports; an initialisation
  that fails on any rank falls back on every rank (agreed by one all-reduce), with the reason
  kept for :func:`gpu_paths`.
* **CUDA-aware MPI** (:func:`disttensor.core.comm.cuda_aware_mpi`): device buffers go to MPI
  directly after the stream is synchronised.
* **Pinned host staging** otherwise: device -> page-locked host buffer -> MPI -> page-locked
  buffer -> device.  The halo/redistribution exchanges
  (:class:`disttensor.core.comm.PieceExchange`) make their page-locked scratch once and reuse
  it for every exchange; the gradient buckets of :mod:`disttensor.nn.parallel` are page-locked
  (the copies then run at full link speed; allocating page-locked memory per message would
  cost more than the copy).

CuPy is imported lazily; on a machine without it this module imports, and every query answers
"no GPU".
"""
from __future__ import annotations

import os

import numpy as np
from mpi4py import MPI

__all__ = ["nccl_communicator", "nccl_reason", "device_allreduce", "device_allgather",
           "gpu_paths", "NCCL_DTYPES"]

# NumPy dtype name -> the cupy.cuda.nccl datatype constant's name
NCCL_DTYPES = {"float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32",
               "float64": "NCCL_FLOAT64", "int32": "NCCL_INT32", "int64": "NCCL_INT64",
               "uint8": "NCCL_UINT8", "int8": "NCCL_INT8", "uint32": "NCCL_UINT32",
               "uint64": "NCCL_UINT64"}
_NCCL_OPS = {"sum": "NCCL_SUM", "prod": "NCCL_PROD", "min": "NCCL_MIN", "max": "NCCL_MAX"}

_KEYVAL = None  # MPI attribute holding (NcclCommunicator or None, reason) on its communicator


def _destroy(comm, keyval, entry) -> None:
    """Attribute delete callback: the NCCL communicator goes with its MPI communicator."""
    nc = entry[0]
    if nc is not None:
        try:
            nc.destroy()
        except Exception:  # noqa: BLE001 - CUDA may already be torn down at exit
            pass


def _nccl_module():
    """``cupy.cuda.nccl`` or None (not installed, or no NCCL library)."""
    try:
        from cupy.cuda import nccl
        if not getattr(nccl, "available", True):
            return None
        return nccl
    except Exception:  # noqa: BLE001 - ImportError, missing libnccl, no CUDA
        return None


def _device_identity():
    """``(host name, PCI bus id of CuPy's current device)`` of this rank."""
    import cupy
    dev = cupy.cuda.Device()
    try:
        bus = dev.pci_bus_id
    except Exception:  # noqa: BLE001 - older CuPy: the ordinal is all we know
        bus = f"ordinal {dev.id}"
    return MPI.Get_processor_name(), bus


def nccl_communicator(comm: MPI.Comm):
    """The ``NcclCommunicator`` spanning the ranks of ``comm`` (CuPy's current device on each),
    or ``None`` where NCCL cannot be used on it (:func:`nccl_reason` says why).  Collective on
    the first call for ``comm``; then cached as an MPI attribute of ``comm`` (every rank has the
    same answer; freed with ``comm``, so a later communicator reusing its handle starts
    afresh)."""
    global _KEYVAL
    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval(delete_fn=_destroy)
    entry = comm.Get_attr(_KEYVAL)
    if entry is None:
        entry = _make_nccl(comm)
        comm.Set_attr(_KEYVAL, entry)
    return entry[0]


def nccl_reason(comm: MPI.Comm) -> str | None:
    """Why :func:`nccl_communicator` gave ``None`` for ``comm`` (None: not asked yet, or NCCL
    runs)."""
    entry = None if _KEYVAL is None else comm.Get_attr(_KEYVAL)
    return None if entry is None else entry[1]


def _make_nccl(comm: MPI.Comm):
    """``(communicator or None, reason)``; collective over ``comm``.  Every rank takes the
    same branch: the decisions are made on allgathered or agreed values."""
    if os.environ.get("DISTTENSOR_NCCL", "1").lower() in ("0", "false", "no", "off"):
        return None, "disabled by DISTTENSOR_NCCL=0"
    nccl = _nccl_module()
    have = comm.allreduce(int(nccl is not None), op=MPI.MIN)
    if not have:
        return None, "cupy.cuda.nccl is not available on every rank"
    ids = comm.allgather(_device_identity())
    if len(set(ids)) < len(ids):
        return None, "two ranks drive the same GPU (NCCL needs one device per rank)"
    uid = nccl.get_unique_id() if comm.rank == 0 else None
    uid = comm.bcast(uid, root=0)
    nc, err = None, None
    try:
        nc = nccl.NcclCommunicator(comm.size, uid, comm.rank)
    except Exception as e:  # noqa: BLE001 - e.g. no network transport between the devices
        err = f"{type(e).__name__}: {e}"
    failed = comm.allreduce(int(nc is None), op=MPI.MAX)
    if failed:
        if nc is not None:
            try:
                nc.destroy()
            except Exception:  # noqa: BLE001
                pass
        return None, f"NCCL initialisation failed ({err or 'on another rank'})"
    return nc, None


def device_allreduce(comm: MPI.Comm, arr, op: str = "sum", stream=None):
    """``arr`` (a C-contiguous CuPy array) reduced elementwise over ``comm`` IN PLACE on the
    device with NCCL, queued on ``stream`` (default: CuPy's current stream), and returned; or
    ``None`` where NCCL is not used on ``comm`` or does not take this dtype/op (the caller
    then takes an MPI path).  Collective; every rank must pass the same shape, dtype and op."""
    nc = nccl_communicator(comm)
    if nc is None:
        return None
    name = NCCL_DTYPES.get(np.dtype(arr.dtype).name)
    if name is None or op not in _NCCL_OPS or not arr.flags.c_contiguous:
        return None
    from cupy.cuda import nccl
    import cupy
    s = stream if stream is not None else cupy.cuda.get_current_stream()
    ptr = arr.data.ptr
    nc.allReduce(ptr, ptr, arr.size, getattr(nccl, name), getattr(nccl, _NCCL_OPS[op]), s.ptr)
    return arr


def device_allgather(comm: MPI.Comm, arr, stream=None):
    """``(comm.size, arr.size)``: every rank's 1-D CuPy array ``arr`` in rank order, gathered
    on the device with NCCL (queued on ``stream``, default CuPy's current one); ``None`` where
    NCCL is not used on ``comm`` or not for this dtype.  Collective; the same size and dtype on
    every rank."""
    nc = nccl_communicator(comm)
    name = NCCL_DTYPES.get(np.dtype(arr.dtype).name)
    if nc is None or name is None:
        return None
    from cupy.cuda import nccl
    import cupy
    s = stream if stream is not None else cupy.cuda.get_current_stream()
    send = cupy.ascontiguousarray(arr.reshape(-1))
    out = cupy.empty((comm.size, send.size), dtype=send.dtype)
    nc.allGather(send.data.ptr, out.data.ptr, send.size, getattr(nccl, name), s.ptr)
    return out


def gpu_paths(comm: MPI.Comm | None = None) -> dict:
    """Which path runs, for ``python -m disttensor.info``: ``{"gradient sums": ...,
    "halo exchange": ...}``, each ``"NCCL"``, ``"CUDA-aware MPI"`` or ``"host staging
    (pinned)"`` (with the reason NCCL is not used, where asked).  ``comm`` (default
    COMM_WORLD) is asked for its NCCL communicator: collective."""
    from .backend import gpu_available
    from .comm import cuda_aware_mpi
    if not gpu_available():
        return {"gradient sums": "no GPU", "halo exchange": "no GPU"}
    comm = MPI.COMM_WORLD if comm is None else comm
    mpi_path = "CUDA-aware MPI" if cuda_aware_mpi() else "host staging (pinned)"
    if comm.size == 1:
        sums = "none needed (1 rank)"
    elif nccl_communicator(comm) is not None:
        sums = "NCCL"
    else:
        sums = f"{mpi_path} (NCCL not used: {nccl_reason(comm)})"
    return {"gradient sums": sums, "halo exchange": mpi_path}
