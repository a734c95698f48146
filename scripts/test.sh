#!/usr/bin/env bash
# The whole test suite (what CI runs, through .ci/run):
#   0. scripts/setup.sh  (idempotent: apt MPICH + parallel HDF5, .venv, mpi4py/h5py from source)
#   1. tests/unit        plain pytest, no MPI launcher (no tests collected counts as a failure)
#   1b. tests/spawn      plain pytest that launches one small mpiexec job per case (2 and 3
#                        ranks, each under a timeout): arguments that differ between ranks
#                        raise on every rank, never hang; the collective-wait watchdog
#   2. tests/mpi         under mpiexec -n 1, 2, 3, 4 (3 gives uneven splits), each run wrapped
#                        in a timeout so a deadlock fails instead of hanging
#   2b. examples/testing the example user project of docs/testing.md (a stencil and its adjoint
#                        tested with disttensor.testing) under mpiexec -n 1..4, plain pytest
#                        under the launcher (the disttensor pytest plugin), each under a timeout
#   3. CUDA sources      every disttensor/**/*.cu compiled with nvcc (skipped without nvcc)
#   3b. RawKernels on the host  every GPU RawKernel (name expression of gpu/rawmodules.py)
#                        compiled with g++ through tests/host_cuda/cuda_host.h and run
#                        against the CPU kernels, plain and under ASan+UBSan
#                        (tests/host_cuda/run.py; skipped without g++)
# Every step runs even when an earlier one failed; a summary table closes the output and the
# exit status is non-zero if any step failed.
#
# Knobs (environment):
#   DISTTENSOR_TEST_NPROCS="1 2 3 4"   rank counts for tests/mpi
#   DISTTENSOR_MPI_TIMEOUT=900         seconds per mpiexec run
#   DISTTENSOR_HYPOTHESIS_EXAMPLES=25  max_examples of hypothesis tests under MPI
#   DISTTENSOR_MPI_IDLE_SLEEP=1        0 disables the MPICH idle-sleep shim (see below)
#   DISTTENSOR_SYNC_TIMEOUT=120        see tests/mpi/conftest.py (ranks out of step -> abort)
#   DISTTENSOR_TEST_TIMEOUT            per-test timeout under MPI (off; the disttensor pytest
#                                      plugin, pytest_disttensor.py)
#   DISTTENSOR_TEST_LOG_DIR / DISTTENSOR_TEST_TMP_DIR   per-rank logs / pytest temp dirs
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=$ROOT/.venv/bin/python
NPROCS=${DISTTENSOR_TEST_NPROCS:-"1 2 3 4"}
MPI_TIMEOUT=${DISTTENSOR_MPI_TIMEOUT:-900}
LOG_DIR=${DISTTENSOR_TEST_LOG_DIR:-build/test-logs}  # where scripts/mpi_pytest.py logs ranks > 0
T_START=$(date +%s)

# --- environment for the MPI runs ------------------------------------------------------------
# One thread per rank: 4 ranks share 2 cores on CI; OpenMP/Numba/BLAS thread pools on top of
# that only oversubscribe further.
export OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
# MPICH oversubscription.  Measured on the 2-core CI-type machine with
# scripts/mpi_oversub_probe.py at -n 4 (8-byte MPI_Allreduce; 8-byte ping-pong between rank
# pairs; a fixed NumPy workload on rank 0 while the other ranks wait in MPI_Barrier, 300 ms
# when run alone at -n 1):
#   plain mpiexec                        allreduce 10-20 ms   ping-pong 3 us..24 ms   work 1.0-1.5 s
#   -bind-to none / -bind-to core        allreduce 15-21 ms   (no real change)
#   MPIR_CVAR_POLLS_BEFORE_YIELD=1       allreduce 19 ms      (ch3-only CVAR, ignored by ch4)
#   MPIR_CVAR_NOLOCAL=1, MPIR_CVAR_CH4_SHM=0, UCX_TLS=self,sm, MPIR_CVAR_DEVICE_COLLECTIVES=none,
#   POSIX/intra collective algorithm CVARs, MPI4PY_RC_THREAD_LEVEL=single|multiple
#                                        allreduce 17-21 ms   (no change)
#   MPIR_CVAR_ASYNC_PROGRESS=1           allreduce 39 ms      (worse: one more spinning thread)
#   LD_PRELOAD=build/libmpi_idle_sleep.so
#                                        allreduce 40-200 us  ping-pong 35-170 us  work 0.35-0.46 s
# Debian's MPICH is ch4:ucx, whose progress loop never yields the CPU (strace: no sched_yield)
# and has no CVAR to make it, so no MPICH setting helps; the shim scripts/mpi_idle_sleep.c
# (interposes ucp_worker_progress, which the progress loop calls every turn, and yields/sleeps
# when idle) makes waiting ranks give their core to the rank they wait for: ~100x faster
# collectives when oversubscribed, and tests/mpi/test_halo.py + test_redistribute.py at -n 4
# ran in 10.5-11 s instead of 50-56 s (pytest time, same machine, same load).  It is built
# here with cc and handed to the ranks only (mpiexec -genv LD_PRELOAD), for test runs; without
# a C compiler or with DISTTENSOR_MPI_IDLE_SLEEP=0 the tests run without it (correct, slower).
# Its spin budget DISTTENSOR_MPI_IDLE_SPIN_NS stays at 0 here (oversubscribed: a polling rank
# would take turns from the rank it waits for); the 2-rank step benchmarks set one.
# (The numbers were taken while other MPI jobs shared the machine, hence the ranges.)

STEP_NAMES=()
STEP_STATUS=()
STEP_SECS=()
FAILED=0
record() {  # name status seconds
  STEP_NAMES+=("$1"); STEP_STATUS+=("$2"); STEP_SECS+=("$3")
  case "$2" in PASS*|SKIP*) ;; *) FAILED=1 ;; esac
}
banner() { printf '\n=== %s ===\n' "$*"; }

# --- 0. setup --------------------------------------------------------------------------------
banner "setup (scripts/setup.sh)"
t0=$(date +%s)
if bash scripts/setup.sh; then record "setup" PASS $(( $(date +%s) - t0 ))
else record "setup" "FAIL(rc=$?)" $(( $(date +%s) - t0 )); fi

# --- the idle-sleep shim for oversubscribed MPICH ----------------------------------------------
SHIM=""
if [ "${DISTTENSOR_MPI_IDLE_SLEEP:-1}" != 0 ]; then
  SHIM=$(bash scripts/idle_shim.sh)
fi
MPIEXEC_ENV=()
if [ -n "$SHIM" ]; then
  MPIEXEC_ENV=(-genv LD_PRELOAD "$SHIM${LD_PRELOAD:+:$LD_PRELOAD}")
fi

# --- 1. unit tests (no MPI launcher) ------------------------------------------------------------
banner "tests/unit (pytest, no mpiexec)"
t0=$(date +%s)
"$PY" -m pytest tests/unit -q
rc=$?
secs=$(( $(date +%s) - t0 ))
case $rc in
  0) record "tests/unit" PASS "$secs" ;;
  5) record "tests/unit" "FAIL(no tests)" "$secs" ;;
  *) record "tests/unit" "FAIL(rc=$rc)" "$secs" ;;
esac

# --- 1b. rank-mismatch cases and the watchdog (one mpiexec per case, each under a timeout) ----
banner "tests/spawn (pytest launching one mpiexec per case)"
t0=$(date +%s)
timeout -k 10 "$MPI_TIMEOUT" "$PY" -m pytest tests/spawn -q
rc=$?
secs=$(( $(date +%s) - t0 ))
case $rc in
  0) record "tests/spawn" PASS "$secs" ;;
  5) record "tests/spawn" "FAIL(no tests)" "$secs" ;;
  124|137) record "tests/spawn" "TIMEOUT(${MPI_TIMEOUT}s)" "$secs" ;;
  *) record "tests/spawn" "FAIL(rc=$rc)" "$secs" ;;
esac

# --- 2. MPI tests ------------------------------------------------------------------------------
for n in $NPROCS; do
  banner "tests/mpi under mpiexec -n $n (timeout ${MPI_TIMEOUT}s)"
  mkdir -p "$LOG_DIR"
  rm -f "$LOG_DIR"/rank*-n"$n".log
  t0=$(date +%s)
  # timeout puts itself and mpiexec in a process group of their own, which a Ctrl-C at the
  # terminal does not reach: run it in the background and forward INT/TERM to it.
  timeout -k 10 "$MPI_TIMEOUT" mpiexec "${MPIEXEC_ENV[@]}" -n "$n" \
    "$PY" -m mpi4py scripts/mpi_pytest.py tests/mpi -q &
  TIMEOUT_PID=$!
  trap 'kill -TERM "$TIMEOUT_PID" 2>/dev/null; wait "$TIMEOUT_PID"; exit 130' INT TERM
  wait "$TIMEOUT_PID"
  rc=$?
  trap - INT TERM
  secs=$(( $(date +%s) - t0 ))
  case $rc in
    0) record "tests/mpi -n $n" PASS "$secs" ;;
    5) record "tests/mpi -n $n" "PASS(no tests)" "$secs" ;;
    124|137)
      record "tests/mpi -n $n" "TIMEOUT(${MPI_TIMEOUT}s)" "$secs"
      for log in "$LOG_DIR"/rank*-n"$n".log; do
        [ -f "$log" ] || continue
        r=$(basename "$log" .log)
        echo "--- last lines of $log ---"
        tail -n 60 "$log" | sed "s/^/[${r%%-*}] /"
      done ;;
    86) record "tests/mpi -n $n" "FAIL(out of step)" "$secs" ;;  # see tests/mpi/conftest.py
    87) record "tests/mpi -n $n" "FAIL(test timeout)" "$secs" ;;  # --mpi-test-timeout
    *) record "tests/mpi -n $n" "FAIL(rc=$rc)" "$secs" ;;
  esac
done

# --- 2b. the example user project of docs/testing.md ------------------------------------------
for n in $NPROCS; do
  banner "examples/testing under mpiexec -n $n (timeout 300s)"
  t0=$(date +%s)
  (cd examples/testing && timeout -k 10 300 mpiexec "${MPIEXEC_ENV[@]}" -n "$n" \
    "$PY" -m pytest -q -p no:cacheprovider --mpi-test-timeout 240 .)
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  case $rc in
    0) record "examples/testing -n $n" PASS "$secs" ;;
    124|137) record "examples/testing -n $n" "TIMEOUT(300s)" "$secs" ;;
    *) record "examples/testing -n $n" "FAIL(rc=$rc)" "$secs" ;;
  esac
done

# --- 3. CUDA sources compile check ---------------------------------------------------------------
banner "CUDA sources (nvcc)"
t0=$(date +%s)
NVCC=$(command -v nvcc || true)
if [ -z "$NVCC" ]; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin /opt/nvidia/hpc_sdk/*/*/compilers/bin; do
    if [ -x "$d/nvcc" ]; then NVCC=$d/nvcc; break; fi
  done
fi
mapfile -t CU_FILES < <(find disttensor -name '*.cu' -type f 2>/dev/null | sort)
if [ -z "$NVCC" ]; then
  echo "nvcc not found (PATH, /usr/local/cuda/bin): skipping ${#CU_FILES[@]} .cu file(s)"
  record "nvcc compile" "SKIP(no nvcc)" $(( $(date +%s) - t0 ))
elif [ ${#CU_FILES[@]} -eq 0 ]; then
  echo "no .cu files under disttensor/ ($NVCC is there)"
  record "nvcc compile" "PASS(0 files)" $(( $(date +%s) - t0 ))
else
  nbad=0
  for f in "${CU_FILES[@]}"; do
    # shellcheck disable=SC2086 # DISTTENSOR_NVCC_FLAGS is a list of flags
    if "$NVCC" -std=c++17 ${DISTTENSOR_NVCC_FLAGS:-} -c -o /dev/null "$f"; then
      echo "ok    $f"
    else
      echo "FAIL  $f"; nbad=$((nbad + 1))
    fi
  done
  if [ $nbad -eq 0 ]; then record "nvcc compile" "PASS(${#CU_FILES[@]} files)" $(( $(date +%s) - t0 ))
  else record "nvcc compile" "FAIL($nbad/${#CU_FILES[@]} files)" $(( $(date +%s) - t0 )); fi
fi

# --- 3b. the GPU RawKernels executed on the host ----------------------------------------------
banner "RawKernels on the host (g++, plain and ASan+UBSan builds)"
t0=$(date +%s)
if ! command -v "${CXX:-g++}" >/dev/null 2>&1; then
  echo "no C++ compiler (${CXX:-g++}): skipping the host RawKernels"
  record "host RawKernels" "SKIP(no g++)" $(( $(date +%s) - t0 ))
else
  HOST_LOG=$(mktemp)
  timeout -k 10 900 "$PY" tests/host_cuda/run.py 2>&1 | tee "$HOST_LOG"
  rc=${PIPESTATUS[0]}
  # the conftest prints "host RawKernels (<variant> build): <ran> of <all> kernels ..."
  nk=$(grep -o 'host RawKernels ([a-z]* build): [0-9]* of [0-9]*' "$HOST_LOG" \
       | sed 's/.*(\([a-z]*\) build): \([0-9]*\) of \([0-9]*\)/\1 \2\/\3/' | paste -sd, -)
  rm -f "$HOST_LOG"
  echo "kernels run on the host: ${nk:-none}"
  if [ "$rc" = 0 ]; then record "host RawKernels" "PASS(${nk// /:})" $(( $(date +%s) - t0 ))
  else record "host RawKernels" "FAIL(rc=$rc)" $(( $(date +%s) - t0 )); fi
fi

# --- summary -------------------------------------------------------------------------------------
banner "summary"
printf '%-20s %-18s %8s\n' step status seconds
printf '%-20s %-18s %8s\n' -------------------- ------------------ --------
for i in "${!STEP_NAMES[@]}"; do
  printf '%-20s %-18s %8s\n' "${STEP_NAMES[$i]}" "${STEP_STATUS[$i]}" "${STEP_SECS[$i]}"
done
printf '%-20s %-18s %8s\n' total "$([ $FAILED = 0 ] && echo PASS || echo FAIL)" $(( $(date +%s) - T_START ))
exit $FAILED
