"""tests/host_cuda: the GPU RawKernels run on the host (host_shim.py, host_build.py,
cuda_host.h).

``DISTTENSOR_HOST_CUDA_VARIANT`` selects the build: ``plain`` (default) or ``sanitized``
(AddressSanitizer + UndefinedBehaviorSanitizer; the Python running the tests must have libasan
preloaded: ``python tests/host_cuda/run.py --sanitized`` arranges that).  The session prints
how many kernels (name expressions) ran; with ``DISTTENSOR_HOST_CUDA_REQUIRE_ALL=1`` it fails
unless every name expression of ``rawmodules.MODULE_SPECS`` ran.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import host_build as build  # noqa: E402
import host_shim as shim  # noqa: E402
from host_helpers import VARIANT  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if build.compiler() is None:
        skip = pytest.mark.skip(reason="no C++ compiler (g++ or $CXX)")
        for item in items:
            item.add_marker(skip)


@pytest.fixture
def host(monkeypatch):
    """The real GPU wrappers running on the host build of :data:`VARIANT`."""
    shim.install(monkeypatch, VARIANT)
    shim.set_index32_limit(0x7FFFFFFF)
    yield VARIANT
    shim.set_index32_limit(0x7FFFFFFF)


def _coverage():
    from disttensor.ops.local.gpu import rawmodules
    every = {e for m in rawmodules.MODULE_SPECS for e in build.name_expressions(m)}
    ran = {e for (v, e), n in shim.LAUNCHED.items() if v == VARIANT and n}
    return every, ran


def pytest_terminal_summary(terminalreporter):
    every, ran = _coverage()
    launches = sum(n for (v, _), n in shim.LAUNCHED.items() if v == VARIANT)
    terminalreporter.write_line(
        f"host RawKernels ({VARIANT} build): {len(ran & every)} of {len(every)} kernels "
        f"(name expressions of rawmodules.MODULE_SPECS) ran, {launches} launches")
    missing = sorted(every - ran)
    if missing:
        terminalreporter.write_line("  never ran: " + ", ".join(missing))


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("DISTTENSOR_HOST_CUDA_REQUIRE_ALL") == "1" and exitstatus == 0:
        every, ran = _coverage()
        if every - ran:
            session.exitstatus = 1
