"""Samples stored as (gzipped) TFRecord files of the MLPerf HPC CosmoFlow layout, through the
``tfrecord`` package (the ``disttensor[tfrecord]`` extra; no TensorFlow needed).

Layout
------
Each record is a serialized ``tf.train.Example`` with the features of the MLPerf HPC
CosmoFlow reference (``data/cosmo.py``): ``x``, one ``bytes`` value holding the raw sample
(``D,H,W,C`` = ``128,128,128,4`` ``int16`` in MLPerf HPC v1.0, C order, little-endian), and
``y``, the ``float32`` targets (4 values).  Files are ``*.tfrecord`` in a directory, sorted by
name, gzip-compressed (MLPerf v1.0) or not (recognized by gzip's magic bytes), one or more
records each (records are numbered file by file).  The record's bytes carry no shape, so the
sample shape is declared: ``TFRecordSource(files, sample_shape=(D, H, W, C))``; a record whose
``x`` holds another number of bytes (or whose ``y`` another number of targets) raises
``ValueError`` on every rank that reads it.  Given a directory without a shape,
:class:`~disttensor.io.SampleDataset` assumes cubes with 4 channels (the MLPerf layout) and
infers the side from the first record.

Reading
-------
TFRecords cannot be read as hyperslabs: a record is one compressed, protobuf-encoded message.
Every rank that reads a sample therefore decompresses and decodes the whole record and keeps
its block (the ranks of a spatially partitioned sample each decode it; the data-parallel
ranks read different samples).  Record offsets (in the uncompressed stream) are indexed once
at construction (rank 0 reads every file through); ``records_per_file=k`` skips that scan and
trusts ``k`` records per file.  Reading record ``r`` of a gzipped file decompresses the file
up to it (gzip has no random access): keep few records per file.  No MPI-IO; failures are made collective over the ranks that
read the same sample.  CRCs are not verified.

:func:`write_tfrecord` writes records of this layout with the package's serializer.
"""
from __future__ import annotations

import gzip
import math
import os
import struct

import numpy as np

from ..core.comm import collective
from ._atomic import replace_atomically
from ._temps import remove_quietly, temp_path_for
from .sources import OPENERS, SampleSource, SourceReader

__all__ = ["TFRecordSource", "write_tfrecord", "read_records", "tfrecord_available",
           "TFRECORD_EXTENSIONS"]

TFRECORD_EXTENSIONS = (".tfrecord", ".tfrecords", ".tfrecord.gz")


def _tf():
    try:
        from tfrecord import example_pb2
        from tfrecord.writer import TFRecordWriter
    except ImportError:
        raise ImportError("TFRecord samples need the 'tfrecord' package: pip install "
                          "'disttensor[tfrecord]'") from None
    return example_pb2, TFRecordWriter


def tfrecord_available() -> bool:
    try:
        _tf()
    except ImportError:
        return False
    return True


def _open(path, compression):
    if compression == "auto":
        with open(path, "rb") as f:
            compression = "gzip" if f.read(2) == b"\x1f\x8b" else None
    if compression == "gzip":
        return gzip.open(path, "rb")
    if compression is None:
        return open(path, "rb")
    raise ValueError(f"compression must be 'gzip' or None, got {compression!r}")


def _index(path, compression) -> list[tuple[int, int]]:
    """``(offset, length)`` of every record's payload in the uncompressed stream."""
    out = []
    with _open(path, compression) as f:
        pos = 0
        while True:
            head = f.read(12)
            if not head:
                return out
            if len(head) < 12:
                raise ValueError(f"{path!r}: truncated TFRecord header at byte {pos}")
            (n,) = struct.unpack("<Q", head[:8])
            out.append((pos + 12, n))
            pos += 12 + n + 4
            f.seek(pos)


def read_records(path, compression="auto"):
    """Every record's payload (``bytes``) of the TFRecord file ``path``, in order (serial)."""
    with _open(path, compression) as f:
        return [_payload(f, off, n, path) for off, n in _index(path, compression)]


def _payload(f, offset, n, path):
    f.seek(offset)
    b = f.read(n)
    if len(b) != n:
        raise ValueError(f"{path!r}: truncated TFRecord record at byte {offset}")
    return b


def decode_example(payload: bytes, x_feature="x", y_feature="y"):
    """``(x bytes, y float array)`` of one serialized ``tf.train.Example``."""
    example_pb2, _ = _tf()
    ex = example_pb2.Example.FromString(payload)
    feats = ex.features.feature
    if x_feature not in feats or y_feature not in feats:
        raise ValueError(f"TFRecord example lacks feature {x_feature!r} or {y_feature!r} "
                         f"(has {sorted(feats)})")
    xv = feats[x_feature].bytes_list.value
    if len(xv) != 1:
        raise ValueError(f"feature {x_feature!r} must hold one bytes value, has {len(xv)}")
    return xv[0], np.asarray(feats[y_feature].float_list.value, dtype=np.float32)


def write_tfrecord(path, samples, compression="gzip", x_feature="x", y_feature="y") -> str:
    """Write ``samples`` (an iterable of ``(x, y)``: ``x`` any array, stored as its raw C-order
    bytes; ``y`` float targets) as the TFRecord file ``path`` (serial, atomically)."""
    _, writer = _tf()
    tmp = temp_path_for(path)
    try:
        with (gzip.open(tmp, "wb") if compression == "gzip" else open(tmp, "wb")) as f:
            for x, y in samples:
                rec = writer.serialize_tf_example({
                    x_feature: (np.ascontiguousarray(x).tobytes(), "byte"),
                    y_feature: (np.asarray(y, dtype=np.float32).reshape(-1).tolist(),
                                "float")})
                head = struct.pack("<Q", len(rec))
                f.write(head + writer.masked_crc(head) + rec + writer.masked_crc(rec))
        replace_atomically(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise
    return path


def _tfrecord_files(source) -> list[str]:
    if isinstance(source, (list, tuple)):
        return [os.path.abspath(os.fspath(s)) for s in source]
    p = os.fspath(source)
    if os.path.isdir(p):
        return sorted(os.path.join(os.path.abspath(p), f) for f in os.listdir(p)
                      if f.endswith(TFRECORD_EXTENSIONS) and not f.startswith("."))
    return [os.path.abspath(p)]


class TFRecordSource(SampleSource):
    """TFRecord files of the MLPerf layout (see the module docstring).

    ``source``: a directory of ``*.tfrecord`` files, one file or a list.  ``sample_shape``:
    the stored shape of ``x`` (``D,H,W,C`` unless ``stored_axes`` says otherwise; ``None``:
    an ``s,s,s,4`` cube inferred from the first record).  ``dtype``: the stored dtype of ``x``
    (``int16``).  ``compression``: ``'auto'`` (default: gzip when the file starts with gzip's
    magic bytes), ``'gzip'`` or ``None``.  ``records_per_file``:
    trust this many records per file instead of indexing the files."""

    format = "tfrecord"

    def __init__(self, source, sample_shape=None, dtype="int16", *, compression="auto",
                 stored_axes: str = "DHWC", x_feature: str = "x", y_feature: str = "y",
                 records_per_file: int | None = None):
        _tf()
        self.files = _tfrecord_files(source)
        if not self.files:
            raise FileNotFoundError(f"no TFRecord files ({', '.join(TFRECORD_EXTENSIONS)}) "
                                    f"in {os.fspath(source)!r}")
        self.compression = compression
        self.x_feature, self.y_feature = x_feature, y_feature
        self.dtype = np.dtype(dtype).newbyteorder("=")
        self.stored_axes = stored_axes
        self.stacked = False
        if records_per_file is None:
            self.records = [(f, off, n) for f in self.files
                            for off, n in _index(f, compression)]
        else:
            k = int(records_per_file)
            self.records = [(f, None, r) for f in self.files for r in range(k)]
        if not self.records:
            raise ValueError(f"the TFRecord files {self.files[:3]}... hold no record")
        self.num_samples = len(self.records)
        xb, y = decode_example(_record(self.records[0], compression), x_feature, y_feature)
        item = self.dtype.itemsize
        if sample_shape is None:
            side = round((len(xb) / (4 * item)) ** (1 / 3))
            if side ** 3 * 4 * item != len(xb):
                raise ValueError(f"{self.files[0]!r}: the first record's {x_feature!r} holds "
                                 f"{len(xb)} bytes, not a cube of 4 channels of {self.dtype}; "
                                 "pass sample_shape= (TFRecordSource)")
            sample_shape = tuple(side if a != "C" else 4 for a in stored_axes)
        self.stored_shape = tuple(int(n) for n in sample_shape)
        self.target_kind, self.target_shape = "vector", (len(y),)
        self.target_dtype = np.dtype(np.float32)
        self.check()
        _check_record(self, xb, y, self.records[0])

    def __repr__(self) -> str:
        return (f"TFRecordSource({len(self.files)} file(s) {self.files[0]!r}.., "
                f"sample_shape={self.stored_shape}, dtype={self.dtype.str}, "
                f"compression={self.compression!r}, samples={self.num_samples})")

    def open(self, comm, driver=None, collective_io=True) -> SourceReader:
        return _TFRecordReader(self, comm)


def _record(rec, compression) -> bytes:
    path, off, n = rec
    if off is None:  # records_per_file: the n-th record of the file
        with _open(path, compression) as f:
            pos = 0
            for _ in range(n + 1):
                f.seek(pos)
                head = f.read(12)
                if len(head) < 12:
                    raise ValueError(f"{path!r} holds fewer than {n + 1} records")
                (ln,) = struct.unpack("<Q", head[:8])
                off, pos = pos + 12, pos + 16 + ln
        n = ln
    with _open(path, compression) as f:
        return _payload(f, off, n, path)


def _check_record(src: TFRecordSource, xb: bytes, y: np.ndarray, rec) -> None:
    want = math.prod(src.stored_shape) * src.dtype.itemsize
    if len(xb) != want:
        raise ValueError(f"TFRecord {rec[0]!r}: feature {src.x_feature!r} holds {len(xb)} bytes, "
                         f"but a {src.dtype} sample of shape {src.stored_shape} has {want}")
    if y.shape != tuple(src.target_shape):
        raise ValueError(f"TFRecord {rec[0]!r}: {src.y_feature!r} holds {y.size} targets, the "
                         f"first record {src.target_shape[0]}")


class _TFRecordReader(SourceReader):
    def __init__(self, src: TFRecordSource, comm):
        self.src, self.comm = src, comm

    def read(self, sample, start, xout, ystart, yout):
        s = self.src
        with collective(self.comm):
            rec = s.records[int(sample)]
            xb, y = decode_example(_record(rec, s.compression), s.x_feature, s.y_feature)
            _check_record(s, xb, y, rec)
            whole = np.frombuffer(xb, dtype=s.dtype.newbyteorder("<")).reshape(s.stored_shape)
            key = tuple(slice(a, a + n) for a, n in zip(start, xout.shape))
            xout[...] = whole[key]
            yout[...] = y.reshape(yout.shape)


def open_tfrecords(source, **_) -> SampleSource | None:
    """Opener: a TFRecord file, a list of them, or a directory holding ``*.tfrecord`` files."""
    if isinstance(source, (list, tuple)) and source and all(
            isinstance(s, (str, os.PathLike)) and os.fspath(s).endswith(TFRECORD_EXTENSIONS)
            for s in source):
        return TFRecordSource(source)
    if not isinstance(source, (str, os.PathLike)):
        return None
    p = os.fspath(source)
    if p.endswith(TFRECORD_EXTENSIONS) and os.path.isfile(p):
        return TFRecordSource(p)
    if os.path.isdir(p) and any(f.endswith(TFRECORD_EXTENSIONS) and not f.startswith(".")
                                for f in os.listdir(p)):
        return TFRecordSource(p)
    return None


OPENERS.insert(-1, open_tfrecords)
