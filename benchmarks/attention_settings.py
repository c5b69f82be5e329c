"""What an attention setting costs: forward+backward time of SOFT backbones that differ only in their attention
settings, timed in one process with the rounds interleaved (so drift hits every variant alike), as ratios to the first.

    python benchmarks/attention_settings.py                  # the remedies of docs/advanced/attention_health.md
    python benchmarks/attention_settings.py --variants landmark_mode=avg landmark_mode=conv --size 128x128 --batch 8

Each variant is a comma-separated list of ``AttentionSettings`` fields (``landmark_mode=avg,newton_iters=30``) applied
to ``SOFT(arch, soft_norm=True, drop_path_rate=0)`` after ``init_weights()`` with seed 0; training mode, a random
input, the backward of the sum of every output map. Prints the minimum over the rounds after the first (warm-up).
"""
from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from soft_mm.models import SOFT
from soft_mm.models.settings import FIELDS, attention_settings
from soft_mm.utils.sizes import parse_size

DEFAULT_VARIANTS = ('landmark_mode=avg', 'landmark_mode=conv', 'landmark_mode=avg,newton_iters=30',
                    'landmark_mode=avg,newton_backward=unrolled', 'landmark_mode=avg,landmark_grid=14')


def parse_variant(text: str) -> dict[str, Any]:
    """``'landmark_mode=avg,newton_iters=30'`` -> validated settings keywords (ints and floats converted)."""
    settings: dict[str, Any] = {}
    for item in filter(None, text.split(',')):
        key, sep, value = item.partition('=')
        if not sep or key not in FIELDS:
            raise ValueError(f'variant {text!r}: {item!r} is not FIELD=VALUE with FIELD one of {", ".join(FIELDS)}')
        for convert in (int, float):
            try:
                value = convert(value)
                break
            except ValueError:
                continue
        settings[key] = value
    attention_settings(**settings)  # raises on a bad value, naming it
    return settings


def build_variant(text: str, arch: str) -> SOFT:
    """``SOFT(arch, soft_norm=True, drop_path_rate=0)`` with the variant's settings, initialised with seed 0, in
    training mode."""
    torch.manual_seed(0)
    model = SOFT(arch=arch, soft_norm=True, drop_path_rate=0.0, **parse_variant(text))
    model.init_weights()
    return model.train()


def time_variants(variants: list[str], arch: str, size: tuple[int, int], batch: int, rounds: int
                  ) -> list[tuple[str, float]]:
    """``(variant, min seconds)`` per variant, rounds interleaved, the first round dropped."""
    models = {text: build_variant(text, arch) for text in variants}
    x = torch.randn(batch, 3, *size, generator=torch.Generator().manual_seed(0))
    times: dict[str, list[float]] = {text: [] for text in models}
    for _ in range(rounds + 1):
        for text, model in models.items():
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            sum(out.sum() for out in model(x)).backward()
            times[text].append(time.perf_counter() - start)
    return [(text, min(values[1:])) for text, values in times.items()]


def main(argv: list[str] | None = None) -> list[tuple[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--variants', nargs='+', default=list(DEFAULT_VARIANTS),
                        help='settings per variant, FIELD=VALUE[,FIELD=VALUE...]; the first is the baseline')
    parser.add_argument('--arch', default='tiny')
    parser.add_argument('--size', default='128x128', help='input H x W (default: the demos\' 128x128)')
    parser.add_argument('--batch', type=int, default=8, help='images per step (default: the demos\' 8)')
    parser.add_argument('--rounds', type=int, default=5, help='timed rounds after one warm-up round')
    args = parser.parse_args(argv)
    try:
        size = parse_size(args.size)
        if min(size) < 32:
            raise ValueError
    except ValueError:
        parser.error(f'--size must be H or HxW with both sides >= 32, got {args.size!r}')
    if args.batch < 1 or args.rounds < 1:
        parser.error('--batch and --rounds must be >= 1')
    try:
        results = time_variants(args.variants, args.arch, size, args.batch, args.rounds)
    except (ValueError, TypeError) as error:
        parser.error(str(error))
    base = results[0][1]
    print(f'SOFT-Norm-{args.arch}, {args.batch} x {size[0]}x{size[1]}, forward+backward, {torch.get_num_threads()} '
          f'threads, min of {args.rounds} interleaved rounds')
    for text, seconds in results:
        print(f'{text:48s} {seconds * 1000:9.1f} ms  {seconds / base:5.2f}x')
    return results


if __name__ == '__main__':
    main()
