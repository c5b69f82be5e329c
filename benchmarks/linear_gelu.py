"""The MLP's first layer in CPU float32 inference: oneDNN's fused linear + GELU, ``F.linear`` then ``F.gelu``, and for
the tanh approximation ``F.linear`` then ``gelu_tanh_`` (the sigmoid form in place), per layer shape of a SOFT backbone
at a detection size and for the whole backbone, side by side in one process.

    python benchmarks/linear_gelu.py                       # SOFT-Norm-Small at 800x1344, 5 interleaved rounds
    python benchmarks/linear_gelu.py --arch tiny --sizes 512x512 --rounds 3

``soft_mm.ops.functional.gelu.linear_gelu`` runs float32 tanh-GELU layers as the GEMM then ``gelu_tanh_`` and fuses
erf-GELU layers of at most ``FUSED_FLOAT32_MAX_IN_FEATURES`` inputs (the rule); this script measures those choices on
the machine it runs on: each distinct fc1 shape of the backbone's MLPs (with its own GELU) fused, unfused and, for
tanh, in the sigmoid form, and the backbone's forward under the rule (``rule``) against fusing every layer within the
bound, tanh ones included (``fused_bound``), fusing every layer (``fused``) and fusing none, with ``F.gelu``
(``unfused``), the four interleaved per round. The three alternatives are this script's own, written with the plain
calls (:data:`VARIANTS`: oneDNN's ``torch.ops.mkldnn._linear_pointwise``, ``F.linear``, ``F.gelu``) and put in place of
``linear_gelu`` in the blocks' MLPs for the block of each timed call (the library has one rule and no switch). Run it
under the allocator setting the other benchmarks use (``MALLOC_MMAP_THRESHOLD_=4294967296
MALLOC_TRIM_THRESHOLD_=68719476736``, benchmarks/harness.py); the table's header says which one it ran under.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from harness import (
    add_rounds_arguments,
    add_sizes_argument,
    check_positive,
    cpu_model,
    gemm_gflops,
    glibc_malloc_note,
    interleaved_medians,
    patched,
    write_results,
)

from soft_mm.models import SOFT, blocks
from soft_mm.models.blocks import GeluMlp
from soft_mm.ops.functional import gelu

CPU = torch.device('cpu')


def fused(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, approximate: str = 'none',
          route: object = None) -> torch.Tensor:
    """``GELU(linear(x))`` as oneDNN's GEMM with the GELU in its epilogue, at any width and either GELU (the forward's
    route, which the library's rule reads, taken and not needed)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, 'gelu', [], approximate)


def unfused(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, approximate: str = 'none',
            route: object = None) -> torch.Tensor:
    """``F.gelu(F.linear(x, weight, bias))``: the GEMM, then a pass of the GELU."""
    return F.gelu(F.linear(x, weight, bias), approximate=approximate)


def fused_within_bound(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                       approximate: str = 'none', route: object = None) -> torch.Tensor:
    """:func:`fused` for layers of at most ``FUSED_FLOAT32_MAX_IN_FEATURES`` inputs, tanh ones included (the rule
    before the sigmoid form), :func:`unfused` above."""
    if weight.shape[1] <= gelu.FUSED_FLOAT32_MAX_IN_FEATURES:
        return fused(x, weight, bias, approximate)
    return unfused(x, weight, bias, approximate)


# each backbone setting: the fc1 + GELU the blocks' MLPs call (the library's linear_gelu: its rule)
VARIANTS = {'rule': gelu.linear_gelu, 'fused_bound': fused_within_bound, 'fused': fused, 'unfused': unfused}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--arch', default='small', help='SOFT arch (default: small)')
    add_sizes_argument(parser, ['800x1344'], 'input size of the backbone')
    add_rounds_arguments(parser, 'work_dirs/linear_gelu')
    args = parser.parse_args(argv)
    check_positive(parser, args)
    return args


def mlp_shapes(model: torch.nn.Module, image: torch.Tensor) -> list[tuple[int, int, int, str, int]]:
    """``(tokens, in, out, approximate, count)`` of the fc1 layers the forward of ``image`` runs, in order of first
    use (``approximate``: the layer's GELU, ``'tanh'`` or ``'none'``)."""
    seen: dict[tuple[int, int, int, str], int] = {}

    def record(module, inputs, _):
        key = (inputs[0].shape[:-1].numel(), module.fc1.in_features, module.fc1.out_features, module.act.approximate)
        seen[key] = seen.get(key, 0) + 1

    hooks = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, GeluMlp)]
    model(image)
    for hook in hooks:
        hook.remove()
    return [(*key, count) for key, count in seen.items()]


def interleaved(cases: dict, rounds: int, repeats: int) -> dict[str, float]:
    """Median seconds of each case (``{name: (setup, fn)}``, ``setup()`` run before each of its rounds), the cases
    interleaved round by round (:func:`harness.interleaved_medians`)."""
    return interleaved_medians({name: fn for name, (_, fn) in cases.items()}, rounds, repeats, CPU,
                               setups={name: setup for name, (setup, _) in cases.items()})


def time_layer(tokens: int, d_in: int, d_out: int, approximate: str, rounds: int, repeats: int,
               ) -> dict[str, float | None]:
    """Milliseconds of one fc1 layer with its GELU: fused, unfused and (tanh) in the sigmoid form (None for erf)."""
    x, weight, bias = torch.randn(tokens, d_in), 0.05 * torch.randn(d_out, d_in), torch.randn(d_out)
    cases = {'fused': (lambda: None, lambda: fused(x, weight, bias, approximate)),
             'unfused': (lambda: None, lambda: unfused(x, weight, bias, approximate))}
    if approximate == 'tanh':
        # as linear_gelu runs it: the GEMM without the bias, which joins the GELU in cache
        cases['sigmoid'] = (lambda: None, lambda: gelu.gelu_tanh_(F.linear(x, weight), bias))
    times = {name: 1000 * t for name, t in interleaved(cases, rounds, repeats).items()}
    return {'sigmoid': None, **times}


def time_backbone(model: torch.nn.Module, image: torch.Tensor, rounds: int, repeats: int) -> dict[str, float]:
    """Seconds of the backbone's forward under each setting of :data:`VARIANTS` (its function in the blocks' MLPs
    for the call, put back after it)."""

    def setting(variant):
        def run():
            with patched(blocks, linear_gelu=variant):
                return model(image)
        return run

    return interleaved({name: (lambda: None, setting(variant)) for name, variant in VARIANTS.items()}, rounds,
                       repeats)


def layer_row(r: dict) -> str:
    sigmoid = '–' if r['sigmoid'] is None else f"{r['sigmoid']:.1f} ({r['unfused'] / r['sigmoid']:.2f}x)"
    return (f"| {r['tokens']} | {r['d_in']} → {r['d_out']} | {r['approximate']} | {r['count']} | {r['fused']:.1f} | "
            f"{r['unfused']:.1f} | {r['unfused'] / r['fused']:.2f}x | {sigmoid} | {r['rule']} |")


def rule_for(d_in: int, approximate: str) -> str:
    """What the rule (``linear_gelu``) runs for a float32 layer in CPU inference."""
    if approximate == 'tanh':
        return 'sigmoid'
    return 'fused' if d_in <= gelu.FUSED_FLOAT32_MAX_IN_FEATURES else 'unfused'


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = SOFT(arch=args.arch, soft_norm=True)
    model.eval()
    allocator = 'tuned' if os.environ.get('MALLOC_MMAP_THRESHOLD_') else 'default'
    header = (f'CPU float32 inference, {torch.get_num_threads()} threads, {cpu_model()}, '
              f'{glibc_malloc_note(allocator)}; median of {args.repeats} calls per round, median of {args.rounds} '
              f'interleaved rounds; GEMM rate {gemm_gflops(CPU, repeats=3):.0f} GFLOP/s')
    data, lines = {'header': header, 'layers': [], 'backbone': []}, []
    with torch.no_grad():
        for h, w in args.sizes:
            image = torch.randn(1, 3, h, w)
            layers = [dict(hw=[h, w], tokens=tokens, d_in=d_in, d_out=d_out, approximate=approximate, count=count,
                           rule=rule_for(d_in, approximate),
                           **time_layer(tokens, d_in, d_out, approximate, args.rounds, args.repeats))
                      for tokens, d_in, d_out, approximate, count in mlp_shapes(model, image)]
            backbone = time_backbone(model, image, args.rounds, args.repeats)
            data['layers'] += layers
            data['backbone'].append(dict(hw=[h, w], **backbone))
            lines += [f'SOFT-Norm-{args.arch.capitalize()} at {h}x{w}: the fc1 layers', '',
                      '| tokens | in → out | GELU | layers | fused ms | unfused ms | unfused / fused | '
                      'sigmoid form ms (unfused / it) | the rule runs |',
                      '|---|---|---|---|---|---|---|---|---|', *map(layer_row, layers), '',
                      'backbone forward (rule: tanh layers in the sigmoid form, erf layers fused up to '
                      f'{gelu.FUSED_FLOAT32_MAX_IN_FEATURES} inputs): '
                      + ', '.join(f'{name} {t:.3f} s' for name, t in backbone.items())
                      + '; ' + ', '.join(f'{name} / rule {backbone[name] / backbone["rule"]:.3f}x'
                                         for name in VARIANTS if name != 'rule'), '']
    write_results(args.out, 'linear_gelu', '\n'.join([header, '', *lines]), args, **data)
    return 0


if __name__ == '__main__':
    sys.exit(main())
