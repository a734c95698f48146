"""The example project's pytest set-up: every rank draws the same Hypothesis examples."""
from disttensor.testing.profile import load_mpi_profile

load_mpi_profile()
