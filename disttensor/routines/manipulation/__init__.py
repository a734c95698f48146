"""Array manipulation routines (NumPy's "Array manipulation routines")."""
from .shape import (concatenate, moveaxis, reshape, reshape_groups, swapaxes,  # noqa: F401
                    transpose, where)
