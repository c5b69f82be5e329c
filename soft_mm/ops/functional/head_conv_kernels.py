"""The Triton kernels of the value conv on the GPU route (:func:`soft_mm.ops.functional.head_conv.conv_add`; loaded
through :func:`soft_mm.ops.triton_route.load_kernels`, under the current ``TRITON_INTERPRET`` setting).

The tensors are token-major maps of one image row after another, ``(B, h, N, d)`` with ``N = H * W`` tokens, each
given as ``(pointer, (its four strides))`` so that head-split views are read in place; ``w`` is the ``(h, 1, K, K)``
filters, one per head, contiguous. With ``P = K // 2`` (zero padding, stride 1)::

    y[b, h, n, j] = add[b, h, n, j] + sum_{ty, tx} w[h, ty, tx] * x[b, h, n + (ty - P) * W + (tx - P), j]

for the taps whose pixel lies inside the map.

* :func:`head_conv_fwd_kernel_y` — ``y`` of ``BLOCK`` tokens of one (sample, head) a program, float32 sums, stored in
  ``y``'s dtype; with ``FLIP`` the filters turned by 180 degrees (the conv's input gradient, the output gradient as
  ``x``), without ``HAS_ADD`` no ``add``;
* :func:`head_conv_bwd_kernel_dw` — the filters' gradient ``sum x[shifted] * dy`` over ``BLOCK`` tokens and the head's
  channels, one float32 partial sum per tap a program (summed in torch afterwards).
"""
import triton
import triton.language as tl

from ..triton_interpreter import INTERPRET

__all__ = ['head_conv_bwd_kernel_dw', 'head_conv_fwd_kernel_y', 'program_tile', 'tile_offsets']


@triton.jit
def program_tile(sizes, BLOCK: tl.constexpr, DP: tl.constexpr):
    """The program's ``(b, head, tokens, rows, columns, tok_ok, cols, col_ok)``: its sample and head, its ``BLOCK``
    tokens with their pixels' rows and columns (64-bit under triton's interpreter, whose overflow checks of every
    narrower add would cost the tap loop half its time; 32-bit compiled, 44 registers fewer on sm_90) and which are in
    the map, its ``DP`` channels and which are the head's."""
    H, W, heads, D = sizes
    group = tl.program_id(1)
    tokens = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    rows = tokens // W
    if INTERPRET:
        rows = rows.to(tl.int64)
    cols = tl.arange(0, DP)
    return group // heads, group % heads, tokens, rows, tokens - rows * W, tokens < H * W, cols, cols < D


@triton.jit
def tile_offsets(strides, b, head, tokens, cols):
    """The ``(BLOCK, DP)`` offsets of a program's tile in a ``(B, h, N, d)`` tensor of these ``strides``."""
    return b.to(tl.int64) * strides[0] + head * strides[1] + tokens[:, None] * strides[2] + cols[None, :] * strides[3]


@triton.jit
def head_conv_fwd_kernel_y(x, add, w_ptr, y, sizes, BLOCK: tl.constexpr, DP: tl.constexpr, K: tl.constexpr,
                           FLIP: tl.constexpr, HAS_ADD: tl.constexpr):
    """``y = add + conv(x)`` (see the module docstring); grid ``(cdiv(N, BLOCK), B * h)``; ``sizes = (H, W, h, D)``.
    (No jitted helper is called in the loop over the taps: triton's interpreter patches its builtins at every such
    call, 0.2 ms each.)"""
    H, W = sizes[0], sizes[1]
    b, head, tokens, rows, columns, tok_ok, cols, col_ok = program_tile(sizes, BLOCK, DP)
    # a tap's pixel is the token's plus dy rows and dx columns: each tap moves the tile's pointers by a scalar
    tile_ptrs = x[0] + tile_offsets(x[1], b, head, tokens, cols)
    acc = tl.zeros((BLOCK, DP), tl.float32)
    for ty in range(K):  # (loops, not unrolled: 81 taps of a 9x9 filter)
        sy = rows + (ty - K // 2)
        row_ok = tok_ok & (sy >= 0) & (sy < H)
        for tx in range(K):
            if FLIP:
                tap = tl.load(w_ptr + head * K * K + (K * K - 1 - ty * K - tx)).to(tl.float32)
            else:
                tap = tl.load(w_ptr + head * K * K + ty * K + tx).to(tl.float32)
            sx = columns + (tx - K // 2)
            ok = row_ok & (sx >= 0) & (sx < W)
            shift = ((ty - K // 2) * W + (tx - K // 2)) * x[1][2]
            tile = tl.load(tile_ptrs + shift, mask=ok[:, None] & col_ok[None, :], other=0.0)
            acc += tap * tile.to(tl.float32)
    mask = tok_ok[:, None] & col_ok[None, :]
    if HAS_ADD:
        acc += tl.load(add[0] + tile_offsets(add[1], b, head, tokens, cols), mask=mask, other=0.0).to(tl.float32)
    y_ptr = y[0]
    tl.store(y_ptr + tile_offsets(y[1], b, head, tokens, cols), acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def head_conv_bwd_kernel_dw(x, dy, partials_ptr, sizes, BLOCK: tl.constexpr, DP: tl.constexpr, K: tl.constexpr):
    """The program's share of ``dw[h, ty, tx] = sum_{n, j} x[b, h, n + shift, j] * dy[b, h, n, j]``: ``K * K``
    float32 partial sums at ``partials_ptr[(pid_n * B * h + pid_g) * K * K + tap]``; grid as the forward's."""
    H, W = sizes[0], sizes[1]
    b, head, tokens, rows, columns, tok_ok, cols, col_ok = program_tile(sizes, BLOCK, DP)
    grads = tl.load(dy[0] + tile_offsets(dy[1], b, head, tokens, cols), mask=tok_ok[:, None] & col_ok[None, :],
                    other=0.0).to(tl.float32)
    tile_ptrs = x[0] + tile_offsets(x[1], b, head, tokens, cols)
    out = partials_ptr + (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * K * K
    for ty in range(K):
        sy = rows + (ty - K // 2)
        row_ok = tok_ok & (sy >= 0) & (sy < H)
        for tx in range(K):
            sx = columns + (tx - K // 2)
            ok = row_ok & (sx >= 0) & (sx < W)
            shift = ((ty - K // 2) * W + (tx - K // 2)) * x[1][2]
            tile = tl.load(tile_ptrs + shift, mask=ok[:, None] & col_ok[None, :], other=0.0)
            tl.store(out + ty * K + tx, tl.sum(tl.sum(tile.to(tl.float32) * grads, axis=1), axis=0))
