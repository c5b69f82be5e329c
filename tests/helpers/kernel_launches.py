"""Count the kernels a call would launch on a GPU, on CPU tensors: the launch counter of
``benchmarks/launch_counts.py`` (ATen operators that compute something, those inside ``soft_mm`` custom ops included,
and each Triton launch), as a list of names (``'aten.<op>'``, ``'triton.<kernel>'``) for the op tests."""
from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

from launch_counts import counting_launches


@contextlib.contextmanager
def counted_launches(monkeypatch=None) -> Iterator[list[str]]:
    """Context yielding a list that holds, once the block is done, ``'aten.<op>'`` or ``'triton.<kernel>'`` per
    launch made inside it (``monkeypatch``: accepted for the callers' sake, unused)."""
    names: list[str] = []
    with counting_launches() as launches:
        yield names
    names.extend(launch.name for launch in launches)


def summary(record: list[str]) -> dict[str, int]:
    return dict(Counter(record))
