"""Speed of the SOFT backbone under ``torch.compile`` next to eager, and the largest difference of their outputs.

    python benchmarks/torch_compile.py                                 # SOFT-Tiny, 1x3x224x224 and 1x3x512x512, CPU
    python benchmarks/torch_compile.py --arch small --sizes 800x1333 --dynamic --repeats 5
    python benchmarks/torch_compile.py --arch small --soft-norm --sizes 800x1344 --dtype bfloat16 --freezing

Prints one row per input size: eager time, compiled time (medians of ``--repeats`` interleaved rounds after
warm-up), their ratio, the one-off compile time, ``max |compiled - eager|`` over the four outputs, and the error of
each against the model run in float64 (``max |out - exact| / max |exact|``, the largest over the four maps).
``--backend inductor`` (the default) needs a C++ compiler on CPU; when it cannot compile, the tool says so and falls
back to ``aot_eager`` (same graph capture, no code generation), so the outputs are still compared. ``--dtype
bfloat16`` runs eager and compiled forwards under bfloat16 autocast; ``--freezing`` sets inductor's ``freezing``
(weights folded into the graph as constants, for inference) for the run, restored after it
(:func:`harness.inductor_freezing`). Timings are noisy on a shared machine: compare ratios
of one run.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time
from collections.abc import Callable, Iterator, Sequence

import torch
from harness import autocast_to, inductor_freezing
from torch import nn

from soft_mm.models import SOFT
from soft_mm.utils.sizes import size_arg

FALLBACK_BACKEND = 'aot_eager'


def _median_times(fns: Sequence[Callable[[], object]], repeats: int) -> list[float]:
    """Median seconds of each of ``fns`` over ``repeats`` rounds, the calls interleaved (eager, compiled, eager, ...)
    so that drift on a shared machine hits both alike."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, record in zip(fns, times):
            start = time.perf_counter()
            fn()
            record.append(time.perf_counter() - start)
    return [statistics.median(record) for record in times]


@contextlib.contextmanager
def inference(dtype: torch.dtype = torch.float32, device_type: str = 'cpu') -> Iterator[None]:
    """No grad, and autocast to ``dtype`` unless it is float32."""
    with torch.no_grad(), autocast_to(device_type, dtype):
        yield


def compile_backbone(model: nn.Module, sample: torch.Tensor, backend: str = 'inductor', dynamic: bool | None = None,
                     dtype: torch.dtype = torch.float32,
                     ) -> tuple[Callable[[torch.Tensor], tuple[torch.Tensor, ...]], str, float]:
    """``torch.compile(model)`` run once on ``sample`` (under :func:`inference` in ``dtype``); falls back to
    :data:`FALLBACK_BACKEND` if ``backend`` fails.

    Returns the compiled callable, the backend used and the seconds the first (compiling) call took.
    """
    for name in dict.fromkeys([backend, FALLBACK_BACKEND]):
        torch._dynamo.reset()
        start = time.perf_counter()
        try:
            compiled = torch.compile(model, backend=name, dynamic=dynamic)
            with inference(dtype, sample.device.type):
                compiled(sample)
        except Exception as error:  # any backend failure: report it and fall back
            if name == FALLBACK_BACKEND:
                raise
            print(f'torch.compile backend {name!r} failed ({type(error).__name__}: '
                  f'{str(error).strip().splitlines()[0][:200]}); falling back to {FALLBACK_BACKEND!r}')
            continue
        return compiled, name, time.perf_counter() - start
    raise AssertionError('unreachable')


def compare(model: nn.Module, sizes: Sequence[tuple[int, int]], backend: str = 'inductor', repeats: int = 3,
            batch: int = 1, dynamic: bool | None = None, seed: int = 0, dtype: torch.dtype = torch.float32,
            freezing: bool = False, float64_errors: bool = False) -> list[dict]:
    """One row per ``(height, width)``: eager and compiled seconds, compile seconds, max abs output difference
    (both forwards under :func:`inference` in ``dtype``; ``freezing``: inductor's weight freezing for every compilation
    of the run); with ``float64_errors`` also the error of each against the model run in float64
    (:func:`max_norm_error`)."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    compiled, used = None, backend
    with inductor_freezing(freezing):
        for height, width in sizes:
            x = torch.randn(batch, model.in_channels, height, width, generator=generator)
            if compiled is None or not dynamic:
                compiled, used, compile_s = compile_backbone(model, x, backend, dynamic, dtype)
            else:
                start = time.perf_counter()
                with inference(dtype, x.device.type):
                    compiled(x)
                compile_s = time.perf_counter() - start
            with inference(dtype, x.device.type):
                eager_out = model(x)
                compiled_out = compiled(x)
                eager_s, compiled_s = _median_times([lambda x=x: model(x), lambda x=x, fn=compiled: fn(x)], repeats)
            diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(eager_out, compiled_out))
            row = {'size': (height, width), 'backend': used, 'eager_s': eager_s, 'compiled_s': compiled_s,
                   'compile_s': compile_s, 'max_abs_diff': diff}
            if float64_errors:
                with torch.no_grad():
                    exact = copy.deepcopy(model).double()(x.double())
                row['eager_error'] = max_norm_error(eager_out, exact)
                row['compiled_error'] = max_norm_error(compiled_out, exact)
            rows.append(row)
    return rows


def max_norm_error(outs: Sequence[torch.Tensor], exact: Sequence[torch.Tensor]) -> float:
    """The largest ``max |out - exact| / max |exact|`` over the output maps (a max-norm error, as the recorded runs
    give it; the Frobenius relative error is :func:`soft_mm.testing.error_rule.relative_error`)."""
    return max(float((o.double() - e).abs().max() / e.abs().max()) for o, e in zip(outs, exact))


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--arch', default='tiny', help='backbone arch (tiny, small, medium, large, huge)')
    parser.add_argument('--soft-norm', action='store_true', help='SOFT-Norm backbone')
    parser.add_argument('--sizes', type=size_arg, nargs='+', default=[(224, 224), (512, 512)], help='input sizes HxW')
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--backend', default='inductor', help='torch.compile backend (inductor, aot_eager, eager)')
    parser.add_argument('--dynamic', action='store_true', help='one dynamic-shape graph for all sizes')
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--threads', type=int, help='torch.set_num_threads')
    parser.add_argument('--dtype', choices=('float32', 'bfloat16'), default='float32',
                        help='float32, or bfloat16 autocast for both the eager and the compiled forward')
    parser.add_argument('--freezing', action='store_true',
                        help="inductor's freezing: the weights become constants of the graph (inference only)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = SOFT(args.arch, soft_norm=args.soft_norm)
    model.eval()
    rows = compare(model, args.sizes, args.backend, args.repeats, args.batch, args.dynamic or None,
                   dtype=getattr(torch, args.dtype), freezing=args.freezing, float64_errors=True)
    print(f'SOFT-{args.arch}{" (SOFT-Norm)" if args.soft_norm else ""}, batch {args.batch}, '
          f'{torch.get_num_threads()} threads, {args.dtype if args.dtype == "float32" else "bfloat16 autocast"}'
          f'{", inductor freezing" if args.freezing else ""}')
    print(f'{"size":>11} {"backend":>10} {"eager ms":>9} {"compiled ms":>12} {"speed-up":>9} {"compile s":>10} '
          f'{"max |diff|":>11} {"eager err":>10} {"compiled err":>12}')
    for row in rows:
        size = 'x'.join(map(str, row['size']))
        print(f'{size:>11} {row["backend"]:>10} {row["eager_s"] * 1e3:9.1f} {row["compiled_s"] * 1e3:12.1f} '
              f'{row["eager_s"] / row["compiled_s"]:8.2f}x {row["compile_s"]:10.1f} {row["max_abs_diff"]:11.2e} '
              f'{row["eager_error"]:10.2e} {row["compiled_error"]:12.2e}')
    return rows


if __name__ == '__main__':
    main()
