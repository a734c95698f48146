"""Testing distributed code the way disttensor tests itself (``docs/testing.md``).

* :mod:`disttensor.testing.strategies`: Hypothesis strategies for process grids, splits,
  distributions (uneven and empty blocks), layouts and DistArrays with their global NumPy
  twins; every strategy is a pure function of its arguments, so all ranks draw the same
  examples under the MPI profile (:mod:`disttensor.testing.profile`).
* :mod:`disttensor.testing.assertions` (re-exported here): collective assertions (every rank
  agrees on pass or fail and raises the same message).
* :mod:`pytest_disttensor` (a top-level module installed with disttensor): the pytest plugin
  (entry point ``disttensor``) for runs under ``mpiexec`` and the ``@pytest.mark.mpi(n=...)``
  launcher.

Hypothesis and pytest are needed only by the modules that use them (``pip install
disttensor[test]``).
"""
from .assertions import (assert_adjoint, assert_all_ranks, assert_allclose, assert_array_equal,
                         assert_raises_collectively, assert_same_on_all_ranks)

__all__ = ["assert_adjoint", "assert_all_ranks", "assert_allclose", "assert_array_equal",
           "assert_raises_collectively", "assert_same_on_all_ranks"]
