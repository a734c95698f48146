"""Replica checks of data-parallel training: every rank must hold bit-identical parameters
and buffers (:func:`check_replicas`, run by :class:`~disttensor.nn.DistributedDataParallel` at
construction, by pipelines and when a checkpoint is loaded)."""
from __future__ import annotations

import hashlib

import numpy as np
from mpi4py import MPI

from ..core.backend import array_module, to_host
from .module import Module

__all__ = ["check_replicas"]


def _digest(a) -> str:
    h = hashlib.blake2b(digest_size=16)
    host = np.ascontiguousarray(to_host(a) if array_module(a) is not np else a)
    h.update(str((host.shape, host.dtype.str)).encode())
    h.update(host.tobytes())
    return h.hexdigest()


def check_replicas(module: Module, comm: MPI.Comm, what: str = "model") -> None:
    """Raise ``ValueError`` on every rank unless each parameter and buffer of ``module`` is
    bit-identical on all ranks of ``comm`` (collective).

    Cheap: each array is reduced to a 16-byte digest of its bytes, the digests of all arrays to
    one, and a single small all-reduce compares that across ranks (see
    :mod:`disttensor.core.agreement`); only on a mismatch are the per-array digests gathered to
    name the arrays that differ.  With ``DISTTENSOR_DEBUG=1`` every value is compared too
    (an element-wise min/max all-reduce per array), and the error gives the largest
    difference between ranks."""
    from ..core import agreement
    names, digests = [], []
    for name, a in list(module.state_dict().items()):
        names.append(name)
        digests.append(_digest(a))
    if comm.size == 1:
        return
    _, differ = agreement.status_allreduce(
        comm, False, agreement.digest("check_replicas", {"names": names, "digests": digests}))
    spread = _value_spread(module, comm) if agreement.DEBUG else {}
    if not differ and not any(spread.values()):
        return
    everyone = comm.allgather((names, digests))
    if any(n != names for n, _ in everyone):
        raise ValueError(f"{what}: the ranks hold different sets of parameters/buffers "
                         f"(rank 0: {everyone[0][0]})")
    for i, name in enumerate(names):
        vals = [d[i] for _, d in everyone]
        if any(v != vals[0] for v in vals) or spread.get(name):
            differ = [r for r, v in enumerate(vals) if v != vals[0]]
            extra = (f"; largest difference between ranks {spread[name]:.6g}"
                     if spread.get(name) else "")
            raise ValueError(f"{what}: {name!r} differs between ranks (ranks {differ} differ "
                             f"from rank 0{extra}); build the model with the same seed on "
                             "every rank or load the same state")


def _value_spread(module: Module, comm: MPI.Comm) -> dict:
    """``DISTTENSOR_DEBUG``: per array, the largest difference between the ranks' values
    (element-wise max minus min over ranks; NaN counts as a difference).  Collective."""
    from ..core.comm import allreduce
    out = {}
    for name, a in module.state_dict().items():
        host = np.asarray(to_host(a) if array_module(a) is not np else a, dtype=np.float64)
        hi = allreduce(comm, host, "max")
        lo = allreduce(comm, host, "min")
        d = np.abs(hi - lo)
        out[name] = float(np.nanmax(np.where(np.isnan(d), np.inf, d))) if d.size else 0.0
    return out
