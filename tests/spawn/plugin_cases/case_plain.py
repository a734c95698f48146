"""Plain tests (no MPI marks), for the plugin's inertness check in
tests/spawn/test_pytest_plugin.py."""
import sys

import pytest


def test_passes(tmp_path):
    print("TMP", tmp_path)
    assert "mpi4py.MPI" in sys.modules or True


def test_fails():
    assert 1 == 2


@pytest.mark.skip(reason="skipped on purpose")
def test_skipped():
    pass
