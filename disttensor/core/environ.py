"""Settings read from the environment at each call, cheaply (per process, no MPI, no cache).

Several settings (``DISTTENSOR_CONV_*``, ``DISTTENSOR_HALO_OVERLAP``) are read at every call
that uses them, so that a change made while the program runs (a benchmark switching a mode, a
test's ``monkeypatch.setenv``) takes effect at the next call.  A training step makes some
sixty such reads, and ``os.environ.get`` of a name that is not set costs about 0.7 us (it
encodes the name, and raises and catches ``KeyError`` inside); the functions here read the
same store in about 0.05 us:

* :func:`getenv` is ``os.environ.get(name, default)``;
* :func:`snapshot` is a tuple that compares equal exactly when the given names have the same
  values (a memo key: it holds the raw values, not decoded).

They read ``os.environ``'s own mapping (CPython keeps the encoded names and values in it and
updates it on every change made through ``os.environ``), so they see exactly what
``os.environ.get`` sees: a change made with ``os.putenv`` alone is invisible to both.  Where
that mapping is not available they fall back to ``os.environ.get``.
"""
from __future__ import annotations

import os

__all__ = ["getenv", "snapshot"]

_KEYS: dict = {}   # name -> its encoded form in os.environ's store


def _store():
    """``(raw mapping, encodekey, decodevalue)`` of the current ``os.environ``, or None."""
    env = os.environ
    data = getattr(env, "_data", None)
    enc, dec = getattr(env, "encodekey", None), getattr(env, "decodevalue", None)
    if type(data) is not dict or enc is None or dec is None:
        return None
    return data, enc, dec


def _key(name: str, enc):
    k = _KEYS.get(name)
    if k is None:
        k = _KEYS[name] = enc(name)
    return k


def getenv(name: str, default=None):
    """``os.environ.get(name, default)``, without the cost of a miss."""
    store = _store()
    if store is None:
        return os.environ.get(name, default)
    data, enc, dec = store
    v = data.get(_KEYS.get(name) or _key(name, enc))
    return default if v is None else dec(v)


def snapshot(names: tuple) -> tuple:
    """The current values of ``names`` (raw; ``None`` where unset), as one tuple: equal to
    another snapshot of the same names exactly when none of their values changed."""
    store = _store()
    if store is None:
        return tuple(os.environ.get(n) for n in names)
    data, enc, _ = store
    get = data.get
    return tuple(get(_KEYS.get(n) or _key(n, enc)) for n in names)
