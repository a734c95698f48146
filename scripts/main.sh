#!/usr/bin/env bash
# The main job: set up this machine if needed (scripts/setup.sh: apt MPICH + parallel HDF5,
# .venv, mpi4py and h5py built from source), generate a small synthetic CosmoFlow dataset in the
# raw CosmoFlow format (once; kept in build/main-data-raw: int16 D,H,W,C particle counts of 32^3
# universes, 4 targets unitPar) and train CosmoFlow on it on 4 MPI ranks, on the CPU, reading
# random 16^3 crops with log(1 + x) (centred: minus 3.4, about log(1 + 32)) and random
# flips/axis permutations at read time (each rank reads only its block of the crop: no
# preprocessing pass; validation on centred crops): the
# model is cut into 2 pipeline stages (partition measured, 4 micro-batches, 1F1B), and inside
# each stage every sample is split in two along its depth (grid 1x2x1x1 per stage: spatial
# parallelism), each parameter updated inside backward as soon as its gradient is summed.
# Each epoch prints the validation loss and MAE; the last line compares the validation MAE
# with predicting the mean training target. Extra arguments go to `python -m disttensor.train`
# (e.g. --epochs 4).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} NUMBA_NUM_THREADS=${NUMBA_NUM_THREADS:-1}
PY=.venv/bin/python
DATA=build/main-data-raw
SIZE=32
CROP=16
gen() {  # gen DIR SAMPLES SEED: a synthetic dataset, unless one of that size is complete
  if [ "$(find "$1" -name 'sample_*.h5' 2>/dev/null | wc -l)" != "$2" ]; then
    rm -rf "$1"
    timeout -k 10 300 mpiexec -n 2 "$PY" -m mpi4py -m disttensor.io.synthetic --out "$1" \
      --samples "$2" --size "$SIZE" --channels 4 --seed "$3" --layout raw
  fi
}
gen "$DATA/train" 512 0
gen "$DATA/val" 64 1
rm -rf build/main-run
SHIM=$(bash scripts/idle_shim.sh)  # 4 ranks may share fewer cores: waiting ranks yield
exec timeout -k 10 900 mpiexec ${SHIM:+-genv LD_PRELOAD "$SHIM"} -n 4 "$PY" -m mpi4py \
  -m disttensor.train cosmoflow --data "$DATA/train" --val "$DATA/val" --out build/main-run \
  --grid 1x2x1x1 --stages 2 --micro-batches 4 --pipeline-schedule 1f1b --partition auto \
  --update-in-backward --widths 16,32,64 --dense 64,32 --batch-size 16 --epochs 12 --lr 2e-3 \
  --schedule cosine --seed 0 --channels-last --log1p --x-shift 3.4 --crop "$CROP" \
  --augment all "$@"
