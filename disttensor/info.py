"""Report the software stack disttensor runs on: ``python -m disttensor.info``.

Prints versions of Python, NumPy, Numba, mpi4py and h5py, the MPI library and whether it is
CUDA-aware, whether h5py was built with parallel HDF5, and the GPU stack (CuPy, CUDA runtime,
devices, cuDNN frontend).  Every probe is guarded: a missing package or GPU prints a note,
never a traceback.  Importing this module imports nothing heavy (CuPy, cuDNN, h5py and numba
are imported only inside :func:`collect`); of disttensor it uses only ``disttensor.core.comm``.
"""
from __future__ import annotations

import importlib
import platform
import sys

__all__ = ["collect", "main"]

NOT_INSTALLED = "not installed"


def _version(module: str) -> str:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return NOT_INSTALLED
    except Exception as e:  # noqa: BLE001 - a broken install must not crash the report
        return f"import failed: {type(e).__name__}: {e}"
    return str(getattr(mod, "__version__", "unknown version"))


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip()


def _mpi_rows() -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    try:
        from mpi4py import MPI
    except ImportError:
        return [("MPI", "mpi4py not installed")]
    except Exception as e:  # noqa: BLE001
        return [("MPI", f"mpi4py import failed: {_err(e)}")]
    try:
        lib = MPI.Get_library_version().strip().splitlines()
        rows.append(("MPI library", " ".join(lib[0].split()) if lib else "unknown"))
        rows.append(("MPI standard", "%d.%d" % MPI.Get_version()))
        rows.append(("MPI vendor (mpi4py)", "%s %s" % (MPI.get_vendor()[0],
                                                       ".".join(map(str, MPI.get_vendor()[1])))))
        rows.append(("MPI processes", str(MPI.COMM_WORLD.Get_size())))
    except Exception as e:  # noqa: BLE001
        rows.append(("MPI library", f"query failed: {_err(e)}"))
    try:
        from disttensor.core.comm import cuda_aware_mpi
        rows.append(("CUDA-aware MPI (disttensor.core.comm)", str(bool(cuda_aware_mpi()))))
    except Exception as e:  # noqa: BLE001
        rows.append(("CUDA-aware MPI (disttensor.core.comm)", f"query failed: {_err(e)}"))
    try:
        from disttensor.core.comm import mpix_query_cuda_support
        q = mpix_query_cuda_support()
        rows.append(("MPIX_Query_cuda_support()",
                     "not provided by this MPI" if q is None else str(q)))
    except Exception as e:  # noqa: BLE001
        rows.append(("MPIX_Query_cuda_support()", f"query failed: {_err(e)}"))
    return rows


def _h5py_rows() -> list[tuple[str, str]]:
    try:
        import h5py
    except ImportError:
        return [("h5py", NOT_INSTALLED)]
    except Exception as e:  # noqa: BLE001
        return [("h5py", f"import failed: {_err(e)}")]
    rows = [("h5py", h5py.__version__)]
    try:
        rows.append(("HDF5", h5py.version.hdf5_version))
        rows.append(("h5py built with MPI (mpio driver)", str(bool(h5py.get_config().mpi))))
    except Exception as e:  # noqa: BLE001
        rows.append(("h5py config", f"query failed: {_err(e)}"))
    return rows


def _gpu_rows() -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    try:
        import cupy
    except ImportError:
        rows.append(("CuPy", NOT_INSTALLED))
        cupy = None
    except Exception as e:  # noqa: BLE001 - e.g. a CUDA library mismatch at import
        rows.append(("CuPy", f"import failed: {_err(e)}"))
        cupy = None
    if cupy is not None:
        rows.append(("CuPy", cupy.__version__))
        try:
            rt = cupy.cuda.runtime.runtimeGetVersion()
            rows.append(("CUDA runtime", f"{rt // 1000}.{rt % 1000 // 10}"))
        except Exception as e:  # noqa: BLE001
            rows.append(("CUDA runtime", f"unavailable: {_err(e)}"))
        try:
            drv = cupy.cuda.runtime.driverGetVersion()
            rows.append(("CUDA driver", f"{drv // 1000}.{drv % 1000 // 10}"))
        except Exception as e:  # noqa: BLE001
            rows.append(("CUDA driver", f"unavailable: {_err(e)}"))
        try:
            n = cupy.cuda.runtime.getDeviceCount()
            rows.append(("GPU devices", str(n)))
            for i in range(n):
                props = cupy.cuda.runtime.getDeviceProperties(i)
                name = props["name"]
                name = name.decode() if isinstance(name, bytes) else str(name)
                mem = props.get("totalGlobalMem", 0) / 2**30
                rows.append((f"  device {i}", f"{name}, {mem:.1f} GiB, "
                                               f"sm_{props['major']}{props['minor']}"))
        except Exception as e:  # noqa: BLE001
            rows.append(("GPU devices", f"0 ({_err(e)})"))
    try:
        import cudnn
    except ImportError:
        rows.append(("cuDNN frontend (cudnn)", NOT_INSTALLED))
    except Exception as e:  # noqa: BLE001
        rows.append(("cuDNN frontend (cudnn)", f"import failed: {_err(e)}"))
    else:
        rows.append(("cuDNN frontend (cudnn)", str(getattr(cudnn, "__version__", "unknown"))))
        try:
            rows.append(("cuDNN backend_version()", str(cudnn.backend_version())))
        except Exception as e:  # noqa: BLE001
            rows.append(("cuDNN backend_version()", f"failed: {_err(e)}"))
    return rows


def _ops_rows() -> list[tuple[str, str]]:
    """Which local kernels the CNN ops would use here."""
    import os
    rows = [("ops: CPU conv", "im2col (Numba) + BLAS GEMM, workspace "
             f"{os.environ.get('DISTTENSOR_CONV_WORKSPACE_MB', '64')} MiB"),
            ("ops: OMP_WAIT_POLICY", os.environ.get("OMP_WAIT_POLICY", "unset (PASSIVE on "
                                                    "first use of disttensor.ops)"))]
    try:
        from .core.backend import gpu_available
        if gpu_available():
            from .ops.local import gpu
            rows.append(("ops: GPU conv backend", gpu.conv_backend()))
    except Exception as e:  # noqa: BLE001
        rows.append(("ops: GPU conv backend", f"failed: {_err(e)}"))
    rows += _gpu_comm_rows()
    return rows


def _gpu_comm_rows() -> list[tuple[str, str]]:
    """Which path CuPy arrays take between ranks (NCCL, CUDA-aware MPI, pinned staging) and
    whether the float16 RawKernels compiled.  Collective over COMM_WORLD (the NCCL
    communicator is made to see whether it works): run it the same way on every rank."""
    rows: list[tuple[str, str]] = []
    try:
        from .core.backend import gpu_available
        if not gpu_available():
            return [("GPU communication", "no GPU")]
        from .core.gpucomm import gpu_paths
        for what, path in gpu_paths().items():
            rows.append((f"GPU {what}", path))
        from .ops.local.gpu import rawmodules
        for name in sorted(rawmodules.MODULE_SPECS):
            rawmodules.load_module(name)
        missing = rawmodules.HALF_UNAVAILABLE
        rows.append(("GPU float16 kernels", "compiled" if not missing else
                     "unavailable: " + "; ".join(f"{k}: {v}" for k, v in missing.items())))
    except Exception as e:  # noqa: BLE001
        rows.append(("GPU communication", f"failed: {_err(e)}"))
    return rows


def collect() -> list[tuple[str, str]]:
    """(name, value) rows of the report."""
    rows = [("python", f"{platform.python_version()} ({sys.executable})"),
            ("platform", platform.platform())]
    for name in ("numpy", "numba", "mpi4py"):
        rows.append((name, _version(name)))
    rows += _h5py_rows()
    rows += _mpi_rows()
    rows += _gpu_rows()
    rows += _ops_rows()
    return rows


def main() -> int:
    rows = collect()
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
