"""The Python side of the GPU paths, run here without a GPU through stand-ins for CuPy, the
cuDNN frontend and NCCL that record what they are given: the cuDNN workspace and operands go
to the frontend as buffers (with their extent), not bare pointers; a failed float16 NVRTC build
is said and recorded, a broken kernel is not hidden behind it; NCCL is bootstrapped over MPI
only where it can work and falls back on every rank together; gradient buckets pick their
transport.  (The same code runs for real in tests/mpi/test_gpu*.py on a GPU machine.)"""
from __future__ import annotations

import sys
import types
import warnings

import numpy as np
import pytest

from disttensor.core import gpucomm
from disttensor.ops.local.gpu import cudnn_conv, rawmodules


# -- cuDNN frontend: what execute() receives ---------------------------------------------------
class _DeviceArray:
    """What the frontend sees of a CuPy array: a buffer with an extent (``nbytes``)."""

    def __init__(self, nbytes, dtype=np.uint8):
        self.nbytes, self.dtype = int(nbytes), np.dtype(dtype)
        self.data = types.SimpleNamespace(ptr=0x7000 + int(nbytes))


class _RecordingGraph:
    def __init__(self):
        self.calls = []

    def execute(self, pack, workspace, handle=None):
        self.calls.append(("execute", pack, workspace, None))

    def execute_plan_at_index(self, pack, workspace, index, handle=None):
        self.calls.append(("at_index", pack, workspace, index))


def _fake_cudnn_and_cupy(monkeypatch):
    cudnn = types.ModuleType("cudnn")
    cudnn.create_handle = lambda: "handle"
    cudnn.set_stream = lambda handle, stream: None
    monkeypatch.setitem(sys.modules, "cudnn", cudnn)
    cuda = types.SimpleNamespace(
        Device=lambda *a: types.SimpleNamespace(id=0, __enter__=lambda s: s,
                                                __exit__=lambda *e: None),
        get_current_stream=lambda: types.SimpleNamespace(ptr=1))
    cp = types.SimpleNamespace(cuda=cuda, uint8=np.uint8,
                               empty=lambda n, dtype: _DeviceArray(n, dtype))
    monkeypatch.setattr(cudnn_conv, "cupy", lambda: cp)
    monkeypatch.setattr(cudnn_conv, "_cudnn_handle", lambda cudnn, cp: "handle")


@pytest.mark.parametrize("index", [None, 3])
def test_cudnn_gets_the_workspace_and_operands_as_buffers(monkeypatch, index):
    """The workspace reaches the frontend as a buffer of the plan's size (the frontend reads
    its extent; a bare int pointer is 0 bytes to it), and so do the operands."""
    _fake_cudnn_and_cupy(monkeypatch)
    graph = _RecordingGraph()
    ws = 4096 if index is None else [(1, 64), (3, 8192)]
    plan = cudnn_conv._CudnnPlan(graph, ("X", "W", "Y"), ws, (0,) * 3, (0,) * 3, (1, 1, 4, 4, 4))
    arrays = tuple(_DeviceArray(n) for n in (100, 200, 300))
    cudnn_conv._cudnn_execute(plan, arrays, index)
    (kind, pack, workspace, at), = graph.calls
    assert kind == ("execute" if index is None else "at_index") and at == index
    assert not isinstance(workspace, int)
    assert workspace.nbytes == (4096 if index is None else 8192)
    assert all(not isinstance(v, int) for v in pack.values())
    assert [pack[t] for t in ("X", "W", "Y")] == list(arrays)


def test_cudnn_zero_workspace_is_none(monkeypatch):
    _fake_cudnn_and_cupy(monkeypatch)
    graph = _RecordingGraph()
    plan = cudnn_conv._CudnnPlan(graph, ("X", "W", "Y"), 0, (0,) * 3, (0,) * 3, (1, 1, 2, 2, 2))
    cudnn_conv._cudnn_execute(plan, tuple(_DeviceArray(8) for _ in range(3)))
    assert graph.calls[0][2] is None


# -- NVRTC: the float16 fallback is said, and never hides a broken kernel ---------------------
class _FakeRawModule:
    fail_half = False
    fail_all = False
    built: list = []

    def __init__(self, code, options, name_expressions):
        half = "-DDISTTENSOR_NO_HALF" not in options
        _FakeRawModule.built.append(half)
        if _FakeRawModule.fail_all:
            raise RuntimeError("error: identifier \"oops\" is undefined")
        if half and _FakeRawModule.fail_half:
            raise RuntimeError("catastrophic error: cannot open source file \"cuda_fp16.h\"")

    def get_function(self, expr):
        return expr


@pytest.fixture
def fake_nvrtc(monkeypatch):
    monkeypatch.setattr(rawmodules, "cupy", lambda: types.SimpleNamespace(
        RawModule=_FakeRawModule))
    monkeypatch.setattr(rawmodules, "_modules", {})
    monkeypatch.setattr(rawmodules, "HALF_UNAVAILABLE", {})
    _FakeRawModule.fail_half = _FakeRawModule.fail_all = False
    _FakeRawModule.built = []
    return _FakeRawModule


def test_float16_build_failure_is_warned_and_recorded(fake_nvrtc):
    fake_nvrtc.fail_half = True
    with pytest.warns(RuntimeWarning, match="float16 instances .*'pool'.*cuda_fp16"):
        mod, has_half = rawmodules.load_module("pool")
    assert not has_half and fake_nvrtc.built == [True, False]
    assert "cuda_fp16.h" in rawmodules.HALF_UNAVAILABLE["pool"]
    with pytest.raises(TypeError, match="cuda_fp16.h"):
        rawmodules.ctype(np.float16, "pool")
    assert rawmodules.ctype(np.float32, "pool") == "float"


def test_a_broken_kernel_is_not_hidden_behind_the_float16_fallback(fake_nvrtc):
    fake_nvrtc.fail_all = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no float16 warning either: it is not the reason
        with pytest.raises(RuntimeError, match="oops"):
            rawmodules.load_module("im2col")
    assert "im2col" not in rawmodules.HALF_UNAVAILABLE


def test_full_build_has_half(fake_nvrtc):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, has_half = rawmodules.load_module("pointwise")
    assert has_half and fake_nvrtc.built == [True]


# -- NCCL bootstrap over MPI -------------------------------------------------------------------
class _FakeComm:
    """Two ranks seen from rank ``rank``: collectives answer with what the 'other rank' holds."""

    def __init__(self, rank=0, other_identity=("node1", "0000:19:00.0"), other_fails=False):
        self.rank, self.size = rank, 2
        self.other_identity, self.other_fails = other_identity, other_fails
        self.bcasts = []
        self.attrs = {}  # MPI attributes (where the NCCL communicator is cached)

    def Get_attr(self, keyval):
        return self.attrs.get(keyval)

    def Set_attr(self, keyval, value):
        self.attrs[keyval] = value

    def allreduce(self, v, op=None):
        from mpi4py import MPI
        other = (1 if self.other_fails else 0) if op is MPI.MAX else 1
        return max(v, other) if op is MPI.MAX else min(v, other)

    def allgather(self, v):
        return [v, self.other_identity] if self.rank == 0 else [self.other_identity, v]

    def bcast(self, v, root=0):
        self.bcasts.append(v)
        return v if self.rank == root else b"uid-from-rank-0"


@pytest.fixture
def fake_nccl(monkeypatch):
    made = []
    nccl = types.SimpleNamespace(
        get_unique_id=lambda: b"uid-from-rank-0",
        NCCL_FLOAT32=7, NCCL_FLOAT64=8, NCCL_FLOAT16=6, NCCL_INT32=2, NCCL_INT64=4,
        NCCL_SUM=0, NCCL_MAX=2)

    class Communicator:
        def __init__(self, n, uid, rank):
            self.n, self.uid, self.rank = n, uid, rank
            self.calls, self.destroyed = [], False
            made.append(self)

        def allReduce(self, send, recv, count, dtype, op, stream):
            self.calls.append((send, recv, count, dtype, op, stream))

        def destroy(self):
            self.destroyed = True

    nccl.NcclCommunicator = Communicator
    monkeypatch.setattr(gpucomm, "_nccl_module", lambda: nccl)
    monkeypatch.setattr(gpucomm, "_device_identity", lambda: ("node1", "0000:1a:00.0"))
    monkeypatch.delenv("DISTTENSOR_NCCL", raising=False)
    return nccl, made


@pytest.mark.parametrize("rank", [0, 1])
def test_nccl_bootstrap_shares_rank0_unique_id(fake_nccl, rank):
    nccl, made = fake_nccl
    comm = _FakeComm(rank=rank)
    nc = gpucomm.nccl_communicator(comm)
    assert nc is made[0] and (nc.n, nc.rank, nc.uid) == (2, rank, b"uid-from-rank-0")
    assert comm.bcasts == [b"uid-from-rank-0" if rank == 0 else None]
    assert gpucomm.nccl_communicator(comm) is nc and len(made) == 1  # cached
    assert gpucomm.nccl_reason(comm) is None


def test_nccl_not_used_when_two_ranks_share_a_gpu(fake_nccl):
    _, made = fake_nccl
    comm = _FakeComm(other_identity=("node1", "0000:1a:00.0"))
    assert gpucomm.nccl_communicator(comm) is None and not made
    assert "same GPU" in gpucomm.nccl_reason(comm)


def test_nccl_disabled_by_environment(fake_nccl, monkeypatch):
    monkeypatch.setenv("DISTTENSOR_NCCL", "0")
    comm = _FakeComm()
    assert gpucomm.nccl_communicator(comm) is None
    assert "DISTTENSOR_NCCL" in gpucomm.nccl_reason(comm)


def test_nccl_failure_on_another_rank_falls_back_here_too(fake_nccl):
    _, made = fake_nccl
    comm = _FakeComm(other_fails=True)
    assert gpucomm.nccl_communicator(comm) is None
    assert made[0].destroyed and "another rank" in gpucomm.nccl_reason(comm)


def test_device_allreduce_is_queued_on_the_given_stream(fake_nccl, monkeypatch):
    nccl, made = fake_nccl
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(
        cuda=types.SimpleNamespace(nccl=nccl, get_current_stream=lambda: None)))
    monkeypatch.setitem(sys.modules, "cupy.cuda", sys.modules["cupy"].cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", nccl)
    comm = _FakeComm()
    arr = types.SimpleNamespace(dtype=np.dtype(np.float32), size=12,
                                flags=types.SimpleNamespace(c_contiguous=True),
                                data=types.SimpleNamespace(ptr=0xBEEF))
    stream = types.SimpleNamespace(ptr=0x5)
    assert gpucomm.device_allreduce(comm, arr, "sum", stream=stream) is arr
    assert made[0].calls == [(0xBEEF, 0xBEEF, 12, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0x5)]
    arr.dtype = np.dtype(np.complex64)  # no NCCL type: the caller takes the MPI path
    assert gpucomm.device_allreduce(comm, arr, "sum", stream=stream) is None


def test_gpu_paths_without_a_gpu():
    assert gpucomm.gpu_paths() == {"gradient sums": "no GPU", "halo exchange": "no GPU"}


# -- one GPU per rank ---------------------------------------------------------------------------
def test_local_device_index_from_the_launchers_environment():
    from disttensor.core.backend import local_device_index
    assert local_device_index(4, {"OMPI_COMM_WORLD_LOCAL_RANK": "6"}) == 2
    assert local_device_index(8, {"MPI_LOCALRANKID": "3", "SLURM_LOCALID": "5"}) == 3
    assert local_device_index(8, {"SLURM_LOCALID": "5"}) == 5
    assert local_device_index(1, {"SLURM_LOCALID": "5"}) is None   # one visible GPU
    assert local_device_index(4, {}) is None                        # nothing known
    assert local_device_index(4, {"DISTTENSOR_GPU": "1", "SLURM_LOCALID": "3"}) == 1
    with pytest.raises(ValueError, match="DISTTENSOR_GPU=4"):
        local_device_index(4, {"DISTTENSOR_GPU": "4"})


def test_device_allgather_gathers_rank_rows_on_the_device(fake_nccl, monkeypatch):
    nccl, made = fake_nccl
    nccl.NCCL_FLOAT64 = 8
    gathered = []

    class FakeCupyArray:
        def __init__(self, shape, dtype):
            self.shape, self.dtype = shape, np.dtype(dtype)
            self.size = int(np.prod(shape))
            self.data = types.SimpleNamespace(ptr=0x1000 + self.size)

        def reshape(self, *s):
            return self

    cupy = types.SimpleNamespace(
        ascontiguousarray=lambda a: a,
        empty=lambda shape, dtype: FakeCupyArray(shape, dtype),
        cuda=types.SimpleNamespace(nccl=nccl,
                                   get_current_stream=lambda: types.SimpleNamespace(ptr=9)))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cupy.cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", nccl)
    comm = _FakeComm()
    nc = gpucomm.nccl_communicator(comm)
    nc.allGather = lambda send, recv, count, dtype, stream: gathered.append(
        (send, recv, count, dtype, stream))
    mine = FakeCupyArray((5,), np.float64)
    out = gpucomm.device_allgather(comm, mine)
    assert out.shape == (2, 5) and out.dtype == np.float64
    assert gathered == [(mine.data.ptr, out.data.ptr, 5, nccl.NCCL_FLOAT64, 9)]


def test_gpu_pooling_refuses_negative_pads_as_the_cpu_kernel_does():
    """The operand check runs before any CuPy call, so it is testable here."""
    from disttensor.ops.local.cpu import pool as cpu_pool
    from disttensor.ops.local.gpu import pooling as gpu_pool
    x = np.zeros((1, 1, 4, 4, 4))
    with pytest.raises(ValueError, match="pad_lo"):
        cpu_pool.pool_forward(x, "max", (2, 2, 2), (1, 1, 1), (-1, 0, 0), (0, 0, 0))
    with pytest.raises(ValueError, match="pad_lo"):
        gpu_pool._pool_args("max", (2, 2, 2), (1, 1, 1), (-1, 0, 0), (0, 0, 0))
