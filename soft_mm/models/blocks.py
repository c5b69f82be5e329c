"""Transformer blocks shared by the SOFT stages (post-norm) and the softmax stage (pre-norm)."""
from __future__ import annotations

import torch
from timm.layers import DropPath, Mlp, register_notrace_function
from torch import nn

from ..ops.layers.gelu import linear_gelu

# torch.fx: linear_gelu picks the fused kernel from the device, dtype and grad mode in Python, so a symbolic trace
# keeps the call as one node that runs eagerly (see soft_mm.models.attention)
torch.fx.wrap('linear_gelu')
register_notrace_function(linear_gelu)


class TanhGELU(nn.GELU):
    """GELU with the tanh approximation (the SOFT blocks' activation)."""

    def __init__(self) -> None:
        super().__init__(approximate='tanh')


class GeluMlp(Mlp):
    """timm's ``Mlp`` (same parameters and state-dict keys) whose first linear layer and GELU run as one fused GEMM
    in CPU inference (:func:`soft_mm.ops.layers.gelu.linear_gelu`); other activations, training and other devices run
    timm's forward unchanged. ``fuse = False`` (on the class or an instance) turns the fusion off, for A/B
    benchmarks."""

    fuse = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fuse or not isinstance(self.act, nn.GELU):
            return super().forward(x)
        x = self.drop1(linear_gelu(x, self.fc1.weight, self.fc1.bias, self.act.approximate))
        return self.drop2(self.fc2(self.norm(x)))


class Block(nn.Module):
    """A transformer block around any token-mixing ``attn(x, hw_shape)``: ``(B, N, C) -> (B, N, C)``.

    ``post_norm=True`` (SOFT stages): ``x = LN(x + attn(x)); x = LN(x + mlp(x))``.
    ``post_norm=False`` (softmax stage): ``x = x + attn(LN(x)); x = x + mlp(LN(x))``.
    Both residual branches go through stochastic depth with probability ``drop_path``.
    """

    def __init__(self, dim: int, attn: nn.Module, mlp_ratio: float = 4.0, post_norm: bool = False,
                 norm_eps: float = 1e-6, act_layer: type[nn.Module] = nn.GELU, drop_path: float = 0.0) -> None:
        super().__init__()
        self.post_norm = post_norm
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = attn
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = GeluMlp(dim, int(dim * mlp_ratio), act_layer=act_layer)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, hw_shape: tuple[int, int]) -> torch.Tensor:
        if self.post_norm:
            # the stream keeps its dtype: CUDA autocast runs LayerNorm in float32 and returns float32, which would
            # turn the residual stream float32 (every linear then casts it back); a no-op elsewhere
            x = x + self.drop_path(self.attn(x, hw_shape))
            x = self.norm1(x).to(x.dtype)
            x = x + self.drop_path(self.mlp(x))
            return self.norm2(x).to(x.dtype)
        x = x + self.drop_path(self.attn(self.norm1(x), hw_shape))
        return x + self.drop_path(self.mlp(self.norm2(x)))
