"""Argument checks shared by the Krul policies: one ``InvalidArgument`` line naming the field."""

from __future__ import annotations

import math
import numbers

import torch

from kvstore.contract import InvalidArgument


def check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]`` (no upper bound when ``maximum`` is None); bools are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgument(name, f"must be an int, got {value!r}")
    if value < minimum and maximum is None:
        raise InvalidArgument(name, f"must be >= {minimum}, got {value}")
    if value < minimum or (maximum is not None and value > maximum):
        raise InvalidArgument(name, f"{value} out of range [{minimum}, {maximum}]")
    return int(value)


def check_real(name: str, value: object, low: float, high: float, *, open_low: bool = False) -> float:
    """``value`` as a ``float`` in ``[low, high]`` (``(low, high]`` with ``open_low``); NaN is refused, ``inf`` only as a bound."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgument(name, f"must be a number, got {value!r}")
    value = float(value)
    if math.isnan(value) or value < low or value > high or (open_low and value == low):
        left = "(" if open_low else "["
        raise InvalidArgument(name, f"{value!r} out of range {left}{low}, {high}]")
    return value


def check_tensor(name: str, value: object, dims: int, *, finite: bool = True) -> torch.Tensor:
    """A floating-point tensor of ``dims`` dimensions, finite unless ``finite=False`` (the caller checks what it derives)."""
    if not isinstance(value, torch.Tensor):
        raise InvalidArgument(name, f"must be a torch.Tensor, got {type(value).__name__}")
    if value.dim() != dims:
        raise InvalidArgument(name, f"expected {dims} dimensions, got shape {tuple(value.shape)}")
    if not value.is_floating_point():
        raise InvalidArgument(name, f"must be floating point, got {value.dtype}")
    if finite and not torch.isfinite(value).all():
        raise InvalidArgument(name, "contains NaN or infinity")
    return value
