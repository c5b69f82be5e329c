"""The Triton backend's low-precision errors against float64 beside the plain math's in the same precision (the
FlashAttention rule, ``soft_mm.testing.error_rule``): float16 and bfloat16 inputs, and float32 inputs under
float16 / bfloat16 autocast, output and the gradients of q, landmarks and v.

    python benchmarks/triton_rule.py [--tokens 300 4096] [--landmarks 49] [--device cuda|cpu]

On a GPU (the default where there is one) the real kernels run; on ``--device cpu``, the Triton interpreter on CPU
tensors (``TRITON_INTERPRET=1`` is set here before triton is imported), whose low-precision products round their
operands exactly as the GPU's do. The last column is the largest error over its bound (at most 1 within the rule).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's soft_mm, installed or not (as on a bare GPU machine)
    sys.path.insert(0, str(ROOT))

CASES = ((torch.float16, False, torch.float16), (torch.float32, True, torch.float16),
         (torch.bfloat16, False, torch.bfloat16), (torch.float32, True, torch.bfloat16))
SETTINGS = dict(soft_norm=True, ridge=0.01)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--tokens', type=int, nargs='+', default=[300, 4096])
    parser.add_argument('--landmarks', type=int, default=49)
    parser.add_argument('--device', choices=('cuda', 'cpu'), default='cuda' if torch.cuda.is_available() else 'cpu')
    args = parser.parse_args(argv)
    device = args.device
    if device == 'cpu':
        os.environ['TRITON_INTERPRET'] = '1'
    elif not torch.cuda.is_available():
        parser.error('--device cuda needs a CUDA device; use --device cpu (the Triton interpreter)')
    from soft_mm.ops import soft_attention
    from soft_mm.testing import rule_errors, rule_inputs

    print(f'{"tokens":>6}  {"inputs":<28} {"triton: out / grad q / grad l / grad v":<40} '
          f'{"plain in the same precision":<40} worst / bound')
    for num_tokens in args.tokens:
        tensors, grad_out = rule_inputs(num_tokens, args.landmarks, dtype=torch.float64)
        tensors, grad_out = [t.to(device) for t in tensors], grad_out.to(device)
        for input_dtype, autocast, low in CASES:
            def fused(*leaves, low=low, autocast=autocast):
                with torch.autocast(device, dtype=low, enabled=autocast):
                    return soft_attention(*leaves, backend='triton', **SETTINGS)

            errors = rule_errors(fused, [t.to(input_dtype) for t in tensors], low, grad_out.float(), **SETTINGS)
            name = str(input_dtype).replace('torch.', '') + (f' + {low} autocast'.replace('torch.', '')
                                                              if autocast else '')
            fast, plain = (' '.join(f'{e:.1e}' for e in column) for column in (errors.fast, errors.plain))
            mark = '' if errors.holds() else '  OUTSIDE THE RULE'
            print(f'{num_tokens:>6}  {name:<28} {fast:<40} {plain:<40} {errors.worst():.2f}{mark}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
