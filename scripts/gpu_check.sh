#!/usr/bin/env bash
# One-command GPU verification of disttensor on a machine with an NVIDIA GPU (tested with
# H100/H200, CUDA 13, CuPy 14, the cuDNN 9 wheel).  It works offline: what it installs comes
# from build/wheels (scripts/gpu_wheels.sh, run where PyPI is reachable).  See README.md,
# "Running on NVIDIA GPUs".
#
#   bash scripts/gpu_check.sh PHASE [REPORT_DIR]
#     REPORT_DIR: where the report goes (default: $OUT if set, else build/gpu-check)
#
#   bash scripts/gpu_wheels.sh                 # where PyPI is reachable: wheels into build/wheels
#   bash scripts/gpu_check.sh tests            # ~6-9 min
#   bash scripts/gpu_check.sh bench            # ~4-7 min
#   bash scripts/gpu_check.sh all              # both (needs GPU_CHECK_BUDGET of ~1000 s)
#   bash scripts/gpu_check.sh sanitize         # compute-sanitizer memcheck/racecheck of the
#                                              # RawKernels (optional, ~3-6 min)
#
# Every phase first sets up the environment:
#   * python: $GPU_CHECK_PYTHON, else the first of python3, /opt/torch/.venv/bin/python3,
#     .venv/bin/python that imports cupy; PYTHONPATH=<repo>:<site of carried wheels>
#   * wheels from build/wheels (scripts/gpu_wheels.sh), each installed only where missing:
#     nvidia-cudnn-frontend (`import cudnn`), pytest, hypothesis (pip --target); MPICH (pip
#     --prefix: libmpi + mpiexec) and mpi4py when mpi4py cannot start MPI on 1 or 2 ranks
#   * the directory holding libcudnn.so.9 (the nvidia-cudnn-cu13 wheel) goes on
#     LD_LIBRARY_PATH so the cuDNN frontend finds it
# then records the environment (nvidia-smi, versions, cuDNN backend, MPI library).
#
# tests:    NVRTC compilation of every RawModule (disttensor/ops/local/gpu/kernels/*.cu, __half
#           instances included); every GPU test (tests/mpi/test_gpu*.py and
#           tests/mpi/test_io_hdf5.py::test_gpu_blocks) on 1 rank and, where mpiexec works, on 2
#           ranks; the distributed GPU ops again with DISTTENSOR_CONV_BACKEND=im2col; a tiny
#           CosmoFlow training run with --device cuda (1 rank; 2 ranks with --amp); nvcc
#           -arch=sm_90 --resource-usage of every .cu (registers, spills).
# bench:    bench/gpu_kernels_bench.py, bench/gpu_step_bench.py, bench/conv_gpu_bench.py, all
#           --quick (GPU_CHECK_FULL=1: their own defaults), figures into one CSV.
#
# Fail soft: each step runs under `timeout`, a failing or timed-out step is recorded and the
# script goes on; steps that no longer fit in the time budget are skipped (and recorded).
# Results under REPORT_DIR (or $OUT; default
# build/gpu-check when OUT is unset):
#   gpu_report.md     status of every step, environment, failures, every bench figure
#   gpu_bench.csv     the bench figures (bench/_results.py columns)
#   gpu_check.log     this script's console output
#   gpu_logs.tar.gz   every step's full log (pytest output, rank logs, nvcc, sanitizer)
# The exit status is 0 when every step passed or was skipped for lack of GPU/MPI, 1 otherwise.
#
# Knobs: GPU_CHECK_BUDGET (seconds for the whole run; default 560 for one phase), GPU_CHECK_FULL=1, GPU_CHECK_PYTHON, GPU_CHECK_WHEELS (default build/wheels),
# GPU_CHECK_WORK (scratch, default /tmp/disttensor-gpu-check).
set -uo pipefail
CALLER_PWD=$PWD
cd "$(dirname "$0")/.."
ROOT=$PWD
PHASE=${1:-all}
case "$PHASE" in tests|bench|all|sanitize) ;; *)
  echo "usage: bash scripts/gpu_check.sh [tests|bench|all|sanitize] [REPORT_DIR]" >&2; exit 2 ;;
esac
if [ $# -ge 2 ]; then  # a report directory of the user's choice (relative to where they are)
  case "$2" in /*) OUT=$2 ;; *) OUT=$CALLER_PWD/$2 ;; esac
fi
T0=$(date +%s)
if [ "$PHASE" = all ]; then BUDGET=${GPU_CHECK_BUDGET:-1100}; else BUDGET=${GPU_CHECK_BUDGET:-560}; fi
OUT=${OUT:-$ROOT/build/gpu-check}
mkdir -p "$OUT"
WORK=${GPU_CHECK_WORK:-/tmp/disttensor-gpu-check}
rm -rf "$WORK"
mkdir -p "$WORK/logs"
WHEELS=${GPU_CHECK_WHEELS:-$ROOT/build/wheels}
SITE=$WORK/site
REPORT=$OUT/gpu_report.md
CSV=$OUT/gpu_bench.csv
STEPS=$WORK/steps.tsv
ENVF=$WORK/logs/environment.txt
: >"$STEPS"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1

banner() { printf '\n=== %s  [%ds]\n' "$*" $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
note() { printf '%s\n' "$*" | tee -a "$ENVF"; }

# step NAME STATUS SECONDS SUMMARY
step() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4//$'\t'/ }" >>"$STEPS"; }

# run NAME TIMEOUT CMD...: runs CMD under timeout (at most what is left of the budget, minus a
# reserve for the report), output to logs/NAME.log; records PASS / FAIL(rc) / TIMEOUT / SKIP
# and a one-line summary (pytest's closing line, else the last line).
run() {
  local name=$1 limit=$2; shift 2
  local lg="$WORK/logs/${name//[^A-Za-z0-9._-]/_}.log"
  local avail=$(( $(left) - 25 ))
  [ "$avail" -lt "$limit" ] && limit=$avail
  banner "$name (timeout ${limit}s)"
  if [ "$limit" -lt 20 ]; then
    echo "skipped: out of time budget ($BUDGET s)"
    step "$name" "SKIP(no time)" 0 "not run: the time budget was spent"
    return 0
  fi
  local t1 rc summary status
  t1=$(date +%s)
  printf '$ %s\n' "$*" >"$lg"
  timeout -k 10 "$limit" "$@" >>"$lg" 2>&1
  rc=$?
  local secs=$(( $(date +%s) - t1 ))
  summary=$(grep -E '[0-9]+ (passed|failed|errors?|skipped|deselected)|no tests ran' "$lg" \
            | grep -v '^\$' | tail -n 1 | sed 's/^=* *//; s/ *=*$//')
  [ -n "$summary" ] || summary=$(grep -v '^\s*$' "$lg" | tail -n 1 | cut -c1-200)
  case $rc in
    0) status=PASS ;;
    124|137) status="TIMEOUT(${limit}s)" ;;
    5) status="FAIL(no tests)" ;;
    *) status="FAIL(rc=$rc)" ;;
  esac
  step "$name" "$status" "$secs" "$summary"
  echo "$status in ${secs}s: $summary"
  if [ "$status" != PASS ]; then
    echo "--- last lines of $(basename "$lg") ---"
    tail -n 25 "$lg"
  fi
  return 0
}

# ------------------------------------------------------------------------------------------
# environment
# ------------------------------------------------------------------------------------------
banner "environment (phase: $PHASE, budget ${BUDGET}s, out: $OUT)"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} NUMBA_NUM_THREADS=${NUMBA_NUM_THREADS:-4}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 HYDRA_LAUNCHER=fork
export DISTTENSOR_TEST_LOG_DIR=$WORK/logs/ranks DISTTENSOR_TEST_TMP_DIR=$WORK/test-tmp
export DISTTENSOR_HYPOTHESIS_EXAMPLES=${DISTTENSOR_HYPOTHESIS_EXAMPLES:-10}
export DISTTENSOR_TEST_STACK_DUMP_S=${DISTTENSOR_TEST_STACK_DUMP_S:-150}
# the conv micro-batch planner's tuned plans (conv_plans.json) come back in gpu_logs.tar.gz
export DISTTENSOR_CACHE_DIR=${DISTTENSOR_CACHE_DIR:-$WORK/logs/plan-cache}

PY=""
if [ -n "${GPU_CHECK_PYTHON:-}" ]; then
  PY=$GPU_CHECK_PYTHON
else
  for c in python3 /opt/torch/.venv/bin/python3 "$ROOT/.venv/bin/python" python; do
    p=$(command -v "$c" 2>/dev/null) || continue
    if "$p" -c "import cupy" >/dev/null 2>&1; then PY=$p; break; fi
  done
  [ -n "$PY" ] || PY=$(command -v python3 || echo "$ROOT/.venv/bin/python")
fi
export PYTHONPATH=$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}
note "python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])' 2>&1))"

has() { "$PY" -c "import $1" >/dev/null 2>&1; }
pip_target() {
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$@" 2>&1 | grep -v -i "running pip as the 'root' user\|^$" || true
}
wheel() {  # wheel GROUP NAME-PREFIX: the carried wheel file, or nothing
  compgen -G "$WHEELS/$1/$2-*.whl" | head -n 1
}
short() { local w out=(); for w in "$@"; do w=${w##*/}; out+=("$(echo "$w" | cut -d- -f1-2)"); done; echo "${out[*]}"; }

installed=()
if ! has cudnn; then
  w=$(wheel required nvidia_cudnn_frontend)
  if [ -n "$w" ]; then
    pip_target "$w"
    if has cudnn; then installed+=("$(short "$w")")
    else note "WARNING: installing $(basename "$w") did not make 'import cudnn' work"; fi
  else note "WARNING: no cuDNN frontend here and no wheel in $WHEELS/required (run scripts/gpu_wheels.sh and carry build/wheels): convolutions fall back to im2col"; fi
fi
for mod in pytest hypothesis; do
  if ! has "$mod"; then
    case $mod in
      pytest) names="pytest pluggy iniconfig packaging" ;;
      hypothesis) names="hypothesis sortedcontainers attrs" ;;
    esac
    ws=()
    for n in $names; do w=$(wheel fallback "$n"); [ -n "$w" ] && ws+=("$w"); done
    if [ ${#ws[@]} -gt 0 ]; then pip_target "${ws[@]}"; fi
    if has "$mod"; then installed+=("$(short "${ws[@]}")")
    else note "WARNING: $mod is missing and could not be installed from $WHEELS/fallback"; fi
  fi
done
# the directory of libcudnn.so.9 (nvidia-cudnn-cu13's wheel) on LD_LIBRARY_PATH
CUDNN_LIB=$("$PY" - <<'EOF' 2>/dev/null
import glob, os, site, sysconfig
roots = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
try:
    roots |= set(site.getsitepackages())
except Exception:
    pass
for r in sorted(roots):
    hits = sorted(glob.glob(os.path.join(r, "nvidia", "**", "libcudnn.so.9*"), recursive=True))
    if hits:
        print(os.path.dirname(hits[0]))
        break
EOF
)
if [ -n "$CUDNN_LIB" ]; then
  export LD_LIBRARY_PATH=$CUDNN_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  note "libcudnn: $CUDNN_LIB"
else
  note "libcudnn: no nvidia/**/libcudnn.so.9* under the python's site-packages"
fi

# --- MPI: 1 rank (mpi4py imports and starts), 2 ranks (mpiexec) -------------------------------
mpi1() { timeout 60 "$PY" -c "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0].strip())" 2>&1; }
mpi2() {
  command -v mpiexec >/dev/null 2>&1 || { echo "no mpiexec on PATH"; return 1; }
  timeout 90 mpiexec -n 2 "$PY" -c "from mpi4py import MPI; c = MPI.COMM_WORLD; assert c.size == 2, c.size; s = c.allreduce(c.rank + 1); assert s == 3, s" 2>&1
}
MPI1=no; MPI2=no
if m=$(mpi1); then MPI1=yes; note "MPI (image): $m"; fi
if [ $MPI1 = yes ] && out2=$(mpi2); then MPI2=yes; fi
if [ $MPI2 = no ]; then
  w=$(wheel mpi mpich)
  if [ -n "$w" ]; then
    note "MPI: 1 rank ${MPI1}, 2 ranks no (${out2:-mpiexec failed or missing}): installing $(basename "$w")"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --prefix "$WORK/mpich" "$w" 2>&1 | grep -v -i "running pip as the 'root' user" || true
    PATH0=$PATH; LD0=${LD_LIBRARY_PATH:-}; MPI1_0=$MPI1; m0=$m
    export PATH=$WORK/mpich/bin:$PATH
    export LD_LIBRARY_PATH=$WORK/mpich/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    # mpi4py >= 4 wheels load the MPI library named here (a source build ignores it)
    export MPI4PY_LIBMPI=$WORK/mpich/lib/libmpi.so.12
    installed+=("$(short "$w")")
    MPI1=no
    if m=$(mpi1); then MPI1=yes; else
      w=$(wheel mpi mpi4py)
      if [ -n "$w" ]; then
        pip_target "$w"
        if m=$(mpi1); then MPI1=yes; installed+=("$(short "$w")"); fi
      fi
    fi
    [ $MPI1 = yes ] && note "MPI (after install): $m"
    if [ $MPI1 = yes ] && out2=$(mpi2); then MPI2=yes; fi
    if [ $MPI1 = no ] && [ "$MPI1_0" = yes ]; then
      # worse than before: back to the image's MPI (1 rank only)
      note "MPI: the carried MPICH made things worse; back to the image's MPI (1 rank)"
      export PATH=$PATH0 LD_LIBRARY_PATH=$LD0
      unset MPI4PY_LIBMPI
      rm -rf "$SITE"/mpi4py "$SITE"/mpi4py-*
      MPI1=yes; m=$m0
    fi
  fi
fi
[ $MPI1 = yes ] || note "MPI: mpi4py cannot start MPI here ($m): the tests under tests/mpi cannot run"
[ $MPI2 = yes ] || note "MPI: no working 2-rank mpiexec (${out2:-}): 2-rank runs skipped"
note "installed from carried wheels: ${installed[*]:-nothing}"

# --- versions, device -----------------------------------------------------------------------
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem \
    --format=csv,noheader 2>&1 | sed 's/^/nvidia-smi: /' | tee -a "$ENVF"
else
  note "nvidia-smi: not found"
fi
"$PY" - <<'EOF' 2>&1 | tee -a "$ENVF"
import importlib
def v(name):
    try:
        m = importlib.import_module(name)
        return getattr(m, "__version__", "?")
    except Exception as e:
        return f"missing ({type(e).__name__}: {str(e)[:120]})"
print("versions: " + ", ".join(f"{n} {v(n)}" for n in
      ("numpy", "numba", "cupy", "cudnn", "torch", "mpi4py", "h5py", "pytest", "hypothesis")))
try:
    import cupy as cp
    n = cp.cuda.runtime.getDeviceCount()
    p = cp.cuda.runtime.getDeviceProperties(0)
    name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
    print(f"cupy: {n} device(s); device 0 {name}, cc {p['major']}.{p['minor']}, "
          f"{p['multiProcessorCount']} SMs, {p['totalGlobalMem'] / 2**30:.1f} GiB; CUDA runtime "
          f"{cp.cuda.runtime.runtimeGetVersion()}, driver {cp.cuda.runtime.driverGetVersion()}")
except Exception as e:
    print(f"cupy: no GPU ({type(e).__name__}: {e})")
try:
    import cudnn
    print(f"cudnn: frontend {cudnn.__version__}, backend {cudnn.backend_version()}")
except Exception as e:
    print(f"cudnn: unavailable ({type(e).__name__}: {e})")
try:
    from disttensor.ops.local import gpu
    print(f"disttensor: conv backend {gpu.conv_backend()!r}")
except Exception as e:
    print(f"disttensor: import failed ({type(e).__name__}: {e})")
try:
    import h5py
    print(f"h5py: parallel (mpio) {bool(h5py.get_config().mpi)}")
except Exception:
    pass
EOF
timeout 60 "$PY" -m disttensor.info >>"$ENVF" 2>&1 || echo "(python -m disttensor.info failed)" >>"$ENVF"
GPU=no
"$PY" -c "import cupy, sys; sys.exit(0 if cupy.cuda.runtime.getDeviceCount() > 0 else 1)" \
  >/dev/null 2>&1 && GPU=yes
[ $GPU = yes ] || note "NO GPU visible to CuPy: GPU tests will skip and benches print 'no GPU'"
step "environment" "$([ $GPU = yes ] && echo PASS || echo 'SKIP(no GPU)')" \
  $(( $(date +%s) - T0 )) "python $PY; GPU ${GPU}; MPI 1 rank ${MPI1}, 2 ranks ${MPI2}; wheels: ${installed[*]:-none}"

# ------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------
GPU_TESTS=(tests/mpi/test_gpu.py tests/mpi/test_gpu_local_kernels.py tests/mpi/test_gpu_ops.py
           tests/mpi/test_io_hdf5.py::test_gpu_blocks)
PYTEST_ARGS=(-p no:cacheprovider -q -rfEs --tb=short -o faulthandler_timeout=150)

phase_tests() {
  if [ $GPU = yes ]; then
    run "nvrtc-compile" 180 "$PY" - <<'EOF'
import time
from disttensor.ops.local import gpu
bad = 0
for name in ("pool", "pointwise", "im2col"):
    t0 = time.perf_counter()
    try:
        _, half = gpu.rawmodules.load_module(name)
        print(f"{name}.cu: compiled in {time.perf_counter() - t0:.1f} s"
              f"{'' if half else '  (WITHOUT __half instances: cuda_fp16.h not found by NVRTC?)'}")
        bad += not half
    except Exception as e:
        bad += 1
        print(f"{name}.cu: FAILED {type(e).__name__}: {e}")
raise SystemExit(1 if bad else 0)
EOF
  else
    step "nvrtc-compile" "SKIP(no GPU)" 0 "no GPU"
  fi
  if [ $MPI1 = yes ]; then
    run "pytest gpu 1 rank" 300 "$PY" -m pytest "${GPU_TESTS[@]}" "${PYTEST_ARGS[@]}"
  else
    step "pytest gpu 1 rank" "FAIL(no MPI)" 0 "mpi4py cannot start MPI (tests/mpi/conftest.py needs it)"
  fi
  if [ $MPI2 = yes ]; then
    run "pytest gpu 2 ranks" 300 mpiexec -n 2 "$PY" -m mpi4py scripts/mpi_pytest.py \
      "${GPU_TESTS[@]}" "${PYTEST_ARGS[@]}"
  else
    step "pytest gpu 2 ranks" "SKIP(no mpiexec)" 0 "no working 2-rank mpiexec"
  fi
  if [ $GPU = yes ] && [ $MPI1 = yes ]; then
    DISTTENSOR_CONV_BACKEND=im2col run "pytest gpu ops im2col 1 rank" 150 \
      "$PY" -m pytest tests/mpi/test_gpu_ops.py "${PYTEST_ARGS[@]}"
    run "train smoke data" 60 "$PY" -m disttensor.io.synthetic --out "$WORK/data/train" \
      --samples 16 --size 16 --seed 0
    run "train cosmoflow cuda 1 rank" 150 "$PY" -m disttensor.train cosmoflow \
      --data "$WORK/data/train" --out "$WORK/train1" --widths 8,16 --dense 16,8 --epochs 1 \
      --batch-size 4 --max-steps 3 --no-checkpoint --device cuda
    if [ $MPI2 = yes ]; then
      run "train cosmoflow cuda 2 ranks amp" 150 mpiexec -n 2 "$PY" -m disttensor.train \
        cosmoflow --data "$WORK/data/train" --out "$WORK/train2" --grid 1x2x1x1 --widths 8,16 \
        --dense 16,8 --epochs 1 --batch-size 4 --max-steps 3 --no-checkpoint --device cuda --amp
    fi
  fi
  NVCC=$(command -v nvcc || true)
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
    [ -n "$NVCC" ] && break
    [ -x "$d/nvcc" ] && NVCC=$d/nvcc
  done
  if [ -n "$NVCC" ]; then
    run "nvcc sm_90 resource usage" 240 bash -c '
      rc=0
      for f in disttensor/ops/local/gpu/kernels/*.cu; do
        echo "## $f"
        out=$("$0" -std=c++17 -arch=sm_90 --resource-usage -c -o /dev/null "$f" 2>&1)
        r=$?
        printf "%s\n" "$out" | grep -E "error|warning|Function properties|registers|spill|stack frame"
        [ $r = 0 ] || { echo "FAILED: $f (nvcc exit $r)"; rc=1; }
      done
      n=$(ls disttensor/ops/local/gpu/kernels/*.cu | wc -l)
      [ $rc = 0 ] && echo "compiled $n .cu files for sm_90 ($("$0" --version | tail -n 1))"
      exit $rc' "$NVCC"
  else
    step "nvcc sm_90 resource usage" "SKIP(no nvcc)" 0 "nvcc not found"
  fi
}

# ------------------------------------------------------------------------------------------
# bench
# ------------------------------------------------------------------------------------------
phase_bench() {
  export DISTTENSOR_BENCH_CSV=$CSV
  local q=(--quick)
  [ "${GPU_CHECK_FULL:-0}" = 1 ] && q=()
  # the step bench before the conv one: it holds the headline figure, and the conv bench
  # (longest: cuDNN plans, planner tuning) records its figures line by line, so a timeout
  # there still leaves the layers it finished in the CSV
  run "bench gpu_kernels" 150 "$PY" bench/gpu_kernels_bench.py "${q[@]}"
  run "bench gpu_step" 210 "$PY" bench/gpu_step_bench.py "${q[@]}"
  run "bench conv_gpu" 300 "$PY" bench/conv_gpu_bench.py "${q[@]}"
  unset DISTTENSOR_BENCH_CSV
}

# ------------------------------------------------------------------------------------------
# sanitize (optional): compute-sanitizer on the RawKernels through their tests
# ------------------------------------------------------------------------------------------
phase_sanitize() {
  local CS
  CS=$(command -v compute-sanitizer || true)
  [ -n "$CS" ] || for d in /usr/local/cuda/bin /usr/local/cuda-*/bin /opt/nvidia/*/compute-sanitizer; do
    [ -x "$d/compute-sanitizer" ] && { CS=$d/compute-sanitizer; break; }
  done
  if [ -z "$CS" ] || [ $GPU = no ] || [ $MPI1 = no ]; then
    step "compute-sanitizer" "SKIP" 0 "needs compute-sanitizer, a GPU and mpi4py"
    return 0
  fi
  # cuDNN and cuBLAS are left out (their own internals); our kernels: pool, pointwise, im2col
  run "memcheck rawkernels" 300 "$CS" --tool memcheck --error-exitcode 99 \
    --log-file "$WORK/logs/memcheck.txt" "$PY" -m pytest tests/mpi/test_gpu_local_kernels.py \
    "${PYTEST_ARGS[@]}" -k "pool or channel_sums or activations or softmax or float16_smoke or (conv_forward and im2col) or (conv_backward_data and im2col)"
  run "racecheck reductions" 200 "$CS" --tool racecheck --error-exitcode 99 \
    --log-file "$WORK/logs/racecheck.txt" "$PY" -m pytest tests/mpi/test_gpu_local_kernels.py \
    "${PYTEST_ARGS[@]}" -k "channel_sums"
}

case "$PHASE" in
  tests) phase_tests ;;
  bench) phase_bench ;;
  sanitize) phase_sanitize ;;
  all) phase_tests; phase_bench ;;
esac

# ------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------
banner "report"
"$PY" - "$REPORT" "$STEPS" "$ENVF" "$CSV" "$WORK/logs" "$PHASE" "$BUDGET" "$ROOT" <<'EOF' || {
import glob, os, re, sys, time
report, steps_f, env_f, csv_f, logs, phase, budget, root = sys.argv[1:]
sys.path.insert(0, os.path.join(root, "bench"))
rows = [l.rstrip("\n").split("\t") for l in open(steps_f) if l.strip()]
L = [f"# disttensor GPU check: phase `{phase}`", "",
     f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}; time budget {budget} s. Full logs: "
     "gpu_logs.tar.gz (one log per step), console: gpu_check.log.", "",
     "## Steps", "", "| step | status | s | summary |", "|---|---|---|---|"]
for name, status, secs, summary in rows:
    mark = status if status.startswith(("PASS", "SKIP")) else f"**{status}**"
    L.append(f"| {name} | {mark} | {secs} | {summary.replace('|', '/')} |")
bad = [r for r in rows if not r[1].startswith(("PASS", "SKIP"))]
L += ["", f"{len(rows) - len(bad)} of {len(rows)} steps passed or were skipped"
      + (f"; failed: {', '.join(r[0] for r in bad)}" if bad else "") + ".", ""]
L += ["## Environment", "", "```"] + [l.rstrip() for l in open(env_f)] + ["```", ""]
# failures: pytest's short summary lines and NVRTC/bench FAILED lines of every log
fails = []
for lg in sorted(glob.glob(os.path.join(logs, "*.log"))):
    hits = [l.rstrip() for l in open(lg, errors="replace")
            if re.match(r"^(FAILED|ERROR) |.*: FAILED|.*FAILED \w+Error|^E +\w+(Error|Exception)", l)]
    if hits:
        fails.append(f"### {os.path.basename(lg)}")
        fails += ["```"] + [h[:400] for h in hits[:40]] + (["..."] if len(hits) > 40 else []) + ["```"]
if fails:
    L += ["## Failures (first lines; details in the step logs)", ""] + fails + [""]
if os.path.exists(csv_f):
    from _results import read
    figs = read(csv_f)
    L += ["## Bench figures (gpu_bench.csv)", "",
          "| bench | case | metric | value | target | met |", "|---|---|---|---|---|---|"]
    met = n_t = 0
    for r in figs:
        t = r["target"]
        ok = "" if t is None else ("yes" if (r["value"] >= t if r["better"] == "higher"
                                            else r["value"] <= t) else "**no**")
        n_t += t is not None
        met += ok == "yes"
        L.append(f"| {r['bench']} | {r['case']} | {r['metric']} | {r['value']:.4g} {r['unit']} | "
                 f"{'' if t is None else ('>= ' if r['better'] == 'higher' else '<= ') + format(t, '.3g')} | {ok} |")
    L += ["", f"{met} of {n_t} targeted figures meet their target.", ""]
open(report, "w").write("\n".join(L) + "\n")
EOF
  { echo "# disttensor GPU check ($PHASE): report generator failed; raw steps:"; echo '```';
    cat "$STEPS"; echo '```'; } >"$REPORT"; }
tar -C "$WORK" -czf "$OUT/gpu_logs.tar.gz" logs 2>/dev/null || true

FAILED=0
while IFS=$'\t' read -r _ status _ _; do
  case "$status" in PASS*|SKIP*) ;; *) FAILED=1 ;; esac
done <"$STEPS"

banner "summary"
cut -f1-3 "$STEPS" | column -t -s $'\t' 2>/dev/null || cut -f1-3 "$STEPS"
echo
echo "report:  $REPORT"
[ -f "$CSV" ] && echo "figures: $CSV"
echo "logs:    $OUT/gpu_logs.tar.gz"
echo "console: $OUT/gpu_check.log"
echo "overall: $([ $FAILED = 0 ] && echo PASS || echo FAIL) in $(( $(date +%s) - T0 ))s"
sleep 0.3  # let tee flush gpu_check.log
exit $FAILED
