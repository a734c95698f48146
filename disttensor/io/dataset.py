"""Training samples read spatially partitioned: no rank ever holds a whole sample.

Layouts
-------
* **CosmoFlow layout**: one HDF5 file per sample holding a ``C,D,H,W`` dataset (default name
  ``"full"``) and a small target vector ``(k,)`` (default ``"unitPar"``), as in the CosmoFlow
  data of MLPerf HPC.  With ``channels_last=True`` the sample dataset is ``D,H,W,C`` (the
  layout of the original CosmoFlow files) and each rank transposes its own block.
* **Stacked layout**: one file with an ``N,C,D,H,W`` dataset (``N,D,H,W,C`` with
  ``channels_last``) and ``N,k`` targets.

Targets
-------
The target dataset (``y_dataset``) is either a **vector** per sample (``(k,)`` per file, a
scalar counting as ``k = 1``; ``(N,k)`` stacked) or a per-voxel **label volume** with the
sample's spatial shape (``(D,H,W)`` per file, ``(N,D,H,W)`` stacked, also with
``channels_last``), e.g. the ``"labels"`` of ``python -m disttensor.io.synthetic --task
segmentation``.  The kind is decided from the first file (``target_kind`` is ``'vector'`` or
``'volume'``; ``target_shape`` is ``(k,)`` or ``(D,H,W)``); a target of any other rank, or a
label volume whose shape differs from the sample's spatial shape, raises ``ValueError`` on
every rank.

Sources
-------
The per-format reading lives in :mod:`disttensor.io.sources` (HDF5 here; other formats add
source classes there): the dataset asks its ``source`` for the stored shape, axis order and
dtype of a sample and the targets' kind, and for hyperslabs of samples.

Transforms, crops and augmentation
----------------------------------
Applied while each rank reads its block, with no communication except where noted (see
:mod:`disttensor.io.transforms` and :mod:`disttensor.io.augment`, and ``docs/data.md``):

* ``dtype`` converts the samples (int16 counts to ``float32``/``float16``), ``log1p`` takes
  ``log(1 + x)``, ``divide_by_mean`` divides each sample by its mean (one small all-reduce per
  batch over the ranks sharing the samples), ``(x - x_shift) / x_scale`` then,
  ``target_shift``/``target_scale`` normalize
  vector targets; a dtype a step cannot take raises ``TypeError`` on every rank at
  construction.
* ``crop=(d, h, w)`` hands out windows of that size (``sample_shape`` is then ``(C, d, h,
  w)``, label volumes cropped identically), at random offsets (``random_crop=True``) or
  centred; each rank reads only its block of the window as a hyperslab.  A crop larger than the
  samples raises ``ValueError`` on every rank.
* ``augment=True`` (``'flip'``, ``'permute'``): random flips per spatial axis and random
  permutations of the spatial axes (MLPerf HPC CosmoFlow's), read as the mirrored/permuted
  hyperslab of the rank's block and flipped/transposed locally: no messages.
* The view of sample ``s`` in epoch ``e`` (crop offsets, flips, permutation) is drawn from
  ``numpy.random.default_rng([seed, e, s, STREAM])`` (:func:`disttensor.io.augment.draw_view`):
  the same on every rank and on any grid; :meth:`SampleDataset.view` returns it.

Batches
-------
``split = (sample_axis, c_axis, d_axis, h_axis, w_axis)`` names the grid axis of each batch
axis, as everywhere in disttensor.  The samples of a batch are dealt in balanced consecutive
pieces over grid axis ``split[0]`` (``None``: every rank sees every sample of the batch), and
each sample is read spatially partitioned over the other named grid axes: the rank reads from
the file exactly the hyperslab of its block.  ``x`` is an ``N,C,D,H,W`` DistArray with that
split.  Vector targets: ``y`` is an ``N,k`` DistArray split ``(split[0], None)`` (the targets
of the rank's samples, replicated over the other grid axes).  Label volumes: ``y`` is an
``N,D,H,W`` DistArray split ``(split[0], split[2], split[3], split[4])`` with ``x``'s block
sizes (``x``'s distribution without the channel axis, the layout
:func:`disttensor.ops.cross_entropy_forward` expects): each rank reads exactly the hyperslab of
its spatial block, at the same offsets as its block of ``x``, replicated over the channel
axis's grid axis if any.  ``y`` keeps the file's dtype (``uint8`` for the synthetic labels).

Epoch ``e`` visits the samples in the order :func:`disttensor.io.layout.epoch_order`
``(n, seed, e, shuffle)`` (a permutation drawn from ``numpy.random.default_rng([seed, e])``,
the same on every rank), cut into consecutive batches of ``batch_size`` (the last one shorter
unless ``drop_last``).

Background reads and MPI threads
--------------------------------
With ``prefetch=True`` batch ``b + 1`` is read by a background thread (one per dataset) while
batch ``b`` is used.  MPI from that thread:

* If h5py has the ``mpio`` driver and MPI runs at ``MPI_THREAD_MULTIPLE`` (mpi4py's default
  request; checked with ``MPI.Query_thread()``), the thread does collective MPI-IO reads over a
  private duplicate of the communicator of the ranks that read the same samples, so its
  collectives never meet the main thread's.
* Otherwise the thread makes no MPI call at all: every rank opens the files with HDF5's POSIX
  driver and reads its hyperslab independently (``driver='independent'``, also selectable
  explicitly).  Asking for ``driver='mpio'`` with ``prefetch=True`` below
  ``MPI_THREAD_MULTIPLE`` is an error.

Either way, failures are agreed on in the main thread when a batch is handed out (one small
all-reduce per batch), so an unreadable sample raises the same exception on every rank.

h5py holds the GIL during a read, so the overlap is with code that releases the GIL (NumPy,
Numba, CuPy kernels, MPI waits).  The main thread's own collective HDF5 calls of
:mod:`disttensor.io` first wait for any background read in flight (no two collective HDF5
operations of one rank can then wait on each other across ranks).

Agreement
---------
Construction, :meth:`SampleDataset.epoch` and :meth:`SampleDataset.read_batch` compare their
arguments across the ranks before any file is read (:mod:`disttensor.core.agreement`, folded into
the failure all-reduce they make anyway): the source (directory, file or the whole file list),
split, batch size, shuffling, seed, dataset names, driver and device at construction; the
dataset (its files, batch size, seed, ...) and the epoch, or the sample indices, per call.  A
file list, batch size, seed or epoch that differs between ranks raises
:class:`~disttensor.core.agreement.ArgumentMismatchError` on every rank (never a hang, never
batches made of different samples on different ranks).  The files of a directory are listed by
rank 0 only and broadcast, and dot-files (the temporary files of interrupted writes) are
skipped.
"""
from __future__ import annotations

import hashlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterator, Sequence

import numpy as np
from mpi4py import MPI

from ..core.array import DistArray
from ..core.backend import xp_for
from ..core.comm import collective
from ..core.distribution import Distribution
from ..core.grid import ProcessGrid, get_default_grid
from ._args import arg_dtype, arg_paths, usable_device
from ._h5file import (BACKGROUND, drain_background_reads, h5py_has_mpi, resolve_driver,
                      root_call)
from .augment import View, check_crop, draw_view, identity_view, orient, read_box
from .layout import batch_indices, check_dataset_name
from .sources import SampleSource, list_sample_files, open_source
from .transforms import (Transforms, affine_x, block_sums, divide_by_means, fill_block,
                         normalize_targets, resolve_transforms)

__all__ = ["SampleDataset", "list_sample_files", "drain_background_reads"]

def _source_args(source) -> dict:
    """The ``source`` argument as it is agreed: a path, or a list of paths (``str`` and
    ``os.PathLike`` alike).  A short list is agreed item by item (``source[i]``), so that a
    mismatch names the differing file even when long paths fill the message (longer lists
    are named item by item by the agreement itself)."""
    src = arg_paths(source)
    if isinstance(src, list) and 0 < len(src) <= 8:
        return {"len(source)": len(src), **{f"source[{i}]": p for i, p in enumerate(src)}}
    return {"source": src}


#: Values of ``augment``: none, flips and permutations, flips only, permutations only.
AUGMENT = (False, True, "flip", "permute")


def _value_list(v):
    """A small numeric argument (crop, shift, scale) as it is agreed: by value."""
    if v is None or isinstance(v, (str, bytes)):
        return v
    try:
        return tuple(float(t) for t in np.asarray(v, dtype=np.float64).reshape(-1))
    except Exception:  # noqa: BLE001 - validation reports it
        return v


def _index_list(indices):
    """Sample indices as they are agreed: by value (a tuple of ints; an array argument would be
    compared by shape and dtype only).  Anything that is not a sequence of integers as it is
    (validation reports it)."""
    try:
        a = np.asarray(indices)
        if a.dtype.kind in "iu" or a.size == 0:
            return tuple(int(i) for i in a.reshape(-1))
    except Exception:  # noqa: BLE001
        pass
    return indices


class SampleDataset:
    """Batches of samples read spatially partitioned (see the module docstring).

    Parameters
    ----------
    source : a directory (all ``*.h5``/``*.hdf5``/``*.hdf`` files in it, sorted: one sample
        each), a list of per-sample files, or one file (stacked layout if its sample dataset is
        5-d, else a single sample).  Every rank must pass the same.
    grid : the process grid (default grid).
    split : ``(sample_axis, c_axis, d_axis, h_axis, w_axis)`` grid axes (``None``: not split);
        default ``(0, None, 1, 2, 3)`` restricted to the grid's axes.
    batch_size, shuffle, seed, drop_last : batching (see module docstring).
    prefetch : read the next batch in a background thread.
    x_dataset, y_dataset : dataset names (defaults ``"full"``, ``"unitPar"``, CosmoFlow's;
        ``y_dataset="labels"`` for the label volumes of the synthetic segmentation data).
        ``y_dataset`` holds target vectors or per-voxel label volumes (see the module
        docstring).
    channels_last : samples stored ``D,H,W,C`` in the files.
    driver : ``'mpio'``, ``'independent'`` or ``None`` (``'mpio'`` when h5py has it and either
        ``prefetch`` is off or MPI runs at ``MPI_THREAD_MULTIPLE``).
    collective_io : with ``mpio``, collective (default) or independent transfers (see
        :func:`~disttensor.io.read_hdf5`).
    device : where the batches' blocks live (``'cpu'`` or ``'cuda'``).
    dtype, log1p, divide_by_mean, x_shift, x_scale, target_shift, target_scale : read-time
        transforms (module docstring; ``dtype=None`` keeps the stored dtype).
    crop, random_crop : windows of ``crop`` (3 ints ``D,H,W`` or one int) at random offsets
        per ``(seed, epoch, sample)``, or centred with ``random_crop=False``.
    augment : ``False``, ``True`` (flips and axis permutations), ``'flip'`` or ``'permute'``.

    Construction is collective over ``grid``: it lists the files and checks the first one on
    rank 0 (every later file is checked when it is read), and duplicates a communicator for
    the reads.

    Call :meth:`close` (collective) or use ``with`` to release the thread and the
    communicator.

    Attributes: ``num_samples``, ``sample_shape`` ``(C,D,H,W)`` as handed out (cropped),
    ``dtype`` as handed out, ``stored_dtype``, ``source``, ``transforms``, ``crop``,
    ``target_kind``
    (``'vector'`` or ``'volume'``), ``target_shape`` (``(k,)`` or ``(D,H,W)``),
    ``num_targets`` (``k``; ``None`` for label volumes), ``target_dtype``, ``stacked``.
    """

    def __init__(self, source, grid: ProcessGrid | None = None, split=None, batch_size: int = 1,
                 shuffle: bool = True, seed: int = 0, prefetch: bool = True, *,
                 drop_last: bool = False, x_dataset: str = "full", y_dataset: str = "unitPar",
                 channels_last: bool = False, driver: str | None = None,
                 collective_io: bool = True, device: str = "cpu", dtype=None,
                 log1p: bool = False, divide_by_mean: bool = False, target_shift=None,
                 target_scale=None, crop=None, random_crop: bool = True, augment=False,
                 x_shift=None, x_scale=None):
        grid = get_default_grid() if grid is None else grid
        comm = getattr(grid, "cart", None)
        # the driver chosen for driver=None depends on the thread level and h5py's build too
        with collective(comm, "SampleDataset", **_source_args(source), grid=grid,
                        split=split, batch_size=batch_size, shuffle=shuffle, seed=seed,
                        prefetch=prefetch, drop_last=drop_last, x_dataset=x_dataset,
                        y_dataset=y_dataset, channels_last=channels_last, driver=driver,
                        collective_io=collective_io, device=device, dtype=arg_dtype(dtype),
                        log1p=log1p, divide_by_mean=divide_by_mean,
                        target_shift=_value_list(target_shift),
                        target_scale=_value_list(target_scale), crop=_value_list(crop),
                        random_crop=random_crop, augment=augment,
                        x_shift=_value_list(x_shift), x_scale=_value_list(x_scale),
                        thread_multiple=MPI.Query_thread() >= MPI.THREAD_MULTIPLE,
                        h5py_mpi=h5py_has_mpi()):
            if not isinstance(grid, ProcessGrid):
                raise TypeError(f"grid must be a ProcessGrid, got {type(grid).__name__}")
            if split is None:
                split = tuple(g if g is None or g < grid.ndim else None
                              for g in (0, None, 1, 2, 3))
            split = tuple(split)
            if len(split) > 5:
                raise ValueError(f"split {split} has more than 5 entries (N, C, D, H, W)")
            split = split + (None,) * (5 - len(split))
            Distribution((0,) * 5, grid.dims, split)  # validates split against the grid
            if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
                raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
            if not isinstance(seed, (int, np.integer)) or seed < 0:
                raise ValueError(f"seed must be a non-negative int, got {seed!r}")
            if augment not in AUGMENT:
                raise ValueError(f"augment must be one of {AUGMENT}, got {augment!r}")
            self.x_dataset = check_dataset_name(x_dataset)
            self.y_dataset = check_dataset_name(y_dataset)
            self.device = usable_device(device)
            resolved = resolve_driver(driver)
            self.thread_level = MPI.Query_thread()
            if prefetch and resolved == "mpio" and self.thread_level < MPI.THREAD_MULTIPLE:
                if driver == "mpio":
                    raise ValueError("driver='mpio' with prefetch=True needs MPI initialized "
                                     "with MPI_THREAD_MULTIPLE (collective reads from the "
                                     "background thread); use driver='independent' or "
                                     "prefetch=False")
                resolved = "independent"
        self.grid = grid
        self.split = split
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.prefetch = bool(prefetch)
        self.drop_last = bool(drop_last)
        self.channels_last = bool(channels_last)
        self.driver = resolved
        self.collective_io = bool(collective_io)
        src: SampleSource = root_call(comm, lambda: open_source(
            source, x_dataset=self.x_dataset, y_dataset=self.y_dataset,
            channels_last=self.channels_last))
        self.source = src
        self.files: list[str] = list(src.files)
        self.stacked: bool = bool(src.stacked)
        self.num_samples: int = int(src.num_samples)
        self.sample_shape: tuple[int, ...] = tuple(src.sample_shape)
        self.target_kind: str = src.target_kind
        self.target_shape: tuple[int, ...] = tuple(src.target_shape)
        self.num_targets: int | None = src.num_targets
        self.dtype: np.dtype = np.dtype(src.dtype)
        self.target_dtype: np.dtype = np.dtype(src.target_dtype)
        self.stored_dtype: np.dtype = np.dtype(src.dtype)
        with collective(comm):  # replicated metadata: the same error on every rank
            self.transforms: Transforms = resolve_transforms(
                src.dtype, src.target_kind, src.target_dtype, src.num_targets, dtype, log1p,
                divide_by_mean, target_shift, target_scale, x_shift, x_scale)
            self.flip = augment in (True, "flip")
            self.permute = augment in (True, "permute")
            self.crop = check_crop(src.spatial_shape, crop, self.permute)
        self.random_crop = bool(random_crop)
        self.augment = augment
        self.dtype = self.transforms.dtype
        self.target_dtype = np.dtype(self.transforms.target_dtype)
        self._views = crop is not None or bool(augment)
        self.sample_shape = (self.sample_shape[0],) + tuple(self.crop)
        if self.target_kind == "volume":
            self.target_shape = tuple(self.crop)
        # what identifies this dataset in the agreement of its per-epoch and per-batch calls
        # (the file list is rank 0's on every rank; a digest keeps a long list cheap)
        listing = hashlib.blake2b("\0".join(self.files).encode(), digest_size=8).hexdigest()
        first = self.files[0] if self.files else ""
        self._ident = {
            "dataset": f"{len(self.files)} file(s) {first!r}.. #{listing}",
            "datasets": (self.x_dataset, self.y_dataset), "num_samples": self.num_samples,
            "batch_size": self.batch_size, "shuffle": self.shuffle, "seed": self.seed,
            "drop_last": self.drop_last, "split": self.split,
            "transforms": (self.transforms, self.crop, self.random_crop, self.augment)}
        # the ranks that read the same samples: all grid axes but the sample axis
        s0 = split[0]
        group = grid.sub_comm([g for g in range(grid.ndim) if g != s0]) if s0 is not None \
            else grid.cart
        self._io_comm = group.Dup() if self.driver == "mpio" else None
        # the main thread's all-reduce of the per-sample sums (divide_by_mean)
        self._mean_comm = group.Dup() if self.transforms.divide_by_mean else None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="disttensor-io") \
            if self.prefetch else None
        self._pending: list[Future] = []
        self._lock = threading.Lock()
        self._closed = False
        if self._io_comm is not None and self._executor is not None:
            BACKGROUND.add(self)

    # -- public -------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Batches per epoch."""
        n, b = self.num_samples, self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def batch_indices(self, epoch: int) -> list[np.ndarray]:
        """The sample indices of every batch of epoch ``epoch``, in order (no I/O)."""
        return batch_indices(self.num_samples, self.batch_size, self.seed, int(epoch),
                             self.shuffle, self.drop_last)

    def batch_distribution(self, batch: int) -> tuple[Distribution, Distribution]:
        """Distributions of ``x`` and ``y`` for a batch of ``batch`` samples (label volumes:
        ``y`` is distributed like ``x`` without its channel axis)."""
        dx = Distribution((batch, *self.sample_shape), self.grid.dims, self.split)
        if self.target_kind == "volume":
            return dx, dx.drop_axes([1])
        dy = Distribution((batch, self.num_targets), self.grid.dims, (self.split[0], None),
                          [dx.sizes(0) if self.split[0] is not None else None, None])
        return dx, dy

    def read_batch(self, indices: Sequence[int], epoch: int = 0) -> tuple[DistArray, DistArray]:
        """Read the samples ``indices`` (in that order) as one batch now, with the crops and
        augmentation of epoch ``epoch`` (collective; the indices and the epoch are agreed
        across the ranks)."""
        with collective(self.grid.cart, "SampleDataset.read_batch", **self._ident,
                        indices=_index_list(indices), epoch=epoch):
            self._check_open()
            if not isinstance(epoch, (int, np.integer)) or epoch < 0:
                raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
            idx = np.asarray(indices, dtype=np.int64).reshape(-1)
            if idx.size and (idx.min() < 0 or idx.max() >= self.num_samples):
                raise IndexError(f"sample indices must be in [0, {self.num_samples})")
        drain_background_reads()
        with collective(self.grid.cart):
            blocks = self._read(idx, int(epoch))
        return self._wrap(idx, blocks)

    def epoch(self, e: int) -> Iterator[tuple[DistArray, DistArray]]:
        """Iterate over the batches ``(x, y)`` of epoch ``e`` (collective: every rank must
        consume the same number of batches).  Leaving the loop early waits for the batch being
        read in the background.  The epoch is agreed across the ranks when the iteration
        starts."""
        with collective(self.grid.cart, "SampleDataset.epoch", **self._ident, epoch=e):
            self._check_open()
            if not isinstance(e, (int, np.integer)) or e < 0:
                raise ValueError(f"epoch must be a non-negative int, got {e!r}")
        batches = self.batch_indices(e)
        if not batches:
            return
        if not self.prefetch:
            for idx in batches:
                with collective(self.grid.cart):
                    blocks = self._read(idx, int(e))
                yield self._wrap(idx, blocks)
            return
        fut = self._submit(batches[0], int(e))
        try:
            for i, idx in enumerate(batches):
                nxt = self._submit(batches[i + 1], int(e)) if i + 1 < len(batches) else None
                cur, fut = fut, nxt
                with collective(self.grid.cart):
                    blocks = cur.result()
                yield self._wrap(idx, blocks)
        finally:
            self._drain()

    def __iter__(self):
        raise TypeError("iterate over dataset.epoch(e), which fixes the shuffling of epoch e")

    def close(self) -> None:
        """Wait for background reads, stop the thread, free the communicator (collective)."""
        if self._closed:
            return
        self._drain()
        self._closed = True
        BACKGROUND.discard(self)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if self._io_comm is not None:
            self._io_comm.Free()
            self._io_comm = None
        if self._mean_comm is not None:
            self._mean_comm.Free()
            self._mean_comm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        layout = "stacked" if self.stacked else "files"
        return (f"SampleDataset({layout}, samples={self.num_samples}, "
                f"sample_shape={self.sample_shape}, "
                f"targets={self.target_kind} {self.target_shape}, "
                f"batch_size={self.batch_size}, split={self.split}, driver={self.driver!r}, "
                f"prefetch={self.prefetch}"
                f"{f', crop={self.crop}' if self._views else ''}"
                f"{f', augment={self.augment!r}' if self.augment else ''})")

    # -- internals ----------------------------------------------------------------------------
    def _check_open(self):
        if self._closed:
            raise ValueError("the SampleDataset is closed")

    def _submit(self, idx, epoch: int) -> Future:
        fut = self._executor.submit(self._read, idx, epoch)
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()] + [fut]
        return fut

    def _drain(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for f in pending:
            try:
                f.result()
            except BaseException:  # noqa: BLE001 - reported where the batch is consumed
                pass

    def _wrap(self, idx, blocks):
        xl, yl, sums = blocks
        if self._mean_comm is not None:  # one small all-reduce over the ranks of a sample
            part = np.concatenate([sums, np.full(len(sums), xl[0].size if len(xl) else 0.0)])
            if self._mean_comm.size > 1:
                self._mean_comm.Allreduce(MPI.IN_PLACE, part, op=MPI.SUM)
            divide_by_means(xl, part[:len(sums)], part[len(sums):])
            affine_x(xl, self.transforms)
        dx, dy = self.batch_distribution(len(idx))
        if self.device != "cpu":
            xp = xp_for(self.device)
            xl, yl = xp.asarray(xl), xp.asarray(yl)
        return DistArray(xl, dx, self.grid), DistArray(yl, dy, self.grid)

    def view(self, epoch: int, sample: int) -> View:
        """How sample ``sample`` is seen in epoch ``epoch`` (crop window, flips, permutation:
        :func:`disttensor.io.augment.draw_view` of the dataset's seed; pure, no I/O)."""
        spatial = self.source.spatial_shape
        if not self._views:
            return identity_view(spatial)
        return draw_view(self.seed, epoch, sample, spatial, self.crop, self.random_crop,
                         self.flip, self.permute)

    def _read(self, idx: np.ndarray, epoch: int):
        """This rank's blocks of the batch ``idx`` in epoch ``epoch`` and, for
        ``divide_by_mean``, their per-sample partial sums (runs in the background thread: MPI
        only on the private communicator, and only with collective I/O)."""
        dx, _ = self.batch_distribution(len(idx))
        box = dx.block_box(self.grid.coords)
        mine = idx[box.start[0]:box.stop[0]]
        t = self.transforms
        xl = np.empty(box.shape, dtype=self.dtype)
        volume = self.target_kind == "volume"
        src = self.source
        yl = np.empty((len(mine),) + (tuple(box.shape[2:]) if volume else self.target_shape),
                      dtype=src.target_dtype)
        ostart, ostop = box.start[2:], box.stop[2:]
        back = src.to_logical_axes()
        plain = src.stored_axes == "CDHW" and t.dtype == src.dtype and not t.log1p
        with src.open(self._io_comm, self.driver, self.collective_io) as reader:
            for j, s in enumerate(mine):
                v = self.view(epoch, int(s))
                rs, re = read_box(v, ostart, ostop)
                # label volumes: the hyperslab of this rank's spatial block (x's D,H,W box)
                ystart = rs if volume else (0,) * len(self.target_shape)
                yview = volume and not v.is_identity  # labels flipped/permuted locally
                ybuf = np.empty(tuple(b - a for a, b in zip(rs, re)), src.target_dtype) \
                    if yview else yl[j]
                fstart = src.to_stored((box.start[1],) + tuple(rs))
                fcount = src.to_stored((box.shape[1],) + tuple(b - a for a, b in zip(rs, re)))
                if plain and v.is_identity:  # straight into the batch
                    reader.read(int(s), fstart, xl[j], ystart, ybuf)
                    continue
                tmp = np.empty(fcount, dtype=src.dtype)
                reader.read(int(s), fstart, tmp, ystart, ybuf)
                fill_block(xl[j], orient(v, np.transpose(tmp, back), 1), t)
                if yview:
                    yl[j] = orient(v, ybuf, 0)
        sums = block_sums(xl) if t.divide_by_mean else None
        if not t.divide_by_mean:
            affine_x(xl, t)
        return xl, normalize_targets(yl, t), sums
