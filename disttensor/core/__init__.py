"""The foundation every other layer stands on.

Process grids, the pure index math of block distributions and communication plans, the
communication primitives (collective errors, packed point-to-point exchanges), argument
agreement and the collective watchdog, halo exchange, redistribution, the array-module
backend (NumPy or CuPy) and :class:`~disttensor.core.array.DistArray` itself.

Nothing here imports the NumPy-style front (:mod:`disttensor.routines`), ``linalg``,
``fft``, ``ops``, ``autograd``, ``nn`` or ``io`` at module level; the array's methods that
delegate to the front import it inside the method.
"""
