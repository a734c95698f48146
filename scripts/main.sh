#!/usr/bin/env bash
# The main job: set up this machine if needed (scripts/setup.sh: apt MPICH + parallel HDF5,
# .venv, mpi4py and h5py built from source) and run the demo on 2 MPI ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} NUMBA_NUM_THREADS=${NUMBA_NUM_THREADS:-1}
exec timeout -k 10 600 mpiexec -n 2 .venv/bin/python -m mpi4py examples/demo.py "$@"
