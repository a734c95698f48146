"""Importing the library loads no heavy optional module: Numba/llvmlite (the CPU kernels),
h5py (files), SciPy, YAML, Zarr, tqdm and Matplotlib load where they are first used.

Each check runs a fresh interpreter (the test process has loaded them already) and reads its
``sys.modules``."""
import json
import subprocess
import sys

import pytest

HEAVY = ("numba", "llvmlite", "h5py", "scipy", "yaml", "zarr", "tqdm", "matplotlib", "cupy")


def _loaded_after(code: str) -> list[str]:
    probe = (code + "\nimport sys, json\n"
             f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_loads_no_heavy_module():
    assert _loaded_after("import disttensor, disttensor.nn, disttensor.train\n"
                         "disttensor.ProcessGrid()") == []


@pytest.mark.parametrize("code, module", [
    ("import disttensor.io as io; io.hdf5_driver_available('independent'); "
     "io._h5file.h5py.File", "h5py"),
    ("from disttensor.ops.local.cpu import pool", "numba"),
])
def test_heavy_module_loads_on_first_use(code, module):
    # The same interpreter check sees the module once it is used: the probe above can fail.
    assert module in _loaded_after(code)
