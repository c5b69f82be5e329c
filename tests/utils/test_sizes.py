"""soft_mm.utils.sizes: the sizes the deployment tools and the benchmarks take on the command line."""
import argparse

import pytest

from soft_mm.utils.sizes import parse_size, size_arg


@pytest.mark.parametrize('text, expected', [('56', (56, 56)), ('200x334', (200, 334)), ('800X1344', (800, 1344))])
def test_parse_size(text, expected):
    assert parse_size(text) == size_arg(text) == expected


@pytest.mark.parametrize('text', ['0x5', '12y5', '3x4x5', '-3', '', 'x'])
def test_bad_sizes(text):
    with pytest.raises(ValueError, match='^' + text + '$'):
        parse_size(text)
    with pytest.raises(argparse.ArgumentTypeError, match='is not a size H or HxW of positive integers'):
        size_arg(text)
