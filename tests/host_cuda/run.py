"""Run tests/host_cuda twice: on the plain host build of the GPU RawKernels and on the build
with AddressSanitizer + UndefinedBehaviorSanitizer (in a Python started with libasan
preloaded), each requiring that every kernel of ``rawmodules.MODULE_SPECS`` ran.  The
libraries are compiled first, two at a time.  Exit status 0 when both pass; the step
"RawKernels on the host" of scripts/test.sh.

    python tests/host_cuda/run.py [--plain-only | --sanitized-only] [pytest args...]
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import host_build  # noqa: E402


def main(argv):
    variants = ["plain", "sanitized"]
    if argv and argv[0] in ("--plain-only", "--sanitized-only"):
        variants = [argv[0][2:-5]]
        argv = argv[1:]
    if host_build.compiler() is None:
        print("no C++ compiler (g++ or $CXX): host RawKernels not run")
        return 3
    from disttensor.ops.local.gpu import rawmodules
    t0 = time.time()
    modules = sorted(rawmodules.MODULE_SPECS) + sorted(host_build.TEST_MODULES)
    jobs = [(m, v) for v in variants for m in modules]
    with ThreadPoolExecutor(max_workers=2) as ex:
        list(ex.map(lambda mv: host_build.build(*mv), jobs))
    print(f"host builds of {len(jobs)} libraries ({', '.join(variants)}): "
          f"{time.time() - t0:.1f} s", flush=True)
    status = 0
    for variant in variants:
        env = dict(os.environ, DISTTENSOR_HOST_CUDA_VARIANT=variant,
                   DISTTENSOR_HOST_CUDA_REQUIRE_ALL="1")
        if variant == "sanitized":
            env = host_build.sanitizer_env(env)
        t1 = time.time()
        rc = subprocess.run([sys.executable, "-m", "pytest", str(HERE), "-q",
                             "-p", "no:cacheprovider", *argv], env=env).returncode
        print(f"{variant} build: pytest exit {rc}, {time.time() - t1:.1f} s", flush=True)
        status = status or rc
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
