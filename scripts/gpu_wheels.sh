#!/usr/bin/env bash
# Download, where PyPI is reachable, the wheels that scripts/gpu_check.sh installs on a GPU
# machine that has no network access.  They go to build/wheels/ (git-ignored: build/ is in
# .gitignore); copy that folder along with the repository:
#
#   bash scripts/gpu_wheels.sh            # once (about 21 MB; skips what is already there)
#   bash scripts/gpu_check.sh tests       # then, on the GPU machine
#
# Target: CPython 3.12 on x86-64 glibc with CuPy 14 (cupy-cuda13x), the cuDNN 9
# libraries (nvidia-cudnn-cu13), mpi4py, h5py, numba, numpy, pytest, hypothesis and PyTorch.
#
#   build/wheels/required/   installed when missing there:
#       nvidia-cudnn-frontend 1.28.0   the `cudnn` module disttensor/ops/local/gpu/ imports
#                                      (pinned as in pyproject.toml's [gpu] extra)
#   build/wheels/mpi/        installed only if mpi4py cannot start MPI or mpiexec is missing:
#       mpich                          libmpi.so.12 + mpiexec (hydra), installed with --prefix
#       mpi4py                         a binary wheel that finds libmpi at run time
#   build/wheels/fallback/   installed only if the module is missing there:
#       pytest (+ pluggy, iniconfig, packaging), hypothesis (+ sortedcontainers, attrs)
#
# Each wheel is fetched with --no-deps (the device README: name each missing dependency), for
# CPython 3.12 on manylinux x86-64.  One version of each; re-running replaces nothing that is
# already there (delete build/wheels to refresh).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${DISTTENSOR_WHEEL_DIR:-build/wheels}
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null 2>&1 || PY=.venv/bin/python

PLAT=(--only-binary=:all: --no-deps --python-version 3.12 --implementation cp --abi cp312
      --abi abi3 --abi none
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any)

# group  requirement  file glob (to skip what is already there)
WHEELS=(
  "required nvidia-cudnn-frontend==1.28.0 nvidia_cudnn_frontend-1.28.0-*.whl"
  "mpi      mpich==5.0.2                  mpich-5.0.2-*.whl"
  "mpi      mpi4py==4.1.2                 mpi4py-4.1.2-*.whl"
  "fallback pytest                        pytest-*.whl"
  "fallback pluggy                        pluggy-*.whl"
  "fallback iniconfig                     iniconfig-*.whl"
  "fallback packaging                     packaging-*.whl"
  "fallback hypothesis                    hypothesis-*.whl"
  "fallback sortedcontainers              sortedcontainers-*.whl"
  "fallback attrs                         attrs-*.whl"
)

fail=0
for entry in "${WHEELS[@]}"; do
  read -r group req glob <<<"$entry"
  mkdir -p "$DEST/$group"
  # shellcheck disable=SC2086 # glob is a pattern
  if compgen -G "$DEST/$group/$glob" >/dev/null; then
    echo "have  $group/$(cd "$DEST/$group" && ls $glob | head -1)"
    continue
  fi
  if "$PY" -m pip download -q "${PLAT[@]}" -d "$DEST/$group" "$req" 2> >(grep -v "is ignored: it is neither" >&2); then
    # shellcheck disable=SC2086
    echo "got   $group/$(cd "$DEST/$group" && ls $glob 2>/dev/null | head -1)"
  else
    echo "FAIL  $req (pip download)" >&2
    fail=1
  fi
done
echo "build/wheels: $(du -sh "$DEST" | cut -f1) in $(find "$DEST" -name '*.whl' | wc -l) wheels" \
  "(keep it small: it travels with the repository)"
exit $fail
