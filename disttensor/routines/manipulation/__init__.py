"""Array manipulation routines (NumPy's "Array manipulation routines"), one module per section
of NumPy's manual:

* :mod:`.transpose` -- transpose-like operations: ``transpose``, ``moveaxis``, ``swapaxes``;
* :mod:`.shape` -- changing array shape: ``reshape``, ``ravel``;
* :mod:`.dims` -- changing number of dimensions: ``expand_dims``, ``squeeze``,
  ``broadcast_to``, ``broadcast_arrays``, ``atleast_1d``, ``atleast_2d``, ``atleast_3d``;
* :mod:`.join` -- joining arrays: ``concatenate``, ``stack``, ``unstack``, ``vstack``,
  ``hstack``, ``dstack``, ``column_stack``;
* :mod:`.splitting` -- splitting arrays: ``split``, ``array_split``, ``hsplit``, ``vsplit``,
  ``dsplit`` (lists of DistArrays);
* :mod:`.tiling` -- tiling arrays: ``tile``, ``repeat``;
* :mod:`.rearrange` -- rearranging elements: ``flip``, ``roll``, ``rot90``.

``pad`` is in :mod:`disttensor.routines.padding`.  ``where`` (a searching routine,
:mod:`disttensor.routines.searching`) is re-exported here for the modules that import it
with the manipulation routines.  Every function is collective over the grid of its operands;
each module's docstring gives the output distributions and what moves.
"""
from ..searching import where
from .dims import (atleast_1d, atleast_2d, atleast_3d, broadcast_arrays, broadcast_to,
                   expand_dims, squeeze)
from .join import column_stack, concatenate, dstack, hstack, stack, unstack, vstack
from .rearrange import flip, roll, rot90
from .shape import ravel, reshape, reshape_groups
from .splitting import array_split, dsplit, hsplit, split, vsplit
from .tiling import repeat, tile
from .transpose import moveaxis, swapaxes, transpose

__all__ = ["transpose", "moveaxis", "swapaxes", "reshape", "reshape_groups", "ravel",
           "expand_dims", "squeeze", "broadcast_to", "broadcast_arrays", "atleast_1d",
           "atleast_2d", "atleast_3d", "concatenate", "stack", "unstack", "vstack", "hstack",
           "dstack", "column_stack", "split", "array_split", "hsplit", "vsplit", "dsplit",
           "tile", "repeat", "flip", "roll", "rot90", "where"]
