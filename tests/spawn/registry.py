"""Registry of rank-mismatch cases for ``tests/spawn`` (each case runs in its own ``mpiexec``).

A case is a function ``fn(ctx)`` registered with :func:`case`; it runs on every rank of a
fresh MPI job and must raise ``expect`` (with a message matching ``match``) on *every* rank,
within ``limit`` seconds, and leave the ranks able to finalize (no rank stuck in a
collective).  ``ctx`` gives ``comm`` (``MPI.COMM_WORLD``), ``rank``, ``size``, ``tmp`` (a
directory shared by the ranks, made fresh for the case) and :meth:`Ctx.per_rank`
(``ctx.per_rank(bad, good)``: ``bad`` on the last rank, ``good`` elsewhere).

The cases live in ``cases_*.py`` next to this file, one module per area (core, ops, io, nn);
``python tests/spawn/run_case.py --list`` lists them all.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

CASES: dict[str, "Case"] = {}


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    fn: Callable
    expect: type | tuple
    match: str
    limit: float
    nprocs: tuple[int, ...]
    needs_even: bool


def case(expect=ValueError, match: str = "", limit: float = 10.0, nprocs=(2, 3),
         needs_even: bool = False):
    """Register ``fn`` as a case under its module-qualified name (``area.fn_name``)."""
    def deco(fn):
        area = fn.__module__.rsplit(".", 1)[-1].removeprefix("cases_")
        name = f"{area}.{fn.__name__}"
        if name in CASES:
            raise RuntimeError(f"duplicate case {name}")
        CASES[name] = Case(name, fn, expect, match, limit, tuple(nprocs), needs_even)
        return fn
    return deco


class Ctx:
    def __init__(self, comm, tmp):
        self.comm = comm
        self.rank = comm.rank
        self.size = comm.size
        self.tmp = tmp

    def per_rank(self, bad, good):
        """``bad`` on the last rank, ``good`` on the others."""
        return bad if self.rank == self.size - 1 else good


def load_all() -> dict[str, Case]:
    import importlib
    import pkgutil
    from pathlib import Path
    here = Path(__file__).parent
    for m in sorted(pkgutil.iter_modules([str(here)]), key=lambda m: m.name):
        if m.name.startswith("cases_"):
            importlib.import_module(f"tests.spawn.{m.name}")
    return CASES
