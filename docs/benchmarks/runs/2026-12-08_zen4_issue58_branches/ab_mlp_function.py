"""One-off A/B of this run (not a tool), tried and not kept: a post-norm SOFT block's MLP branch in training (fc1, the
GELU, fc2 without its bias) as one autograd Function with a hand-written backward, against the package's form (ATen's
autograd nodes), beside Swin-T, in one process, rounds interleaved: host_time's setup (CPU tensors on the GPU route,
the plan launcher to a stand-in sm_90 driver, batch 2 x 64x64, every channel / 16, bfloat16 autocast, one thread).

    python docs/benchmarks/runs/2026-12-08_zen4_issue58_branches/ab_mlp_function.py 15
"""
import sys

import torch
import torch.nn.functional as F
from interleaved import ht, interleaved_medians

import soft_mm.models.blocks as blocks

MLP = blocks.GeluMlp.forward


class MlpBranch(torch.autograd.Function):
    """``gelu(x @ w1.T + b1) @ w2.T`` in the autocast dtype, one node."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2, approximate):
        dtype = torch.get_autocast_dtype('cpu') if torch.is_autocast_enabled('cpu') else x.dtype
        with torch.autocast('cpu', enabled=False):
            xc, w1c, w2c = x.to(dtype), w1.to(dtype), w2.to(dtype)
            h = torch.addmm(b1.to(dtype), xc.reshape(-1, xc.shape[-1]), w1c.t())
            a = F.gelu(h, approximate=approximate)
            y = torch.mm(a, w2c.t())
        ctx.save_for_backward(xc, w1c, w2c, h, a)
        ctx.meta = approximate, x.dtype, w1.dtype, b1.dtype, w2.dtype
        return y.view(*x.shape[:-1], w2.shape[0])

    @staticmethod
    def backward(ctx, grad):
        xc, w1c, w2c, h, a = ctx.saved_tensors
        approximate, x_dtype, w1_dtype, b1_dtype, w2_dtype = ctx.meta
        grad = grad.reshape(-1, grad.shape[-1]).to(a.dtype)
        grad_h = torch.ops.aten.gelu_backward(grad.mm(w2c), h, approximate=approximate)
        grad_x = grad_h.mm(w1c).view(xc.shape)
        return (grad_x.to(x_dtype), grad_h.t().mm(xc.reshape(-1, xc.shape[-1])).to(w1_dtype),
                grad_h.sum(0).to(b1_dtype), grad.t().mm(a).to(w2_dtype), None)


def one_node(self, x, residual=None, output_bias=True, route=None):
    if output_bias or not torch.is_grad_enabled():
        return MLP(self, x, residual, output_bias, route)
    return MlpBranch.apply(x, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.act.approximate)


def main(rounds: int) -> None:
    torch.set_num_threads(1)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    soft = ht.on_route(ht.backbone_step(ht.build_narrow_backbone(ht.SOFT, (64, 64), 16), x), ht.launcher_of('plan'))
    swin = ht.on_route(ht.backbone_step(ht.build_narrow_backbone('swin_t', (64, 64), 16), x), ht.launcher_of('plan'))
    variants = {'package': MLP, 'MLP as one node': one_node}

    def run(name: str) -> None:
        if name == 'swin_t':
            swin()
            return
        blocks.GeluMlp.forward = variants[name]
        soft()
    names = [*variants, 'swin_t']
    medians = interleaved_medians({name: (lambda name=name: run(name)) for name in names}, rounds, 5,
                                  torch.device('cpu'))
    blocks.GeluMlp.forward = MLP
    for name, m in medians.items():
        print(f'{name:16} {1e3 * m:6.2f} ms  {m / medians["swin_t"]:.3f}x swin_t')
    print(f'one node / package: {medians["MLP as one node"] / medians["package"]:.3f}')


if __name__ == '__main__':
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
