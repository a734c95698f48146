"""The NumPy-style front: routines on DistArrays, filed by the sections of NumPy's manual.

The public names are re-exported by :mod:`disttensor` (``dt.zeros``, ``dt.concatenate``,
``dt.sort``, ...); these modules are where they are implemented:

* :mod:`.creation` -- array creation: ``zeros``/``ones``/``empty``/``full`` (and ``*_like``),
  ``eye``, ``arange``, ``linspace``, ``meshgrid``, ``from_global``, ``tril``, ``triu``;
* :mod:`.manipulation` -- array manipulation (a package: transpose-like, shape, dims, join,
  tiling, rearrange); :mod:`.padding` -- ``pad``;
* :mod:`.indexing` -- ``x[key]``, ``x[key] = v``, boolean masks, ``take``,
  ``take_along_axis``; :mod:`.fancy_indexing` -- index arrays and partial masks (gather and
  scatter), ``ufunc.at``, ``put`` (:mod:`.fancy_keys`: the pure key planning);
  :mod:`.ufunc_methods` -- ``reduce``, ``accumulate``, ``outer``, ``at``, ``reduceat`` of every
  ufunc;
* :mod:`.blocks` -- ``map_blocks``, ``apply_along_axis``; :mod:`.stencils` --
  ``map_overlap`` (halo'd blocks, Dask's boundary names);
* :mod:`.ufuncs` -- elementwise ufuncs and the alignment rule of mixed operands;
  :mod:`.mathematical` -- ``clip``, ``round``, ``diff``; :mod:`.scans` -- ``cumsum``,
  ``cumprod``, ``cumulative_sum``, ``cumulative_prod``; :mod:`.calculus` -- ``gradient``,
  ``trapezoid``, ``interp``, ``convolve``, ``nan_to_num``;
* :mod:`.reductions` -- ``sum``, ``prod``, ``mean``, ``var``, ``std``, ``min``, ``max``,
  ``any``, ``all`` (``where=``, ``initial=``) and their nan forms;
* :mod:`.logic` -- ``isclose``, ``allclose``, ``array_equal``;
* :mod:`.sorting` -- ``sort``, ``argsort`` (sample sort); :mod:`.searching` -- ``argmin``,
  ``argmax`` (and nan forms), ``nonzero``, ``argwhere``, ``where`` (one argument:
  ``nonzero``), ``searchsorted``,
  ``count_nonzero``;
* :mod:`.statistics` -- ``quantile``, ``percentile``, ``median`` (and nan forms; the order
  statistics in :mod:`.order_statistics`);
  :mod:`.averages` -- ``average``, ``cov``, ``corrcoef``, ``ptp``; :mod:`.histograms` --
  ``histogram``, ``histogram2d``, ``histogramdd``, ``histogram_bin_edges``, ``bincount``,
  ``digitize``;
* :mod:`.sets` -- ``unique`` and the array API's ``unique_*``, ``isin``;
* :mod:`.npyio` -- parallel ``.npy`` files (``dt.npyio.save`` / ``load``);
* :mod:`.array_function` -- the ``__array_function__`` table (``np.pad(x, 1)`` on a
  DistArray runs :func:`.padding.pad`).

``_operands`` holds the argument checks and layout helpers they share.  Every routine is
collective over the grid of its DistArray operands.
"""
