"""One-off ablation of this run (not a tool): where a SOFT attention layer's host time goes. SOFT-Norm-Small's backbone
step with, in every SOFT layer, the landmark sampler replaced by a slice of the queries, the SOFT op by its values, or
the value conv + sum (``conv_add``) by the attention output alone, against the full step, in one process, rounds
interleaved: host_time's setup (CPU tensors on the GPU route, the plan launcher to a stand-in sm_90 driver, batch 2 x
64x64, every channel / 16, bfloat16 autocast, one thread).

    python docs/benchmarks/runs/2026-12-08_zen4_issue58_branches/ablate_attention.py 15
"""
import sys

import torch
from interleaved import ht, interleaved_medians

import soft_mm.models.attention as attention

SAMPLE, OP, CONV_ADD = attention.SoftAttention.sample_landmarks, attention.soft_attention, attention.conv_add


def sliced_landmarks(self, q, hw_shape, route=None):
    grid = self.landmark_shape(hw_shape)
    return q[:, :, :grid[0] * grid[1]].float()


def values(q, landmarks, v, **options):
    return v


def output_alone(v, out, weight, hw_shape, route):
    b, h, n, d = v.shape
    return out.transpose(1, 2).reshape(b, n, h * d)


VARIANTS = {'full': (SAMPLE, OP, CONV_ADD), 'no landmark sampler': (sliced_landmarks, OP, CONV_ADD),
            'no SOFT op': (SAMPLE, values, CONV_ADD), 'no value conv': (SAMPLE, OP, output_alone)}


def main(rounds: int) -> None:
    torch.set_num_threads(1)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    soft = ht.on_route(ht.backbone_step(ht.build_narrow_backbone(ht.SOFT, (64, 64), 16), x), ht.launcher_of('plan'))

    def run(name: str) -> None:
        attention.SoftAttention.sample_landmarks, attention.soft_attention, attention.conv_add = VARIANTS[name]
        soft()
    medians = interleaved_medians({name: (lambda name=name: run(name)) for name in VARIANTS}, rounds, 5,
                                  torch.device('cpu'))
    attention.SoftAttention.sample_landmarks, attention.soft_attention, attention.conv_add = SAMPLE, OP, CONV_ADD
    for name, m in medians.items():
        print(f'{name:20} {1e3 * m:6.2f} ms  {1e3 * (medians["full"] - m):5.2f} ms less than the full step')


if __name__ == '__main__':
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
