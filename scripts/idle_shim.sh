#!/usr/bin/env bash
# Print the path of the MPICH idle-sleep shim (build/libmpi_idle_sleep.so), building it from
# scripts/mpi_idle_sleep.c with the C compiler when missing or stale; print nothing (and a
# note on stderr) when it cannot be built.  Why the shim exists: see scripts/test.sh (waiting
# ranks of an oversubscribed MPICH give their core to the rank they wait for).
set -uo pipefail
cd "$(dirname "$0")/.."
SRC=scripts/mpi_idle_sleep.c
SO=$PWD/build/libmpi_idle_sleep.so
CC_BIN=$(command -v cc || command -v gcc || true)
if [ -f "$SO" ] && [ "$SO" -nt "$SRC" ]; then
  echo "$SO"
elif [ -n "$CC_BIN" ] && mkdir -p build \
    && "$CC_BIN" -O2 -shared -fPIC -o "$SO.tmp.$$" "$SRC" -ldl && mv -f "$SO.tmp.$$" "$SO"; then
  echo "$SO"
else
  echo "[idle_shim] could not build $SRC; MPI runs go without the idle-sleep shim" >&2
fi
