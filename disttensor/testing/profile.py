"""A Hypothesis profile for tests run under MPI, and a check that the ranks drew alike.

Under ``mpiexec`` every rank runs the same test, and a property test that builds a DistArray
from a drawn example only works if every rank draws *the same* example (otherwise the ranks
enter different collectives and deadlock, or silently compare different data).  Importing this
module registers the profile ``"disttensor-mpi"``, which makes that so:

* ``derandomize=True``: the seed comes from the test itself, not from the clock;
* ``database=None``: no example database (ranks would replay different saved examples);
* ``deadline=None``: communication times vary, and a rank that hits a deadline alone diverges;
* every health check suppressed (a health check failing on one rank only would diverge);
* ``print_blob=False``; ``max_examples`` from ``DISTTENSOR_HYPOTHESIS_EXAMPLES`` (default 25).

:func:`load_mpi_profile` loads it and also switches off Hypothesis's *local-constant mining*:
recent Hypothesis mixes literal constants found in the user's modules in ``sys.modules`` into
its draws, and modules imported lazily differ between ranks (a rank with an empty block may
never import the kernel module a busy rank does), so otherwise "derandomized" ranks can draw
different examples.  Use it in a ``conftest.py``::

    from disttensor.testing.profile import load_mpi_profile
    load_mpi_profile()

Hypothesis still bounds shrinking by wall time, the one remaining way ranks can drift apart:
keep failing examples cheap.  To catch a drift (or a strategy that draws something
rank-dependent), :func:`check_same_draw` compares a digest of a drawn value across the ranks
and warns with :class:`RankDivergenceWarning` on every rank when they differ; the decorator
:func:`check_draws` does it for every argument of a ``@given`` test and every ``data.draw``::

    @given(xa=dist_arrays("float64", (5, 3)), data=st.data())
    @check_draws
    def test_sum(xa, data): ...

Each check costs one all-gather of one 64-bit integer.  Turn the warning into an error with
``-W error::disttensor.testing.profile.RankDivergenceWarning`` (pytest) if you like.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re

from hypothesis import HealthCheck, settings

from ..core.warn import warn

__all__ = ["PROFILE", "RankDivergenceWarning", "load_mpi_profile", "disable_local_constants",
           "draw_digest", "check_same_draw", "check_draws"]

PROFILE = "disttensor-mpi"

settings.register_profile(
    PROFILE,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    max_examples=int(os.environ.get("DISTTENSOR_HYPOTHESIS_EXAMPLES", "25")),
    print_blob=False,
)


class RankDivergenceWarning(UserWarning):
    """The ranks drew different Hypothesis examples (see :func:`check_same_draw`)."""


def disable_local_constants() -> bool:
    """Make Hypothesis collect no constants from local modules (process-wide): the built-in
    constant pool alone is the same on every rank.  Returns whether the mechanism was found
    (Hypothesis versions without it need nothing)."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - a Hypothesis without the mechanism
        return False
    if not (hasattr(providers, "_get_local_constants") and hasattr(providers, "Constants")):
        return False
    no_constants = providers.Constants()
    providers._get_local_constants = lambda: no_constants
    return True


def load_mpi_profile() -> None:
    """Load the ``"disttensor-mpi"`` profile and switch off local-constant mining (call it once,
    on every rank, before the tests run: e.g. at the top of ``conftest.py``)."""
    settings.load_profile(PROFILE)
    disable_local_constants()


# -- same draw on every rank -----------------------------------------------------------------
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _feed(h, value) -> None:
    import numpy as np
    if isinstance(value, np.ndarray):
        h.update(f"ndarray{value.dtype.str}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).view(np.uint8).tobytes() if value.size else b"")
        return
    if isinstance(value, (tuple, list)):
        h.update(f"{type(value).__name__}{len(value)}(".encode())
        for v in value:
            _feed(h, v)
        h.update(b")")
        return
    if isinstance(value, dict):
        h.update(f"dict{len(value)}(".encode())
        for k, v in value.items():
            _feed(h, k)
            _feed(h, v)
        h.update(b")")
        return
    from ..core.array import DistArray
    if isinstance(value, DistArray):  # the blocks differ by rank; the layout must not
        h.update(f"DistArray{value.dtype}{value.distribution!r}".encode())
        return
    h.update(_ADDRESS.sub("", repr(value)).encode(errors="replace"))


def draw_digest(value) -> int:
    """A 63-bit digest of a drawn value that is equal on ranks that drew alike (local; no
    communication): NumPy arrays by dtype, shape and bytes; tuples, lists and dicts item by
    item; a DistArray by dtype and distribution (its blocks differ by rank by design); anything
    else by ``repr`` with ``at 0x...`` addresses removed."""
    h = hashlib.blake2b(digest_size=8)
    _feed(h, value)
    return int.from_bytes(h.digest(), "little") >> 1


def check_same_draw(value, comm=None, what: str = "drawn value") -> bool:
    """Collective (one all-gather of an int over ``comm``, default COMM_WORLD): whether every
    rank passed an equal ``value`` (by :func:`draw_digest`).  If not, warns
    :class:`RankDivergenceWarning` on every rank, naming the groups of ranks that agree, and
    returns ``False``; every rank returns the same result.  Call it with values that should be
    replicated, e.g. ``check_same_draw(data.draw(strategy))``."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD if comm is None else comm
    if comm.Get_size() == 1:
        return True
    digests = comm.allgather(draw_digest(value))
    if all(d == digests[0] for d in digests):
        return True
    groups: dict[int, list[int]] = {}
    for r, d in enumerate(digests):
        groups.setdefault(d, []).append(r)
    warn(
        f"the ranks drew different values for the {what}: ranks {list(groups.values())} agree "
        f"among themselves (this is rank {comm.Get_rank()}, which drew {_short(value)}); load "
        "the disttensor-mpi profile on every rank and draw nothing rank-dependent",
        RankDivergenceWarning, rank_local=True)
    return False


def _short(value) -> str:
    text = _ADDRESS.sub("", repr(value))
    return text if len(text) <= 200 else text[:197] + "..."


class _CheckedData:
    """Wraps Hypothesis's ``st.data()`` object: every ``draw`` is checked across the ranks."""

    def __init__(self, data, comm):
        self._data, self._comm = data, comm

    def draw(self, strategy, label=None):
        value = self._data.draw(strategy, label=label)
        check_same_draw(value, self._comm, what=f"data.draw({label or strategy!r})"[:120])
        return value

    def __getattr__(self, name):
        return getattr(self._data, name)

    def __repr__(self) -> str:
        return repr(self._data)


# pytest fixtures whose values differ by rank on purpose (not drawn by Hypothesis)
RANK_LOCAL_FIXTURES = ("tmp_path", "tmpdir", "tmp_path_factory", "tmpdir_factory")


def check_draws(test=None, *, comm=None, ignore=RANK_LOCAL_FIXTURES):
    """Decorator for a Hypothesis test, placed *below* ``@given``: before each example runs,
    checks with :func:`check_same_draw` that every rank got the same arguments (one all-gather
    per example; arguments named in ``ignore`` -- rank-local pytest fixtures by default -- are
    skipped) and wraps an ``st.data()`` argument so each ``data.draw`` is checked too.  Use as
    ``@check_draws`` or ``@check_draws(comm=..., ignore=(...))``.  Warns, never fails: the test
    goes on (and most likely fails in its own collectives)."""
    if test is None:
        return lambda f: check_draws(f, comm=comm, ignore=ignore)

    @functools.wraps(test)
    def checked(*args, **kwargs):
        from hypothesis.strategies import DataObject
        shown = {k: v for k, v in kwargs.items()
                 if k not in ignore and not isinstance(v, DataObject)}
        check_same_draw((args, shown), comm, what=f"arguments of {test.__name__}")
        kwargs = {k: _CheckedData(v, comm) if isinstance(v, DataObject) else v
                  for k, v in kwargs.items()}
        return test(*args, **kwargs)

    return checked
