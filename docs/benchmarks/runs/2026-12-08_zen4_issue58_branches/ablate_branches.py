"""One-off ablation of this run (not a tool): where SOFT-Norm-Small's host step goes, by branch. Its backbone step with
every SOFT attention layer, or every block's MLP, replaced by one bias-free linear of the same output (the rest of the
step unchanged), beside the full step and Swin-T's, in one process, rounds interleaved: host_time's setup (CPU tensors
on the GPU route, the plan launcher to a stand-in sm_90 driver, batch 2 x 64x64, every channel / 16, bfloat16
autocast, one thread).

    python docs/benchmarks/runs/2026-12-08_zen4_issue58_branches/ablate_branches.py 15
"""
import sys

import torch
import torch.nn.functional as F
from interleaved import ht, interleaved_medians

import soft_mm.models.attention as attention
import soft_mm.models.blocks as blocks

ATTENTION, MLP = attention.SoftAttention.forward, blocks.GeluMlp.forward


def one_linear_attention(self, x, hw_shape, residual=None, output_bias=True, route=None):
    return F.linear(x, self.proj.weight)


def one_linear_mlp(self, x, residual=None, output_bias=True, route=None):
    return F.linear(x, self.fc2.weight[:, :x.shape[-1]])


VARIANTS = {'full': (ATTENTION, MLP), 'attention as one linear': (one_linear_attention, MLP),
            'MLP as one linear': (ATTENTION, one_linear_mlp)}


def main(rounds: int) -> None:
    torch.set_num_threads(1)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    soft = ht.on_route(ht.backbone_step(ht.build_narrow_backbone(ht.SOFT, (64, 64), 16), x), ht.launcher_of('plan'))
    swin = ht.on_route(ht.backbone_step(ht.build_narrow_backbone('swin_t', (64, 64), 16), x), ht.launcher_of('plan'))

    def run(name: str) -> None:
        if name == 'swin_t':
            swin()
            return
        attention.SoftAttention.forward, blocks.GeluMlp.forward = VARIANTS[name]
        soft()
    names = [*VARIANTS, 'swin_t']
    medians = interleaved_medians({name: (lambda name=name: run(name)) for name in names}, rounds, 5,
                                  torch.device('cpu'))
    attention.SoftAttention.forward, blocks.GeluMlp.forward = ATTENTION, MLP
    for name, m in medians.items():
        print(f'{name:24} {1e3 * m:6.2f} ms  {m / medians["swin_t"]:.3f}x swin_t')


if __name__ == '__main__':
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
