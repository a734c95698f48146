"""A malformed @pytest.mark.mpi(n=...) (tests/spawn/test_pytest_plugin.py)."""
import pytest


@pytest.mark.mpi(n=0)
def test_zero_ranks():
    pass
