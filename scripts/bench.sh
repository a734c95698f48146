#!/usr/bin/env bash
# The benchmark suite: set up this machine if needed (scripts/setup.sh), install what the
# benchmarks use besides the library (matplotlib for the plots; PyTorch 2.13 CPU and
# mpi4py-fft as comparison peers where they can be installed: a benchmark skips a peer that is
# missing), then run every benchmark in bench/ through bench/run_all.py.
#
#   bash scripts/bench.sh              # CPU, quick settings (about 15 minutes on 2 cores)
#   bash scripts/bench.sh --full       # the benchmarks' own, larger defaults
#   bash scripts/bench.sh --gpu        # also the GPU benchmarks (on a GPU machine)
#   bash scripts/bench.sh --only conv,halo
#
# Results: build/bench/results.csv (every figure), summary.md (targets met or not), *.png
# (strong scaling, overlap, micro-batching, model predicted vs measured, targets), logs/.
# Extra arguments go to bench/run_all.py (--help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/idle_shim.sh >/dev/null  # build/libmpi_idle_sleep.so: waiting ranks yield
PY=.venv/bin/python
"$PY" -c "import matplotlib" 2>/dev/null || "$PY" -m pip install -q "matplotlib>=3.8"  # pyproject [bench]
# PyTorch is a peer only.  2.13.0 pinned: on the project's machines pip takes the CPU build
# from a local file (an unpinned 'torch' would pull a CUDA build of several GB).
"$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q "torch==2.13.0" \
  || echo "bench.sh: PyTorch could not be installed; the torch comparisons are skipped"
"$PY" -c "import mpi4py_fft" 2>/dev/null || { command -v apt-get >/dev/null \
  && { dpkg -s libfftw3-dev >/dev/null 2>&1 || apt-get install -y -q libfftw3-dev >/dev/null; } \
  && "$PY" -m pip install -q mpi4py-fft; } \
  || echo "bench.sh: mpi4py-fft could not be installed; the FFT peer comparison is skipped"
export OPENBLAS_THREAD_TIMEOUT=${OPENBLAS_THREAD_TIMEOUT:-4}
exec "$PY" bench/run_all.py "$@"
