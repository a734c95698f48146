"""The GPU RawModule sources as NVRTC gets them (disttensor.ops.local.gpu.rawmodules), without a
GPU or CuPy: the local headers of ``kernels/*.cu`` are inlined in place of their include lines,
nothing of the kernels is lost, and (where ``nvcc`` is installed) the expanded source compiles
on its own, away from the headers."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from disttensor.ops.local.gpu import rawmodules

MODULES = sorted(rawmodules.MODULE_SPECS)
LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s*"', re.M)


def _kernel_names(module):
    """The kernel names of ``module``'s name expressions (``"channel_partial<{T}, 0>"`` ->
    ``channel_partial``)."""
    _, templated, plain = rawmodules.MODULE_SPECS[module]
    return sorted({e.split("<")[0] for e in templated + plain})


def test_the_loader_imports_without_cupy():
    """``import disttensor.ops.local.gpu`` neither needs nor imports CuPy."""
    code = ("import sys, disttensor.ops.local.gpu as g; "
            "assert 'cupy' not in sys.modules; print(g.conv_backend())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() in ("cudnn", "im2col")


@pytest.mark.parametrize("module", MODULES)
def test_kernel_files_share_the_common_header(module):
    """Every kernel file includes kernels/common.cuh (one copy of the traits for nvcc and
    NVRTC alike) instead of defining them again."""
    path = rawmodules.KERNEL_DIR / rawmodules.MODULE_SPECS[module][0]
    text = path.read_text()
    # kernels beside the header include it by name; those of another package (sparse/kernels)
    # by a relative path that must lead to the same file
    found = re.search(r'^#include "((?:[./\w]+/)?common\.cuh)"$', text, re.M)
    assert found
    assert (path.parent / found.group(1)).resolve() == \
        (rawmodules.KERNEL_DIR / "common.cuh").resolve()
    assert "struct Num<float>" not in text
    assert "#define DTK_GRID_STRIDE" not in text


@pytest.mark.parametrize("module", MODULES)
def test_module_source_inlines_the_local_headers(module):
    src = rawmodules.module_source(module)
    assert not LOCAL_INCLUDE.search(src)
    header = (rawmodules.KERNEL_DIR / "common.cuh").read_text().strip()
    assert header in src
    assert src.count("struct Num<float>") == 1
    assert src.count("#define DTK_GRID_STRIDE") == 1
    assert "#include <cuda_fp16.h>" in src  # angle includes are left to NVRTC
    for name in _kernel_names(module):
        assert re.search(rf"__global__ void {name}\(", src), name


@pytest.mark.parametrize("module", MODULES)
def test_module_source_keeps_every_name_expression(module):
    """Each kernel named in MODULE_SPECS is defined (and, when templated, explicitly
    instantiated) in the expanded source, so RawModule.get_function finds it."""
    src = rawmodules.module_source(module)
    _, templated, plain = rawmodules.MODULE_SPECS[module]
    for expr in templated:
        name = expr.split("<")[0]
        assert re.search(rf"template <typename T[^>]*>\s*__global__ void {name}\(", src), name
        assert re.search(rf"template __global__ void {name}<", src), name
    for name in plain:  # plain kernels, or explicit template arguments (csb<float, ...>)
        base = name.split("<")[0]
        if "<" in name:
            assert re.search(rf"template <[^>]*>\s*__global__ void {base}\(", src), name
        else:
            assert re.search(rf"^__global__ void {name}\(", src, re.M), name


def test_expand_local_includes_nests_and_leaves_angle_includes(tmp_path):
    (tmp_path / "a.cuh").write_text('#include "b.cuh"\nint a;\n')
    (tmp_path / "b.cuh").write_text("int b;\n")
    code = ('#include <cuda_fp16.h>\n#include "a.cuh"  // traits\n'
            '  # include "b.cuh"\n// #include "b.cuh" in a comment\nint main;\n')
    out = rawmodules.expand_local_includes(code, tmp_path)
    lines = out.splitlines()
    assert lines[0] == "#include <cuda_fp16.h>"
    assert [ln for ln in lines if not ln.startswith("//")] == [
        "#include <cuda_fp16.h>", "int b;", "int a;", "int b;", "int main;"]
    assert '// #include "b.cuh" in a comment' in lines
    assert not LOCAL_INCLUDE.search(out)


def test_expand_local_includes_rejects_a_cycle(tmp_path):
    (tmp_path / "a.cuh").write_text('#include "b.cuh"\n')
    (tmp_path / "b.cuh").write_text('#include "a.cuh"\n')
    with pytest.raises(ValueError, match="recursive"):
        rawmodules.expand_local_includes('#include "a.cuh"\n', tmp_path)


def test_expand_local_includes_needs_the_header(tmp_path):
    with pytest.raises(FileNotFoundError):
        rawmodules.expand_local_includes('#include "missing.cuh"\n', tmp_path)


@pytest.mark.parametrize("module", MODULES)
def test_expanded_source_compiles_alone(module, tmp_path):
    """The source NVRTC gets compiles with nvcc in a folder without the headers (skipped where
    nvcc is not installed)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not installed")
    src = tmp_path / f"{module}.cu"
    src.write_text(rawmodules.module_source(module))
    for defs in ([], ["-DDISTTENSOR_NO_HALF"]):
        r = subprocess.run([nvcc, "-std=c++17", *defs, "-ptx", "-o", str(tmp_path / "k.ptx"),
                            str(src)], capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
