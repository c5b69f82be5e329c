"""The PyTorch form of the fused add + LayerNorm (:mod:`.add_norm_launch`): what its kernels are checked against, and
what :func:`~.add_norm_launch.add_layer_norm` runs wherever they do not (CPU, a graph being traced or compiled)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ['add_layer_norm_reference']


def add_layer_norm_reference(branch: Tensor, residual: Tensor | None, weight: Tensor | None, bias: Tensor | None,
                             eps: float, out_dtype: torch.dtype, branch_bias: Tensor | None = None,
                             branch_scale: Tensor | None = None, gelu: bool = False, return_sum: bool = False,
                             ) -> Tensor | tuple[Tensor, Tensor]:
    """``F.layer_norm(s, (C,), weight, bias, eps).to(out_dtype)`` of ``s = residual + branch_scale * (branch +
    branch_bias)`` (a GELU after the norm where ``gelu``; ``(s, norm)`` where ``return_sum``), in the addends' dtype:
    ``branch`` and ``residual`` ``(B, ..., C)``, ``weight``, ``bias`` and ``branch_bias`` ``(C,)``, ``branch_scale``
    ``(B,)`` (the arguments of :func:`~.add_norm_launch.add_layer_norm`)."""
    s = branch if branch_bias is None else branch + branch_bias
    if branch_scale is not None:  # (in the branch's dtype, as timm's DropPath scales it)
        scale = branch_scale.to(s.dtype).reshape(-1, *([1] * (s.ndim - 1)))
        s = s * scale if residual is None else torch.addcmul(residual, s, scale)
    elif residual is not None:
        s = residual + s
    y = F.layer_norm(s, s.shape[-1:], weight, bias, eps)
    y = (F.gelu(y) if gelu else y).to(out_dtype)
    return (s, y) if return_sum else y
