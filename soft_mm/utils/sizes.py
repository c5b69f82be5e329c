"""Image and token-map sizes on the command line: ``H`` (square) or ``HxW``, as the deployment tools and the
benchmarks take them."""
from __future__ import annotations

import argparse

__all__ = ['parse_size', 'size_arg']


def parse_size(text: str) -> tuple[int, int]:
    """``'56'`` -> (56, 56); ``'200x334'`` -> (200, 334); anything else (or a side < 1) raises ``ValueError(text)``."""
    parts = text.lower().split('x')
    if len(parts) not in (1, 2) or not all(p.isdigit() for p in parts):
        raise ValueError(text)
    h, w = int(parts[0]), int(parts[-1])
    if h < 1 or w < 1:
        raise ValueError(text)
    return h, w


def size_arg(text: str) -> tuple[int, int]:
    """:func:`parse_size` as an argparse ``type``: a bad size is a usage error naming the value."""
    try:
        return parse_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{text!r} is not a size H or HxW of positive integers (e.g. 512x512)') \
            from None
