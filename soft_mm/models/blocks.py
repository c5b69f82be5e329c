"""Transformer blocks shared by the SOFT stages (post-norm) and the softmax stage (pre-norm)."""
from __future__ import annotations

import torch
from timm.layers import DropPath, Mlp, register_notrace_function
from torch import nn

from ..ops.functional.add_norm import add_layer_norm, fuses_add_norm
from ..ops.functional.gelu import linear_gelu
from ..ops.functional.residual import hooked, linear_residual

# torch.fx: linear_gelu picks the fused kernel from the device, dtype and grad mode in Python, so a symbolic trace
# keeps the call as one node that runs eagerly (see soft_mm.models.attention)
torch.fx.wrap('linear_gelu')
torch.fx.wrap('linear_residual')
register_notrace_function(linear_gelu)
register_notrace_function(linear_residual)


class TanhGELU(nn.GELU):
    """GELU with the tanh approximation (the SOFT blocks' activation)."""

    def __init__(self) -> None:
        super().__init__(approximate='tanh')


class GeluMlp(Mlp):
    """timm's ``Mlp`` (same parameters and state-dict keys) whose first linear layer and GELU run as one fused GEMM
    in CPU inference (:func:`soft_mm.ops.functional.gelu.linear_gelu`); other activations, training and other devices
    run timm's forward unchanged. ``forward(x, residual)`` returns ``residual + mlp(x)``, the sum started in the second
    layer's GEMM in CPU inference (:func:`soft_mm.ops.functional.residual.linear_residual`). (The benchmarks' A/B
    variants without either patch the instance's forward in the benchmark code: ``benchmarks/harness.py``.)"""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if not isinstance(self.act, nn.GELU):
            out = super().forward(x)
            return out if residual is None else residual + out
        x = self.norm(self.drop1(linear_gelu(x, self.fc1.weight, self.fc1.bias, self.act.approximate)))
        if residual is None or (self.training and self.drop2.p > 0) or hooked(self.fc2):
            out = self.drop2(self.fc2(x))
            return out if residual is None else residual + out
        return linear_residual(x, self.fc2.weight, self.fc2.bias, residual)


class Block(nn.Module):
    """A transformer block around any token-mixing ``attn(x, hw_shape)``: ``(B, N, C) -> (B, N, C)``.

    ``post_norm=True`` (SOFT stages): ``x = LN(x + attn(x)); x = LN(x + mlp(x))``, each sum and norm one fused kernel
    on the GPU route (:func:`~soft_mm.ops.functional.add_norm.add_layer_norm`).
    ``post_norm=False`` (softmax stage): ``x = x + attn(LN(x)); x = x + mlp(LN(x))``.
    Both residual branches go through stochastic depth with probability ``drop_path``. Where that is the identity
    (``drop_path=0`` or eval mode) the sums are handed to the branches' last linear layers (``residual=``), which start
    them in their GEMMs in CPU inference; an attention module without ``adds_residual = True`` (one that takes no
    ``residual`` argument) and a branch that a forward hook watches get the plain sum, so hooks see the branch's own
    output.
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

    def _attend(self, y: torch.Tensor, hw_shape: tuple[int, int], residual: torch.Tensor) -> torch.Tensor:
        """``residual + drop_path(attn(y))``."""
        if self._sum_in_branch() and getattr(self.attn, 'adds_residual', False) and not hooked(self.attn):
            return self.attn(y, hw_shape, residual=residual)
        return residual + self.drop_path(self.attn(y, hw_shape))

    def _feed_forward(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual + drop_path(mlp(y))``."""
        if self._sum_in_branch() and not hooked(self.mlp):
            return self.mlp(y, residual=residual)
        return residual + self.drop_path(self.mlp(y))

    def _sum_in_branch(self) -> bool:
        """Whether stochastic depth is the identity here (none, or eval mode), so a branch may add its residual."""
        return isinstance(self.drop_path, nn.Identity) or not self.training

    def _fuses_add_norm(self, x: torch.Tensor) -> bool:
        """Whether the post-norm sums and norms run as :func:`~soft_mm.ops.functional.add_norm.add_layer_norm`'s fused
        kernels (the GPU route, eager; not where a hook watches a norm or a branch, or the norms are not plain)."""
        return (type(self.norm1) is nn.LayerNorm and type(self.norm2) is nn.LayerNorm
                and fuses_add_norm(x, x, self.norm1.weight) and not hooked(self.norm1, self.norm2, self.attn, self.mlp))

    def forward(self, x: torch.Tensor, hw_shape: tuple[int, int]) -> torch.Tensor:
        if self.post_norm and self._fuses_add_norm(x):
            # on the GPU route: each sum, its LayerNorm (float32 statistics) and the cast back to the stream's dtype in
            # one kernel
            x = add_layer_norm(self.drop_path(self.attn(x, hw_shape)), x, self.norm1.weight, self.norm1.bias,
                               self.norm1.eps)
            return add_layer_norm(self.drop_path(self.mlp(x)), x, self.norm2.weight, self.norm2.bias, self.norm2.eps)
        if self.post_norm:
            # the stream keeps its dtype: CUDA autocast runs LayerNorm in float32 and returns float32, which would
            # turn the residual stream float32 (every linear then casts it back); a no-op elsewhere
            x = self.norm1(self._attend(x, hw_shape, x)).to(x.dtype)
            return self.norm2(self._feed_forward(x, x)).to(x.dtype)
        x = self._attend(self.norm1(x), hw_shape, x)
        return self._feed_forward(self.norm2(x), x)
