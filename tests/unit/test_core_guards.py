"""Pure helpers of the array bugs of issue 25: NumPy's arange dtype rule, the allocation and
gather guards (core/memory), the printout's index selection (core/printing) and library
warnings at the user's line (core/warn).  One process; the MPI sides are in
tests/mpi/test_array_bugs.py and tests/mpi/test_printing.py."""
from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

from disttensor.core import memory, printing
from disttensor.core.warn import warn
from disttensor.ops.local.microbatch.timing import warn_once
from disttensor.routines.creation import arange_dtype

_VALUES = [0, 3, 5.0, True, np.float32(2), np.float16(1), np.int8(2), np.uint64(7),
           np.uint8(3), 1 + 0j, np.complex64(1), 2**63 + 5, np.int32(4), np.float64(3)]


def test_arange_dtype_is_numpys_for_every_combination_numpy_accepts():
    checked = 0
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for start, stop, step in itertools.product(_VALUES, _VALUES, [1, 1.0, np.int8(1),
                                                                      np.float32(0.5), True]):
            try:
                want = np.arange(start, stop, step).dtype
            except (ValueError, TypeError, OverflowError, MemoryError):
                continue  # NumPy refuses (too long a range): nothing to compare
            assert arange_dtype(start, stop, step) == want, (start, stop, step)
            checked += 1
    assert checked > 500
    assert arange_dtype(0, 5.0, 1) == np.float64 and arange_dtype(0, 5, 1) == np.int64
    assert arange_dtype(0, 5.0, 1, dtype=np.int32) == np.int32


def test_allocate_names_the_rank_the_shape_and_the_bytes():
    block = memory.allocate((2, 3), np.float32, fill=1.5)
    assert block.dtype == np.float32 and (block == 1.5).all()
    assert (memory.allocate((4,), np.int64, fill=0) == 0).all()
    with pytest.raises(MemoryError, match=r"zeros: rank 3 cannot allocate its block of shape "
                       r"\(1000000000000000,\) and dtype float64 \(7\.1 PiB, "
                       r"8000000000000000 bytes\)"):
        memory.allocate((10**15,), np.float64, fill=0, rank=3, call="zeros")


def test_format_bytes():
    assert memory.format_bytes(512) == "512 bytes"
    assert memory.format_bytes(3 * 1024**2) == "3.0 MiB"
    assert memory.format_bytes(80 * 10**12) == "72.8 TiB"


def test_gather_limit_reads_the_variable_at_each_call(monkeypatch):
    monkeypatch.delenv("DISTTENSOR_GATHER_LIMIT", raising=False)
    assert memory.gather_limit() == 1 << 30
    monkeypatch.setenv("DISTTENSOR_GATHER_LIMIT", "2e3")
    assert memory.gather_limit() == 2000

    class Sized:
        nbytes = 2001
    with pytest.raises(ValueError, match="to_numpy: .* 2001 bytes .*DISTTENSOR_GATHER_LIMIT=2000"):
        memory.check_gather_size("to_numpy", Sized())
    from disttensor.linalg import gather_path
    assert gather_path.gather_limit is memory.gather_limit  # one reader


@pytest.mark.parametrize("n,edge", [(0, 3), (5, 3), (6, 3), (7, 3), (1000, 3), (9, 0)])
def test_summary_indices_keep_what_numpy_shows(n, edge):
    a = np.arange(n) * 1.5
    picked = a[printing.summary_indices(n, edge, summarize=True)]
    with np.printoptions(threshold=0, edgeitems=edge):
        assert np.array2string(picked) == np.array2string(a)
    assert (printing.summary_indices(n, edge, summarize=False) == np.arange(n)).all()


def test_warn_points_at_the_first_frame_outside_the_package():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn("direct", RuntimeWarning)
        warn_once(("test_core_guards", "nested"), "from two frames inside the package")
    assert [w.filename for w in caught] == [__file__, __file__], [
        (w.filename, w.lineno) for w in caught]
    assert str(caught[1].message) == "from two frames inside the package"
