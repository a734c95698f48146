"""The case files here are run by tests/spawn/test_pytest_plugin.py in their own pytest (and
mpiexec) processes, never collected by our own runs (their names do not match test_*.py)."""
collect_ignore_glob = ["case_*.py"]
