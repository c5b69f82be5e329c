"""One-off A/B of this run (not a tool): SOFT-Norm-Small's backbone step with the fused value conv (``conv_add``)
and without it (``fuses_conv_add`` patched to False, the layer's PyTorch form), beside Swin-T, in one process, rounds
interleaved: host_time's setup (CPU tensors on the GPU route, the plan launcher to a stand-in sm_90 driver, batch 2 x
64x64, every channel / 16, bfloat16 autocast, one thread).

    python docs/benchmarks/runs/2026-12-07_zen4_issue58_value_conv/ab_value_conv.py 21
"""
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / 'benchmarks'))

import host_time as ht
import torch

import soft_mm.models.attention as attention


def main(rounds: int) -> None:
    torch.set_num_threads(1)
    fused_rule = attention.fuses_conv_add
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    runs = {}
    for name, fused in (('soft fused conv', True), ('soft unfused', False)):
        step = ht.on_route(ht.backbone_step(ht.build_narrow_backbone(ht.SOFT, (64, 64), 16), x),
                           ht.launcher_of('plan'))

        def run(step=step, fused=fused) -> None:
            attention.fuses_conv_add = fused_rule if fused else (lambda *args: False)
            step()
        runs[name] = run
    runs['swin'] = ht.on_route(ht.backbone_step(ht.build_narrow_backbone('swin_t', (64, 64), 16), x),
                               ht.launcher_of('plan'))
    for run in runs.values():
        for _ in range(5):
            run()
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            gc.collect()
            start = time.perf_counter()
            for _ in range(5):
                run()
            times[name].append((time.perf_counter() - start) / 5)
    median = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
    for name, m in median.items():
        print(f'{name:16} {1e3 * m:.2f} ms  {m / median["swin"]:.3f}x swin  {m / median["soft unfused"]:.3f}x unfused')
    paired = sorted(a / b for a, b in zip(times['soft fused conv'], times['soft unfused']))
    print(f'per-round fused/unfused: median {paired[len(paired) // 2]:.3f}, range {paired[0]:.3f}-{paired[-1]:.3f}')


if __name__ == '__main__':
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
