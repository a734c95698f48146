"""Array manipulation routines (NumPy's "Array manipulation routines"), one module per section
of NumPy's manual:

* :mod:`.transpose` -- transpose-like operations: ``transpose``, ``moveaxis``, ``swapaxes``;
* :mod:`.shape` -- changing array shape: ``reshape``;
* :mod:`.dims` -- changing number of dimensions: ``expand_dims``, ``squeeze``,
  ``broadcast_to``, ``broadcast_arrays``;
* :mod:`.join` -- joining and splitting arrays: ``concatenate``, ``stack``, ``unstack``;
* :mod:`.tiling` -- tiling arrays: ``tile``, ``repeat``;
* :mod:`.rearrange` -- rearranging elements: ``flip``, ``roll``.

``pad`` is in :mod:`disttensor.routines.padding`.  ``where`` (a searching routine,
:mod:`disttensor.routines.searching`) is re-exported here for the modules that import it
with the manipulation routines.  Every function is collective over the grid of its operands;
each module's docstring gives the output distributions and what moves.
"""
from ..searching import where
from .dims import broadcast_arrays, broadcast_to, expand_dims, squeeze
from .join import concatenate, stack, unstack
from .rearrange import flip, roll
from .shape import reshape, reshape_groups
from .tiling import repeat, tile
from .transpose import moveaxis, swapaxes, transpose

__all__ = ["transpose", "moveaxis", "swapaxes", "reshape", "reshape_groups", "expand_dims",
           "squeeze", "broadcast_to", "broadcast_arrays", "concatenate", "stack", "unstack",
           "tile", "repeat", "flip", "roll", "where"]
