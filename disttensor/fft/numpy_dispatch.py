"""NumPy dispatch of the FFTs: :data:`HANDLED_FUNCTIONS` maps ``np.fft.fft`` ... ``np.fft.irfftn``,
``np.fft.fftshift`` and ``np.fft.ifftshift`` to the distributed functions (reached through
``DistArray.__array_function__``; collective like them).  Positional arguments are NumPy's;
``out=`` raises ``TypeError``.
"""
from __future__ import annotations

import numpy as np

from .frequencies import fftshift, ifftshift
from .transforms import (fft, fft2, fftn, hfft, ifft, ifft2, ifftn, ihfft, irfft, irfft2, irfftn,
                         rfft, rfft2, rfftn)

__all__ = ["HANDLED_FUNCTIONS"]


def _np(fn):
    """A ``numpy.fft`` replacement: positional arguments as NumPy's; ``out=`` unsupported."""
    def impl(a, *args, out=None, **kwargs):
        if out is not None:
            raise TypeError("out= is not supported for DistArray FFTs")
        return fn(a, *args, **kwargs)
    impl.__name__ = fn.__name__
    return impl


HANDLED_FUNCTIONS = {
    np.fft.fft: _np(fft), np.fft.ifft: _np(ifft),
    np.fft.rfft: _np(rfft), np.fft.irfft: _np(irfft),
    np.fft.hfft: _np(hfft), np.fft.ihfft: _np(ihfft),
    np.fft.fft2: _np(fft2), np.fft.ifft2: _np(ifft2),
    np.fft.rfft2: _np(rfft2), np.fft.irfft2: _np(irfft2),
    np.fft.fftn: _np(fftn), np.fft.ifftn: _np(ifftn),
    np.fft.rfftn: _np(rfftn), np.fft.irfftn: _np(irfftn),
    np.fft.fftshift: fftshift, np.fft.ifftshift: ifftshift,
}
