"""``__array_namespace_info__()`` of the array API namespace: capabilities, devices and
dtypes."""
from __future__ import annotations

from ._dtypes import ALL_DTYPES, default_dtypes, isdtype

__all__ = ["__array_namespace_info__", "Info"]

_DEVICES = ("cpu", "cuda")


class Info:
    """Inspection object of the standard (one per call; holds nothing)."""

    __module__ = "disttensor.array_api"

    def capabilities(self) -> dict:
        """Boolean-mask indexing (``x[mask]``, ``x[mask] = v`` with a full-shape mask,
        :mod:`disttensor.routines.indexing`) and data-dependent output shapes (``nonzero``,
        ``unique_*``: results with an explicit uneven distribution) are supported; arrays may
        have any number of dimensions NumPy allows."""
        return {"boolean indexing": True, "data-dependent shapes": True,
                "max dimensions": 64}

    def default_device(self) -> str:
        return "cpu"

    def devices(self) -> list:
        return list(_DEVICES)

    def _check(self, device) -> None:
        if device is not None and device not in _DEVICES:
            raise ValueError(f"unknown device {device!r}; devices are {_DEVICES}")

    def default_dtypes(self, *, device=None) -> dict:
        self._check(device)
        return default_dtypes()

    def dtypes(self, *, device=None, kind=None) -> dict:
        """The dtypes of ``kind`` (a kind name, a dtype or a tuple of them; ``None``: all)."""
        self._check(device)
        if kind is None:
            return dict(ALL_DTYPES)
        return {n: d for n, d in ALL_DTYPES.items() if isdtype(d, kind)}


def __array_namespace_info__() -> Info:
    return Info()
