#!/usr/bin/env bash
# Set up a fresh machine for disttensor: a system MPI and parallel HDF5 (Debian packages,
# installed only when missing), then a .venv with mpi4py and h5py built from source against
# that MPI, and disttensor itself (editable) with its test extras.
# Idempotent: a finished set-up is recorded in .venv/.disttensor-setup and skipped next time;
# the Numba kernel cache is (re)warmed whenever its stamp is stale (python -m disttensor.warmup).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv
STAMP=$VENV/.disttensor-setup
STAMP_VALUE="v1 $(sha1sum pyproject.toml | cut -c1-12)"
PY=${PYTHON:-python3}

log() { printf '[setup] %s\n' "$*" >&2; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# --- system MPI + parallel HDF5 ----------------------------------------------------------------
HDF5_MPI_DIR=""
find_hdf5_mpi() {
  for d in /usr/lib/x86_64-linux-gnu/hdf5/mpich /usr/lib/aarch64-linux-gnu/hdf5/mpich \
           /usr/lib/x86_64-linux-gnu/hdf5/openmpi /usr/lib/aarch64-linux-gnu/hdf5/openmpi; do
    if [ -f "$d/include/H5pubconf.h" ] && grep -q 'define H5_HAVE_PARALLEL 1' "$d/include/H5pubconf.h"; then
      HDF5_MPI_DIR=$d; return 0
    fi
  done
  return 1
}
if ! command -v mpicc >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1 || ! find_hdf5_mpi; then
  if command -v apt-get >/dev/null 2>&1; then
    log "installing mpich and parallel HDF5 (apt)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends \
      mpich libmpich-dev libhdf5-mpich-dev pkg-config build-essential >/dev/null
  else
    log "no apt-get: install an MPI (mpicc, mpirun) and a parallel HDF5 yourself"; exit 1
  fi
  find_hdf5_mpi || { log "parallel HDF5 not found after install"; exit 1; }
fi

# --- Numba kernels compiled ahead (python -m disttensor.warmup): seconds when already warm -------
warm_kernels() {
  local vpy=$VENV/bin/python
  "$vpy" -m disttensor.warmup --check >/dev/null 2>&1 && return 0
  log "compiling the CPU kernels into Numba's cache (a few minutes, once per checkout)"
  OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
    timeout -k 10 900 mpiexec -n 2 "$vpy" -m disttensor.warmup \
    || timeout -k 10 900 "$vpy" -m disttensor.warmup \
    || log "warning: kernel warm-up failed; kernels will compile on first use"
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_VALUE" ]; then
  warm_kernels
  exit 0
fi

# --- virtual environment ---------------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PY" -m venv "$VENV"
fi
VPY=$VENV/bin/python
"$VPY" -m pip install -q --upgrade pip
"$VPY" -m pip install -q "setuptools>=77" wheel "cython>=3" "numpy>=1.26" pkgconfig

if ! "$VPY" -c 'import mpi4py' 2>/dev/null; then
  log "building mpi4py from source against $(command -v mpicc) (about 2 minutes)"
  MPICC=mpicc "$VPY" -m pip install -q --no-binary=mpi4py --no-cache-dir "mpi4py>=4"
fi
if ! "$VPY" -c 'import h5py, sys; sys.exit(0 if h5py.get_config().mpi else 1)' 2>/dev/null; then
  log "building h5py from source with HDF5_MPI=ON against $HDF5_MPI_DIR (about 2 minutes)"
  CC=mpicc HDF5_MPI=ON HDF5_DIR=$HDF5_MPI_DIR \
    "$VPY" -m pip install -q --no-binary=h5py --no-build-isolation --no-cache-dir "h5py>=3.10"
fi
log "installing disttensor (editable) with test extras"
"$VPY" -m pip install -q --no-build-isolation -e ".[test]"
echo "$STAMP_VALUE" > "$STAMP"
warm_kernels
log "done"
