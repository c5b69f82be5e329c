"""Error against float64 and time of the SOFT op under each precision policy and backend, side by side.

    python benchmarks/precision.py [--tokens 16384 65536] [--landmarks 49] [--head-dim 32] [--heads 2]
        [--repeats 5] [--threads 2]

For each token count: the float64 reference (``soft_mm.ops.naive_soft_attention``, the plain math, in float64),
then forward and forward+backward of ``soft_attention`` in float32 (``precision='highest'``) and with bfloat16
products (the policy under bfloat16 autocast), on each backend that takes the call, beside the plain math in
bfloat16 (the FlashAttention rule's baseline) and two rejected alternatives written out here: the bfloat16 products
with the kernel exponent's dot products in bfloat16 too, and those dot products alone in bfloat16. Errors are
relative Frobenius errors of the output and of grad q; times are medians, rounds interleaved across the variants.
The inputs imitate a trained layer (``soft_mm.testing.error_rule.rule_inputs``): scaled queries of std 0.42, m
landmarks near m of them, unit values.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from soft_mm.ops import gaussian_kernel, naive_soft_attention, newton_inverse, soft_attention
from soft_mm.ops.soft.dispatch import DispatchError
from soft_mm.testing import outputs_and_grads, relative_error, rule_inputs

SETTINGS = dict(soft_norm=True, ridge=0.01)  # SOFT-Norm with the published models' ridge


def rejected(q, landmarks, v, low_products: bool):
    """The rejected alternatives: the SOFT-Norm math in float32 with the exponent's dot products in bfloat16, and with
    ``low_products`` the two products with v in bfloat16 too (float32 accumulation; the plain math itself is
    :func:`~soft_mm.ops.naive_soft_attention`)."""
    low = torch.bfloat16
    dot = (q.to(low) @ landmarks.to(low).transpose(-2, -1)).float()
    exponent = dot - 0.5 * q.pow(2).sum(-1, keepdim=True) - 0.5 * landmarks.pow(2).sum(-1).unsqueeze(-2)
    k1 = exponent.clamp_max(0).exp().to(low if low_products else torch.float32)
    kernel_landmarks = gaussian_kernel(landmarks, landmarks)
    inverse = newton_inverse(kernel_landmarks, 20, SETTINGS['ridge'])
    scale = kernel_landmarks.sum(-1).rsqrt().unsqueeze(-1)
    context = (k1.transpose(-2, -1) @ v.to(k1.dtype)).float()
    return k1 @ (scale * (inverse @ (scale * context))).to(k1.dtype)


def variants() -> dict[str, Callable]:
    def op(precision, backend):
        return lambda q, lm, v: soft_attention(q, lm, v, precision=precision, backend=backend, **SETTINGS)
    return {
        'float32, reference': op('highest', 'reference'),
        'float32, tiled': op('highest', 'tiled'),
        'bf16 products, reference': op('bfloat16', 'reference'),
        'bf16 products, tiled': op('bfloat16', 'tiled'),
        'plain bfloat16 (baseline of the rule)': lambda q, lm, v: naive_soft_attention(
            q.bfloat16(), lm.bfloat16(), v.bfloat16(), **SETTINGS),
        'bf16 products + bf16 exponent dot (rejected)': lambda q, lm, v: rejected(q, lm, v, True),
        'bf16 exponent dot only (rejected)': lambda q, lm, v: rejected(q, lm, v, False),
    }


def forward_backward(fn, inputs, grad_out) -> None:
    """The timed forward+backward: one forward, the backward into q."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    torch.autograd.grad(out, leaves[:1], grad_out.to(out.dtype))


def bench(num_tokens: int, args) -> list[tuple]:
    inputs, grad_out = rule_inputs(num_tokens, args.landmarks, args.head_dim, batch=1, heads=args.heads)
    reference = outputs_and_grads(lambda *t: naive_soft_attention(*t, **SETTINGS), [t.double() for t in inputs],
                                  grad_out.double())
    table = {}
    for name, fn in variants().items():
        try:
            out, grad_q, *_ = outputs_and_grads(fn, inputs, grad_out)
        except DispatchError as err:
            print(f'  {name}: skipped ({err})')
            continue
        table[name] = dict(fn=fn, out_err=relative_error(out, reference[0]),
                           grad_err=relative_error(grad_q, reference[1]), fwd=[], fwdbwd=[])
    for _ in range(args.repeats):  # rounds interleaved across variants
        for row in table.values():
            with torch.no_grad():
                start = time.perf_counter()
                row['fn'](*inputs)
                row['fwd'].append(time.perf_counter() - start)
            start = time.perf_counter()
            forward_backward(row['fn'], inputs, grad_out)
            row['fwdbwd'].append(time.perf_counter() - start)
    base = statistics.median(table['float32, reference']['fwdbwd']) if 'float32, reference' in table else None
    rows = []
    for name, row in table.items():
        fwd, fwdbwd = statistics.median(row['fwd']), statistics.median(row['fwdbwd'])
        rows.append((name, row['out_err'], row['grad_err'], 1e3 * fwd, 1e3 * fwdbwd,
                     base / fwdbwd if base else float('nan')))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--tokens', type=int, nargs='+', default=[16384, 65536])
    parser.add_argument('--landmarks', type=int, default=49)
    parser.add_argument('--head-dim', type=int, default=32)
    parser.add_argument('--heads', type=int, default=2)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--threads', type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    for num_tokens in args.tokens:
        print(f'\n{num_tokens} tokens, m = {args.landmarks}, d = {args.head_dim}, {args.heads} heads, SOFT-Norm, '
              f'{torch.get_num_threads()} threads; errors against float64, times median of {args.repeats}')
        print('| variant | output error | grad q error | forward ms | fwd+bwd ms | fwd+bwd speed-up vs float32 '
              'reference |\n|---|---|---|---|---|---|')
        for name, out_err, grad_err, fwd, fwdbwd, speedup in bench(num_tokens, args):
            print(f'| {name} | {out_err:.2e} | {grad_err:.2e} | {fwd:.1f} | {fwdbwd:.1f} | {speedup:.2f}x |')
    return 0


if __name__ == '__main__':
    sys.exit(main())
