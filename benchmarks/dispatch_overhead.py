"""The host time of the SOFT op's Python per call: the checks and the backend decision kept per call signature (an
eager call's, and :func:`soft_mm.ops.soft.dispatch.decide`) against the decision made afresh on every call
(:func:`~soft_mm.ops.soft.dispatch.select`, nothing kept), on a tiny CPU input where the Python is nearly all
of the time, as it is on an eager GPU step; and the decision alone for a CUDA call (bfloat16 autocast, training, the
published sizes) on a stand-in H100, where the Triton backend's check reads the device's table (no GPU needed).

    python benchmarks/dispatch_overhead.py [--calls 2000] [--rounds 15] [--repeats 1] [--tokens 16] [--landmarks 4]

Both ways run in one process, their rounds interleaved (:func:`harness.interleaved_medians`), so that drifts of the
machine fall on both; each timed call of a case is ``--calls`` calls of the op, and the medians per call are printed
with their ratio, for ``soft_attention`` whole, for its decision step (``_decide``) alone and for the CUDA call's
decision. The outputs of the two ways are checked equal first. The switch is this script's (:func:`harness.patched` of
the names ``_decide`` calls and of the eager calls' kept decisions), not the library's.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch
from harness import add_rounds_arguments, check_positive, cpu_model, interleaved_medians, patched

from soft_mm.ops import soft_attention
from soft_mm.ops.precision.soft_policy import precision_policy
from soft_mm.ops.soft import attention, dispatch
from soft_mm.ops.soft.backends.triton import backend as triton_backend
from soft_mm.ops.triton_route import DeviceLimits

__all__ = ['H100', 'main', 'per_call_times']

H100 = DeviceLimits('NVIDIA H100 80GB HBM3', (9, 0), 232_448)  # the stand-in GPU of the CUDA call's decision


class _Forgetting(dict):
    """A dict that keeps nothing: in place of the eager calls' kept decisions, every call checks and decides afresh."""

    def __setitem__(self, key: object, value: object) -> None:
        pass


def _afresh(afresh: bool):
    """The switch: the decision made afresh on each call (``_decide`` taking ``select`` for ``decide``, nothing kept
    per eager call) or kept."""
    if afresh:
        return patched(attention, decide=dispatch.select, _EAGER_CALLS=_Forgetting())
    return patched(attention, decide=dispatch.decide)


def _calls(fn: Callable[[], object], calls: int, afresh: bool) -> Callable[[], None]:
    """``calls`` calls of ``fn``, with the decision made afresh on each or kept (:func:`_afresh`)."""
    def run() -> None:
        with _afresh(afresh):
            for _ in range(calls):
                fn()
    return run


def per_call_times(calls: int, rounds: int, repeats: int, tokens: int, landmarks: int) -> dict[str, dict[str, float]]:
    """``{'soft_attention': {'kept': s, 'afresh': s}, '_decide': {...}, 'CUDA decision': {...}}``: median seconds per
    call of each way."""
    gen = torch.Generator().manual_seed(0)
    q, v = (torch.randn(1, 2, tokens, 8, generator=gen) for _ in range(2))
    lm = torch.randn(1, 2, landmarks, 8, generator=gen)
    cuda_call = ('cuda', torch.float32, precision_policy('cuda', torch.bfloat16), 66816, True, 'eager')
    sizes = dict(num_landmarks=49, head_dim=32, value_dim=32, device_index=0)
    steps = {'soft_attention': lambda: soft_attention(q, lm, v, soft_norm=True, ridge=0.01),
             '_decide': lambda: attention._decide(q, lm, v, None, None),
             'CUDA decision': lambda: attention.decide(*cuda_call, **sizes)}
    with _afresh(True):
        afresh = steps['soft_attention']()
    if not torch.equal(afresh, steps['soft_attention']()):
        raise RuntimeError('dispatch_overhead: the two ways gave different outputs')
    cpu = torch.device('cpu')
    times = {}
    with patched(triton_backend, device_limits=lambda index=None: H100):
        for step, fn in steps.items():
            cases = {way: _calls(fn, calls, afresh=way == 'afresh') for way in ('kept', 'afresh')}
            times[step] = {way: t / calls for way, t in interleaved_medians(cases, rounds, repeats, cpu).items()}
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_rounds_arguments(parser, out='-')
    parser.set_defaults(rounds=15, repeats=1)
    parser.add_argument('--calls', type=int, default=2000, help='calls of the op per timed call (default: 2000)')
    parser.add_argument('--tokens', type=int, default=16, help='N (default: 16)')
    parser.add_argument('--landmarks', type=int, default=4, help='m (default: 4)')
    args = parser.parse_args(argv)
    check_positive(parser, args, 'calls', 'tokens', 'landmarks')
    torch.set_num_threads(1)
    times = per_call_times(args.calls, args.rounds, args.repeats, args.tokens, args.landmarks)
    print(f'torch {torch.__version__}, {cpu_model()}, one thread; {args.rounds} interleaved rounds of '
          f'{args.repeats} x {args.calls} calls, N = {args.tokens}, m = {args.landmarks}')
    for step, by_way in times.items():
        kept, afresh = by_way['kept'], by_way['afresh']
        print(f'{step:<15} decision kept {kept * 1e6:8.1f} us/call   made afresh {afresh * 1e6:8.1f} us/call   '
              f'afresh / kept {afresh / kept:.2f}x')
    return 0


if __name__ == '__main__':
    sys.exit(main())
