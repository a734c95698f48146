"""core.environ reads exactly what ``os.environ.get`` reads, at each call: set, changed and
removed names (through ``os.environ``, as ``monkeypatch.setenv`` does), unset names with and
without a default, non-ASCII values; and the same when ``os.environ`` has no raw store."""
from __future__ import annotations

import os

import pytest

from disttensor.core import environ

NAMES = ("DISTTENSOR_TEST_ENVIRON_A", "DISTTENSOR_TEST_ENVIRON_B")


def _check_agrees(default):
    for n in NAMES:
        assert environ.getenv(n, default) == os.environ.get(n, default)
        assert environ.getenv(n) == os.environ.get(n)


@pytest.mark.parametrize("raw_store", [True, False])
def test_reads_follow_os_environ(monkeypatch, raw_store):
    if not raw_store:   # the fallback: an os.environ without CPython's store
        monkeypatch.setattr(environ, "_store", lambda: None)
    for n in NAMES:
        monkeypatch.delenv(n, raising=False)
    _check_agrees("dflt")
    before = environ.snapshot(NAMES)
    assert environ.snapshot(NAMES) == before
    monkeypatch.setenv(NAMES[0], "on")
    _check_agrees(None)
    after_set = environ.snapshot(NAMES)
    assert after_set != before
    monkeypatch.setenv(NAMES[0], "off")            # a changed value
    _check_agrees("x")
    assert environ.snapshot(NAMES) not in (before, after_set)
    monkeypatch.setenv(NAMES[1], "d\u00e9j\u00e0 vu")   # non-ASCII round-trips
    assert environ.getenv(NAMES[1]) == "d\u00e9j\u00e0 vu"
    monkeypatch.delenv(NAMES[0])
    monkeypatch.delenv(NAMES[1])
    _check_agrees("gone")
    assert environ.snapshot(NAMES) == before       # back to the same values: equal again
