"""Argument checks shared by the layers (plain Python, no framework)."""
from __future__ import annotations

__all__ = ['is_int']


def is_int(value: object, minimum: int) -> bool:
    """Whether ``value`` is an int (not a bool) of at least ``minimum``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum
