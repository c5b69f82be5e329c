"""Attention layers: SOFT (softmax-free, Nyström-approximated Gaussian kernel) and plain softmax attention."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import register_notrace_function
from torch import nn

from ..ops import soft_attention
from ..ops.functional.add_norm import fuses_add_norm, layer_norm_gelu
from ..ops.functional.head_conv import conv_add, fuses_conv_add, head_depthwise_conv
from ..ops.functional.pooling import adaptive_avg_pool2d_matmul, adaptive_avg_pool_tokens
from ..ops.functional.residual import hooked, linear_residual, plain_linear
from ..ops.functional.sdpa import softmax_attention
from ..ops.route import Route, decided
from .settings import AttentionSettings, attention_settings, is_int

# torch.fx (timm's feature_cls='fx', torchvision's create_feature_extractor, FX quantization): the SOFT op, the
# head conv and stage 4's attention choose their kernels from the device, dtype and sizes in Python, so a symbolic
# trace keeps each call as one node that the traced model runs eagerly (the same kernels as the module), as the helpers
# below that branch on sizes; registered both ways timm registers its own (torch.fx.wrap for plain symbolic_trace,
# timm's registry).
torch.fx.wrap('soft_attention')
torch.fx.wrap('head_depthwise_conv')
torch.fx.wrap('linear_residual')
torch.fx.wrap('softmax_attention')
register_notrace_function(soft_attention)
register_notrace_function(head_depthwise_conv)
register_notrace_function(linear_residual)
register_notrace_function(softmax_attention)


@torch.fx.wrap
@register_notrace_function  # reason: int() and a comparison of sizes
def _check_hw(x: torch.Tensor, hw_shape: tuple[int, int]) -> tuple[int, int]:
    if x.ndim != 3:
        raise ValueError(f'x must be (B, N, C), got shape {tuple(x.shape)}')
    # sizes stay symbolic under torch.export / torch.compile (int() would freeze them at the traced size), and traced
    # under torch.jit.trace (the legacy ONNX exporter records sizes read from a tensor's shape as graph values)
    # (no generator expression: dynamo of torch 2.8 and older cannot inline one)
    h, w = hw_shape
    if not torch.jit.is_tracing():
        h = h if isinstance(h, torch.SymInt) else int(h)
        w = w if isinstance(w, torch.SymInt) else int(w)
    if h * w != x.shape[1]:
        raise ValueError(f'hw_shape={tuple(hw_shape)} does not match the {x.shape[1]} tokens of x')
    return h, w


def _size_min(bound: int, size):
    """``min(bound, size)`` that keeps ``size`` symbolic: a ``SymInt`` under torch.export / torch.compile, a traced
    0-d tensor under torch.jit.trace (the legacy ONNX exporter), a proxy under FX's symbolic trace."""
    if isinstance(size, torch.Tensor):
        return size.clamp(max=bound)
    if isinstance(size, int):  # a static size (dynamo before torch 2.9 cannot trace sym_min of two ints)
        return min(bound, size)
    if isinstance(size, torch.fx.Proxy):  # FX: one sym_min node (torch < 2.3's sym_min would branch on the proxy)
        return size.tracer.create_proxy('call_function', torch.sym_min, (bound, size), {})
    return torch.sym_min(bound, size)


@torch.fx.wrap
@register_notrace_function  # reason: skips the pooling when the map already has the pooled size
def _pool_token_map(tokens: torch.Tensor, pooled_size: tuple[int, int], route: Route | None = None) -> torch.Tensor:
    """``(B, H, W, C) -> (B, H', W', C)`` adaptive average pooling to ``pooled_size`` (none when it is ``(H, W)``)."""
    if tuple(pooled_size) == tuple(tokens.shape[1:3]):
        return tokens
    return adaptive_avg_pool_tokens(tokens, pooled_size, route)


def _token_map(t: torch.Tensor, hw_shape: tuple[int, int]) -> torch.Tensor:
    """``(B, h, N, d) -> (B, H, W, h*d)`` with channel ``head * d + j``: a view of the token-major tensors of
    :meth:`SoftAttention.forward`."""
    b, h, _, d = t.shape
    return t.transpose(1, 2).reshape(b, *hw_shape, h * d)


def _channels_last_map(t: torch.Tensor, hw_shape: tuple[int, int]) -> torch.Tensor:
    """``(B, h, N, d) -> (B, h*d, H, W)`` in channels-last memory, built through NHWC (:func:`_token_map`) so that
    even a batch of one gets the strides that conv kernels recognise as channels-last (otherwise they copy to NCHW
    and back)."""
    return _token_map(t, hw_shape).permute(0, 3, 1, 2)


def _project(proj: nn.Module, out: torch.Tensor, residual: torch.Tensor | None, output_bias: bool = True,
             route: Route | None = None) -> torch.Tensor:
    """``proj(out)``, or ``residual + proj(out)`` with the sum started in the GEMM where it can be (a plain linear
    layer, :func:`plain_linear`); ``proj(out)`` without its bias where ``output_bias`` is False (the caller adds it,
    and the caller asks so of plain linear layers only)."""
    if not output_bias:
        return F.linear(out, proj.weight)
    if residual is None or not plain_linear(proj):
        return proj(out) if residual is None else residual + proj(out)
    return linear_residual(out, proj.weight, proj.bias, residual, route)


def fuses_projections(route: Route, *projections: nn.Module) -> bool:
    """Whether an attention layer runs its projections that read the same input as one GEMM: an eager call on the GPU
    route (``route.gpu``, where a launch saved is time saved), all of them plain linear layers (:func:`plain_linear`).
    The same operations whether or not :mod:`soft_mm.models.weight_cast` cast the weights (a checkpoint's
    recomputation, which runs outside the cast, must find the operations of the forward it repeats)."""
    return route.gpu and plain_linear(*projections)


def _setting(name: str) -> property:
    return property(lambda self: getattr(self.settings, name), doc=f'``self.settings.{name}`` (read-only)')


class SoftAttention(nn.Module):
    """SOFT attention over a feature map of ``hw_shape`` tokens: ``(B, N, C) -> (B, N, C)``.

    Queries and keys share one projection (so the Gaussian kernel is symmetric PSD), ``m`` landmark ("bottleneck")
    tokens are sampled from the queries, and the N x N kernel is replaced by its Nyström approximation
    ``K1 A^+ K1^T`` (``soft_mm.ops.soft_attention``), which costs O(N m d). A per-head depthwise conv on the values
    adds a local term.

    Landmarks (at most ``landmark_grid**2`` of them at any input size, so the cost stays linear in N):

    * ``'conv'``: the q map of each head is average-pooled to ``landmark_stride * g`` per side (g = min(grid,
      ceil(side / stride)); a no-op at 224x224 input, where every stage map is exactly ``stride * 7``), then a
      stride-``landmark_stride`` conv shared by the heads, LayerNorm and GELU. This is the authors' sampler, whose
      weights their checkpoints carry; the pooling bounds ``m`` at high resolution and covers the border tokens a
      bare strided conv would drop.
    * ``'avg'``: parameter-free adaptive average pooling of the q map to ``min(grid, H) x min(grid, W)``.

    Args:
        dim: channels C.
        num_heads: heads h; head dim d = C / h.
        landmark_stride: conv-mode stride r (8/4/2 in stages 1/2/3).
        v_conv_kernel: kernel of the per-head depthwise conv on v (odd); 0 disables the local term.
        soft_norm: SOFT-Norm, ``D^-1/2 A^+ D^-1/2`` with D the row sums of A.
        qkv_bias: bias of the q/k and v projections.
        settings: the attention settings (:class:`~soft_mm.models.settings.AttentionSettings`: landmark mode and
            grid, Newton–Schulz iterations, ridge and backward); keywords of it may be given directly instead
            (``SoftAttention(64, 2, landmark_mode='avg')``).
    """

    def __init__(self, dim: int, num_heads: int, landmark_stride: int = 8, v_conv_kernel: int = 3,
                 soft_norm: bool = False, qkv_bias: bool = True, settings: AttentionSettings | None = None,
                 **setting_overrides: Any) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim={dim} must be divisible by num_heads={num_heads}')
        if not is_int(landmark_stride, 1):
            raise ValueError(f'landmark_stride must be an int >= 1, got {landmark_stride!r}')
        if not (is_int(v_conv_kernel, 0) and (v_conv_kernel == 0 or v_conv_kernel % 2)):
            raise ValueError(f'v_conv_kernel must be 0 (off) or an odd int, got {v_conv_kernel!r}')
        self.settings = attention_settings(settings, **setting_overrides)
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.landmark_stride = landmark_stride
        self.soft_norm = soft_norm
        self.qk = nn.Linear(dim, dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        if self.landmark_mode == 'conv':
            self.landmark_conv = nn.Conv2d(self.head_dim, self.head_dim, landmark_stride, landmark_stride, bias=False)
            self.landmark_norm = nn.LayerNorm(self.head_dim)
        self.v_conv = (nn.Conv2d(num_heads, num_heads, v_conv_kernel, padding=v_conv_kernel // 2, groups=num_heads,
                                 bias=False) if v_conv_kernel else None)
        self.proj = nn.Linear(dim, dim)
        # a hook point with no parameters: forward hooks on it see the (B, h, m, d) landmarks of every forward
        # (soft_mm.models.attention_health records them there without changing any result)
        self.landmark_probe = nn.Identity()
        # the projections' weights scaled and cast once for this forward while soft_mm.models.weight_cast holds them:
        # 'qkv_weight' and 'qkv_bias' (the query/key projection's, scaled, and the values' as one (2C, C) matrix), or
        # 'query_weight' and 'query_bias' alone; empty otherwise
        self.cast_weights: dict[str, torch.Tensor] = {}

    # forward takes ``residual`` (the blocks hand it their sum; False on an instance: they add it themselves) and
    # ``route`` (the blocks hand it the forward's)
    adds_residual = True
    takes_route = True

    @property
    def output_bias(self) -> torch.Tensor | None:
        """The bias of the output projection, which ``forward(..., output_bias=False)`` leaves to the caller."""
        return self.proj.bias

    def leaves_output_bias(self) -> bool:
        """Whether ``forward(..., output_bias=False)`` may leave :attr:`output_bias` to the caller: a plain linear
        output projection (:func:`~soft_mm.ops.functional.residual.plain_linear`)."""
        return plain_linear(self.proj)

    landmark_mode = _setting('landmark_mode')
    landmark_grid = _setting('landmark_grid')
    newton_iters = _setting('newton_iters')
    newton_ridge = _setting('newton_ridge')
    newton_backward = _setting('newton_backward')

    # (the forward path reads self.settings directly: dynamo of torch 2.1 fails to guard the properties above)
    def landmark_shape(self, hw_shape: tuple[int, int]) -> tuple[int, int]:
        """Grid of landmarks used for an ``hw_shape`` map (m = product)."""
        # sym_min: a plain min() of symbolic sizes would freeze the branch taken at a traced size; the ceiling
        # division keeps its operands non-negative (ONNX's integer Div truncates, so -(-s // r) would become a floor)
        # (no generator expressions: dynamo of torch 2.8 and older cannot inline them)
        height, width = hw_shape
        if self.settings.landmark_mode == 'avg':
            return _size_min(self.settings.landmark_grid, height), _size_min(self.settings.landmark_grid, width)
        stride = self.landmark_stride
        return (_size_min(self.settings.landmark_grid, (height + stride - 1) // stride),
                _size_min(self.settings.landmark_grid, (width + stride - 1) // stride))

    def sample_landmarks(self, q: torch.Tensor, hw_shape: tuple[int, int], route: Route | None = None,
                         ) -> torch.Tensor:
        """``q (B, h, N, d) -> landmarks (B, h, m, d)`` with m = prod(:meth:`landmark_shape`); ``route``: the
        forward's (None: the route of ``q``)."""
        b, h, _, d = q.shape
        route = decided(route, q)
        grid = self.landmark_shape(hw_shape)
        pooled_size = grid if self.settings.landmark_mode == 'avg' else (grid[0] * self.landmark_stride,
                                                                grid[1] * self.landmark_stride)
        if route.exporting:
            # exporting a graph (ONNX / torch.export / jit trace): the pooling always runs (an identity at 224 in
            # conv mode), as two matmuls that keep the input size symbolic, so no size is frozen into the graph
            q_map = adaptive_avg_pool2d_matmul(q.reshape(b * h, *hw_shape, d).permute(0, 3, 1, 2), pooled_size)
            if self.settings.landmark_mode == 'avg':
                return q_map.flatten(2).transpose(1, 2).reshape(b, h, -1, d)
        else:
            # eager: all heads pooled at once on the token-major (B, H, W, h*d) map, a view of forward()'s q
            tokens = _pool_token_map(_token_map(q, hw_shape), pooled_size, route)
            if self.settings.landmark_mode == 'avg':
                return tokens.reshape(b, -1, h, d).transpose(1, 2)
            if type(self.landmark_conv) is nn.Conv2d and not hooked(self.landmark_conv):
                return self._landmarks_from_patches(tokens, grid, route)
            # (B*h, d, H', W') in NCHW memory: the conv is shared by the heads
            q_map = tokens.reshape(b, *pooled_size, h, d).permute(0, 3, 4, 1, 2).reshape(b * h, d, *pooled_size)
        landmarks = self.landmark_conv(q_map).flatten(2).transpose(1, 2)
        landmarks = F.gelu(self.landmark_norm(landmarks))
        return landmarks.reshape(b, h, -1, d)

    def _landmarks_from_patches(self, tokens: torch.Tensor, grid: tuple[int, int], route: Route) -> torch.Tensor:
        """Conv-mode landmarks from the pooled ``(B, g_h r, g_w r, h*d)`` token map: the stride-``r`` conv with an
        ``r x r`` kernel is one matmul of the ``r x r`` patches, each flattened in the conv weight's ``(d, r, r)``
        order, with the weight as a ``(d, d r r)`` matrix (one small copy of the patches instead of a copy to NCHW and
        a conv of a few output pixels), then LayerNorm and GELU. ``(B, h, m, d)``."""
        b, _, _, _ = tokens.shape
        h, d, r = self.num_heads, self.head_dim, self.landmark_stride
        grid_h, grid_w = grid
        patches = tokens.reshape(b, grid_h, r, grid_w, r, h, d).permute(0, 5, 1, 3, 6, 2, 4).reshape(-1, d * r * r)
        landmarks = F.linear(patches, self.landmark_conv.weight.reshape(d, d * r * r))
        norm = self.landmark_norm
        if type(norm) is nn.LayerNorm and not hooked(norm) and fuses_add_norm(landmarks, None, norm.weight, route):
            # the GPU route: LayerNorm and GELU in one kernel, float32 out (what the op computes its kernel in, and
            # what CUDA autocast's float32 LayerNorm would give)
            landmarks = layer_norm_gelu(landmarks, norm.weight, norm.bias, norm.eps, torch.float32, route)
        else:
            landmarks = F.gelu(norm(landmarks))
        return landmarks.reshape(b, h, grid_h * grid_w, d)

    def _heads(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, N, C) -> (B, h, N, d)``, a view."""
        b, n, _ = tokens.shape
        return tokens.reshape(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def _query_weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The query/key projection's weight and bias times ``d^-1/4`` (a plain linear layer's): cast once with the
        model's other weights where :mod:`soft_mm.models.weight_cast` holds them, else scaled here (the C x C weight,
        not the N x C queries)."""
        weight = self.cast_weights.get('query_weight')
        if weight is not None:
            return weight, self.cast_weights.get('query_bias')
        scale = self.head_dim ** -0.25
        return self.qk.weight * scale, None if self.qk.bias is None else self.qk.bias * scale

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        """``x (B, N, C) -> q (B, h, N, d)``, the shared query/key projection scaled by ``d^-1/4``: a head-split view
        of the token-major projection (the scale folded into a plain linear layer's weight; another module's output
        scaled)."""
        if type(self.qk) is not nn.Linear:
            return self._heads(self.qk(x) * self.head_dim ** -0.25)
        return self._heads(F.linear(x, *self._query_weights()))

    def _queries_and_values(self, x: torch.Tensor, route: Route) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q (B, h, N, d), v tokens (B, N, C))``: the scaled query/key projection and the value projection, one
        GEMM on the GPU route (:func:`fuses_projections`) with the two weights as one ``(2C, C)`` matrix (cast once
        that way where the cast holds them, else concatenated for the call), two GEMMs elsewhere."""
        if not fuses_projections(route, self.qk, self.v):
            return self.queries(x), self.v(x)
        weight, bias = self.cast_weights.get('qkv_weight'), self.cast_weights.get('qkv_bias')
        if weight is None:
            query_weight, query_bias = self._query_weights()
            weight = torch.cat([query_weight, self.v.weight])
            bias = None if query_bias is None else torch.cat([query_bias, self.v.bias])
        q_tokens, v_tokens = F.linear(x, weight, bias).split(x.shape[-1], dim=-1)
        return self._heads(q_tokens), v_tokens

    def forward(self, x: torch.Tensor, hw_shape: tuple[int, int], residual: torch.Tensor | None = None,
                output_bias: bool = True, route: Route | None = None) -> torch.Tensor:
        """``x (B, N, C)`` with N = H * W tokens in row-major order -> ``(B, N, C)``; ``residual + `` that where a
        residual ``(B, N, C)`` is given (the block's sum, started in the output projection's GEMM in CPU inference:
        :func:`~soft_mm.ops.functional.residual.linear_residual`); without the output projection's bias
        (:attr:`output_bias`) where ``output_bias`` is False; ``route``: the forward's (None: the route of ``x``)."""
        h, w = _check_hw(x, hw_shape)  # (unpacked: a traced call's result is one node, its items two more)
        hw_shape = (h, w)
        b, n, c = x.shape
        route = decided(route, x)
        # q = k, scaled by d^-1/4 so that exp(-|q_i - k_j|^2 / 2) = exp(-|x_i - x_j|^2 / (2 sqrt(d))). q and v are
        # head-split views of the token-major projections (no copy); the tiled attention keeps that layout, so its
        # output, the value conv (a channels-last map) and the output projection all read each other in place.
        q, v_tokens = self._queries_and_values(x, route)
        v = self._heads(v_tokens)
        landmarks = self.landmark_probe(self.sample_landmarks(q, hw_shape, route))
        out = soft_attention(q, landmarks, v, num_iters=self.settings.newton_iters, soft_norm=self.soft_norm,
                             ridge=self.settings.newton_ridge, backward=self.settings.newton_backward, route=route)
        if self.v_conv is not None and fuses_conv_add(route, self.v_conv, v, out):
            # the GPU route: the attention output plus the value conv in one kernel that reads both head-split
            # tensors in place and writes the token-major sum the output projection reads
            return _project(self.proj, conv_add(v, out, self.v_conv.weight, hw_shape, route), residual, output_bias,
                            route)
        out = out.transpose(1, 2).reshape(b, n, c)  # token-major (a view where the backend kept v's layout)
        if self.v_conv is not None:
            # one k x k filter per head, shared by that head's d channels: a depthwise conv over the h*d channels of
            # v, whose (B, N, h, d) memory is already a channels-last (B, h*d, H, W) map (no copy); the result is
            # token-major like the attention output, so the sum and the output projection copy nothing
            if route.exporting:
                # an exported graph copies every layout change: the token matrix as an NHWC -> NCHW permute and
                # back (4-d permutes, which onnxruntime folds into the NCHWc reorders around its conv, where it
                # kept the (N, C) <-> (C, N) transposes), and the filters repeated over their heads' channels
                # (contiguous NCHW: a channels-last view would make torch.export guard on the batch size)
                v_map = v_tokens.reshape(b, *hw_shape, c).permute(0, 3, 1, 2).contiguous()
                weight = self.v_conv.weight.repeat_interleave(self.head_dim, dim=0)  # (h*d, 1, k, k)
                local = F.conv2d(v_map, weight, padding=self.v_conv.padding, groups=c).permute(0, 2, 3, 1)
                local = local.reshape(b, n, c)
            else:
                local = head_depthwise_conv(_channels_last_map(v, hw_shape), self.v_conv.weight, self.head_dim,
                                            route)
                local = local.permute(0, 2, 3, 1).reshape(b, n, c)
            out = out + local
        return _project(self.proj, out, residual, output_bias, route)

    def extra_repr(self) -> str:
        return (f'heads={self.num_heads}, landmarks={self.landmark_mode}(grid={self.landmark_grid}, '
                f'stride={self.landmark_stride}), newton_iters={self.newton_iters}, ridge={self.newton_ridge}, '
                f'soft_norm={self.soft_norm}')


class SoftmaxAttention(nn.Module):
    """Multi-head softmax attention (stage 4): ``(B, N, C) -> (B, N, C)`` via ``scaled_dot_product_attention``."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim={dim} must be divisible by num_heads={num_heads}')
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

        # the q and kv projections' weights cast once for this forward as one (3C, C) matrix, 'qkv_weight' and
        # 'qkv_bias', while soft_mm.models.weight_cast holds them; empty otherwise
        self.cast_weights: dict[str, torch.Tensor] = {}

    adds_residual = takes_route = True  # as SoftAttention's

    @property
    def output_bias(self) -> torch.Tensor | None:
        """The bias of the output projection (as :attr:`SoftAttention.output_bias`)."""
        return self.proj.bias

    leaves_output_bias = SoftAttention.leaves_output_bias

    def _queries_keys_values(self, x: torch.Tensor, route: Route) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``q, k, v (B, h, N, d)``: one GEMM on the GPU route (:func:`fuses_projections`), two elsewhere."""
        b, n, _ = x.shape
        if not fuses_projections(route, self.q, self.kv):
            q = self.q(x).reshape(b, n, self.num_heads, -1).transpose(1, 2)
            k, v = self.kv(x).reshape(b, n, 2, self.num_heads, -1).permute(2, 0, 3, 1, 4)
            return q, k, v
        weight, bias = self.cast_weights.get('qkv_weight'), self.cast_weights.get('qkv_bias')
        if weight is None:
            weight = torch.cat([self.q.weight, self.kv.weight])
            bias = None if self.q.bias is None else torch.cat([self.q.bias, self.kv.bias])
        return F.linear(x, weight, bias).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)

    def forward(self, x: torch.Tensor, hw_shape: tuple[int, int] | None = None,
                residual: torch.Tensor | None = None, output_bias: bool = True, route: Route | None = None,
                ) -> torch.Tensor:
        """``x (B, N, C) -> (B, N, C)``, plus ``residual`` where one is given (as :meth:`SoftAttention.forward`)."""
        b, n, c = x.shape
        route = decided(route, x)
        q, k, v = self._queries_keys_values(x, route)
        # the default scale, 1 / sqrt(head_dim), left implicit: mmdeploy 1.3.1's ONNX rewrite of
        # F.scaled_dot_product_attention (what an export calls) divides by a given `scale` where PyTorch multiplies
        # by it (a head_dim-times sharper softmax in the exported graph)
        # (bfloat16 operands attended in float32 in eager CPU inference: soft_mm.ops.functional.sdpa)
        out = softmax_attention(q, k, v, route)
        return _project(self.proj, out.transpose(1, 2).reshape(b, n, c), residual, output_bias, route)
