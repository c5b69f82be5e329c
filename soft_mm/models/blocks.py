"""Transformer blocks shared by the SOFT stages (post-norm) and the softmax stage (pre-norm)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import DropPath, Mlp, register_notrace_function
from torch import nn

from ..ops.functional.add_norm import add_layer_norm, fuses_add_norm
from ..ops.functional.gelu import linear_gelu
from ..ops.functional.residual import hooked, linear_residual, plain_linear
from ..ops.route import Route, decided

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
    layer's GEMM in CPU inference (:func:`soft_mm.ops.functional.residual.linear_residual`); ``forward(x,
    output_bias=False)`` leaves out the second layer's bias (:attr:`output_bias`), for a caller that adds it itself.
    (The benchmarks' A/B variants without either patch the instance's forward in the benchmark code:
    ``benchmarks/harness.py``.)"""

    takes_route = True  # forward takes the forward's route (the blocks hand it theirs)

    @property
    def output_bias(self) -> torch.Tensor | None:
        """The bias of the branch's last linear layer (``fc2``)."""
        return self.fc2.bias

    def leaves_output_bias(self) -> bool:
        """Whether ``forward(..., output_bias=False)`` may leave :attr:`output_bias` to the caller: a GELU between
        plain linear layers (:func:`~soft_mm.ops.functional.residual.plain_linear`)."""
        return isinstance(self.act, nn.GELU) and plain_linear(self.fc1, self.fc2)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, output_bias: bool = True,
                route: Route | None = None) -> torch.Tensor:
        if not (isinstance(self.act, nn.GELU) and plain_linear(self.fc1)):
            out = super().forward(x)
            return out if residual is None else residual + out
        x = self.norm(self.drop1(linear_gelu(x, self.fc1.weight, self.fc1.bias, self.act.approximate, route)))
        if not output_bias:
            return self.drop2(F.linear(x, self.fc2.weight))
        if residual is None or (self.training and self.drop2.p > 0) or not plain_linear(self.fc2):
            out = self.drop2(self.fc2(x))
            return out if residual is None else residual + out
        return linear_residual(x, self.fc2.weight, self.fc2.bias, residual, route)


def drop_path_scales(keep: torch.Tensor, batch: int, dtype: torch.dtype) -> torch.Tensor:
    """Stochastic depth's per-sample scales of several residual branches at once: ``(n, batch)`` in ``dtype`` (the
    residual stream's), each ``1 / keep`` with probability ``keep`` and 0 otherwise (as timm's ``DropPath`` scales a
    kept branch, in the branch's dtype), drawn in two launches. ``keep``: ``(n, 1)`` the branches' keep probabilities
    (``1 - drop_prob``), all > 0."""
    return torch.empty(keep.shape[0], batch, dtype=dtype, device=keep.device).bernoulli_(keep).div_(keep)


class _ScaledSum(torch.autograd.Function):
    """``residual + scale * branch``: one operator forward, one backward (autograd's ``addcmul`` takes two, the scale's
    product with its constant first)."""

    @staticmethod
    def forward(ctx, residual: torch.Tensor, branch: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(scale)
        return torch.addcmul(residual, branch, scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        (scale,) = ctx.saved_tensors
        return grad, grad * scale, None


def _residual_sum(residual: torch.Tensor, branch: torch.Tensor, scale: torch.Tensor | None, route: Route,
                  ) -> torch.Tensor:
    """``residual + scale * branch`` for tokens ``(B, N, C)`` with ``scale (B,)`` per sample (in the branch's dtype, as
    timm's ``DropPath`` scales it), one operator; ``residual + branch`` without one."""
    if scale is None:
        return residual + branch
    scale = scale.to(branch.dtype)[:, None, None]
    if route.plain and type(branch) in _PLAIN and residual.dtype == branch.dtype:
        return _ScaledSum.apply(residual, branch, scale)
    return torch.addcmul(residual, branch, scale)


_PLAIN = (torch.Tensor, nn.Parameter)


def _takes_route(branch: nn.Module) -> bool:
    """Whether ``branch``'s forward takes the forward's route (its class says so, ``takes_route``; a forward put on an
    instance in place of its class's must take ``route=`` too)."""
    return getattr(type(branch), 'takes_route', False)


def _route_keywords(branch: nn.Module, route: Route) -> dict:
    """``route=`` for a branch whose forward takes the forward's route (:func:`_takes_route`), nothing for another."""
    return {'route': route} if _takes_route(branch) else {}


class Block(nn.Module):
    """A transformer block around any token-mixing ``attn(x, hw_shape)``: ``(B, N, C) -> (B, N, C)``.

    ``post_norm=True`` (SOFT stages): ``x = LN(x + attn(x)); x = LN(x + mlp(x))``, each sum and norm one fused kernel
    on the GPU route (:func:`~soft_mm.ops.functional.add_norm.add_layer_norm`), the branch's last bias (an
    ``output_bias`` of the branch) and stochastic depth's scale inside it.
    ``post_norm=False`` (softmax stage): ``x = x + attn(LN(x)); x = x + mlp(LN(x))``, the first sum and the second
    norm one fused kernel on the GPU route (the attention's last bias and its stochastic-depth scale inside it).
    Both residual branches go through stochastic depth with probability ``drop_path`` (``drop_prob``): in training each
    sample's branch scaled by ``mask / keep`` inside the sum it joins, the masks given by the caller (``drop_scales``:
    the stage draws its blocks' at once, :func:`drop_path_scales`) or drawn here. Where stochastic depth is the
    identity (``drop_path=0`` or eval mode) the sums are handed to the branches' last linear layers (``residual=``),
    which start them in their GEMMs in CPU inference; an attention module without ``adds_residual = True`` (one that
    takes no ``residual`` argument) and a branch that a forward hook watches get the plain sum, so hooks see the
    branch's own output.
    """

    def __init__(self, dim: int, attn: nn.Module, mlp_ratio: float = 4.0, post_norm: bool = False,
                 norm_eps: float = 1e-6, act_layer: type[nn.Module] = nn.GELU, drop_path: float = 0.0) -> None:
        super().__init__()
        self.post_norm = post_norm
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = attn
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = GeluMlp(dim, int(dim * mlp_ratio), act_layer=act_layer)
        self.drop_prob = float(drop_path)
        # (kept as a module for its repr and for code that looks for it; the forward applies the same scales itself)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def _attend(self, y: torch.Tensor, hw_shape: tuple[int, int], residual: torch.Tensor,
                scale: torch.Tensor | None, route: Route) -> torch.Tensor:
        """``residual + scale * attn(y)``."""
        keywords = _route_keywords(self.attn, route)
        if scale is None and self._sum_in_branch() and getattr(self.attn, 'adds_residual', False) \
                and not hooked(self.attn):
            return self.attn(y, hw_shape, residual=residual, **keywords)
        return _residual_sum(residual, self.attn(y, hw_shape, **keywords), scale, route)

    def _feed_forward(self, y: torch.Tensor, residual: torch.Tensor, scale: torch.Tensor | None, route: Route,
                      ) -> torch.Tensor:
        """``residual + scale * mlp(y)``."""
        keywords = _route_keywords(self.mlp, route)
        if scale is None and self._sum_in_branch() and not hooked(self.mlp):
            return self.mlp(y, residual=residual, **keywords)
        return _residual_sum(residual, self.mlp(y, **keywords), scale, route)

    def _sum_in_branch(self) -> bool:
        """Whether stochastic depth is the identity here (none, or eval mode), so a branch may add its residual."""
        return self.drop_prob == 0 or not self.training

    def _fuses_add_norm(self, x: torch.Tensor, route: Route) -> bool:
        """Whether the sums and norms run as :func:`~soft_mm.ops.functional.add_norm.add_layer_norm`'s fused kernels
        (the GPU route, eager; not where a hook watches a norm or a branch, the norms are not plain, or a branch's
        last layer cannot leave its bias to the kernel)."""
        return (type(self.norm1) is nn.LayerNorm and type(self.norm2) is nn.LayerNorm and route.gpu
                and fuses_add_norm(x, x, self.norm1.weight, route)
                and not hooked(self.norm1, self.norm2, self.attn, self.mlp)
                and _takes_route(self.attn) and self.attn.leaves_output_bias()
                and (not self.post_norm or (_takes_route(self.mlp) and self.mlp.leaves_output_bias())))

    def _drop_scales(self, x: torch.Tensor, drop_scales: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        """The two branches' per-sample scales of stochastic depth (None where it is the identity)."""
        if self._sum_in_branch():
            return None, None
        if drop_scales is None:
            keep = torch.full((2, 1), 1.0 - self.drop_prob, dtype=torch.float32, device=x.device)
            drop_scales = drop_path_scales(keep, x.shape[0], x.dtype)
        return drop_scales[0], drop_scales[1]

    def forward(self, x: torch.Tensor, hw_shape: tuple[int, int], drop_scales: torch.Tensor | None = None,
                route: Route | None = None) -> torch.Tensor:
        """``x (B, N, C) -> (B, N, C)``; ``drop_scales (2, B)``: the attention's and the MLP's stochastic-depth scales
        (:func:`drop_path_scales`), used in training where ``drop_prob > 0`` (None: drawn here); ``route``: the
        forward's :class:`~soft_mm.ops.route.Route` (None: the route of ``x``)."""
        route = decided(route, x)
        attn_scale, mlp_scale = self._drop_scales(x, drop_scales)
        if self._fuses_add_norm(x, route):
            if self.post_norm:
                # on the GPU route: each sum (the branch's last bias and its stochastic-depth scale in it), its
                # LayerNorm (float32 statistics) and the cast back to the stream's dtype in one kernel
                x = add_layer_norm(self.attn(x, hw_shape, output_bias=False, route=route), x, self.norm1.weight,
                                   self.norm1.bias, self.norm1.eps, branch_bias=self.attn.output_bias,
                                   branch_scale=attn_scale, route=route)
                return add_layer_norm(self.mlp(x, output_bias=False, route=route), x, self.norm2.weight,
                                      self.norm2.bias, self.norm2.eps, branch_bias=self.mlp.output_bias,
                                      branch_scale=mlp_scale, route=route)
            # pre-norm on the GPU route: the first sum (the projection's bias and the scale in it) and the second
            # norm in one kernel, which also writes the sum, the stream the MLP's branch joins
            x, y = add_layer_norm(self.attn(self.norm1(x), hw_shape, output_bias=False, route=route), x,
                                  self.norm2.weight, self.norm2.bias, self.norm2.eps, branch_bias=self.attn.output_bias,
                                  branch_scale=attn_scale, return_sum=True, route=route)
            return self._feed_forward(y, x, mlp_scale, route)
        if self.post_norm:
            # the stream keeps its dtype: CUDA autocast runs LayerNorm in float32 and returns float32, which would
            # turn the residual stream float32 (every linear then casts it back); a no-op elsewhere
            x = self.norm1(self._attend(x, hw_shape, x, attn_scale, route)).to(x.dtype)
            return self.norm2(self._feed_forward(x, x, mlp_scale, route)).to(x.dtype)
        x = self._attend(self.norm1(x), hw_shape, x, attn_scale, route)
        return self._feed_forward(self.norm2(x), x, mlp_scale, route)
