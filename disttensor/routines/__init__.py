"""The NumPy-style front: routines on DistArrays, filed by the sections of NumPy's manual.

The public names are re-exported by :mod:`disttensor` (``dt.zeros``, ``dt.concatenate``,
``dt.sort``, ...); these modules are where they are implemented.
"""
