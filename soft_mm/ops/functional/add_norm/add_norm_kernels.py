"""The Triton kernels of :mod:`.add_norm_launch` (loaded through :func:`soft_mm.ops.triton_route.load_kernels`, under
the current ``TRITON_INTERPRET`` setting).

Per row of a ``(R, C)`` token matrix, with the sum's addends ``addends = (x_ptr, r_ptr, bb_ptr, sc_ptr)``: ``x`` the
branch, ``r`` the residual, ``bb`` the branch's bias and ``sc`` the per-sample scale of stochastic depth (one float32
per sample of ``T`` rows), the last three optional (the constexprs ``HAS_RESIDUAL``, ``HAS_BRANCH_BIAS``,
``HAS_SCALE``), and the norm's affine parameters ``norm = (w_ptr, b_ptr)``::

    s = r + sc * (x + bb)          y = LayerNorm(s) * w + b          (then GELU(y) where GELU is set)

* :func:`add_norm_fwd_kernel_y` — ``y`` of ``ROWS`` rows a program, the sum and the statistics in float32, ``y``
  stored in its tensor's dtype, each row's mean and ``1 / std`` kept for the backward (``stats_ptr``, ``(2, R)``), and
  where ``STORE_SUM`` the sum ``s`` itself (``sum_ptr``: a pre-norm block's residual stream after the sum);
* :func:`add_norm_bwd_kernel_dx` — the gradient of ``s`` (``ds_ptr``: the residual's; plus the gradient that ``s``
  itself received, ``dsum_ptr``, where ``HAS_DSUM``), and where a scale is given the branch's, ``sc * ds``
  (``dx_ptr``; without one it is ``ds`` itself), of a share of the rows, and the program's partial sums of the
  gradients of ``w``, ``b`` and ``bb`` (summed in torch afterwards).

Rows are contiguous; ``sizes = (R, C, T)``; ``CP`` is C padded to a power of two, masked. The GELU is the exact (erf)
form. The backward's loop over its row blocks is one ``for`` loop over
:func:`~soft_mm.ops.triton_interpreter.loop_bound` of its run-time bound.
"""
import triton
import triton.language as tl

from ...triton_interpreter import loop_bound

__all__ = ['add_norm_bwd_block', 'add_norm_bwd_kernel_dx', 'add_norm_fwd_kernel_y', 'gelu_and_grad', 'load_rows',
           'summed_rows']

_SQRT_HALF = tl.constexpr(0.7071067811865476)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)


@triton.jit
def load_rows(ptr, rows, row_ok, C, CP: tl.constexpr):
    """The ``(ROWS, CP)`` float32 tile of ``rows`` of a contiguous ``(R, C)`` matrix, zero outside."""
    cols = tl.arange(0, CP)
    mask = row_ok[:, None] & (cols[None, :] < C)
    return tl.where(mask, tl.load(ptr + rows[:, None] * C + cols[None, :], mask=mask).to(tl.float32), 0.0)


@triton.jit
def summed_rows(addends, rows, row_ok, C, T, ROWS: tl.constexpr, CP: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                HAS_BRANCH_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr):
    """``(s, scale)``: the float32 ``(ROWS, CP)`` tile of ``s = r + sc * (x + bb)`` (zero outside) and each row's
    scale ``(ROWS,)`` (1 without one)."""
    x_ptr, r_ptr, bb_ptr, sc_ptr = addends
    cols = tl.arange(0, CP)
    col_ok = cols < C
    s = load_rows(x_ptr, rows, row_ok, C, CP)
    if HAS_BRANCH_BIAS:
        bb = tl.load(bb_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        s = tl.where(row_ok[:, None] & col_ok[None, :], s + bb[None, :], 0.0)
    scale = tl.full((ROWS,), 1.0, tl.float32)
    if HAS_SCALE:
        scale = tl.load(sc_ptr + rows // T, mask=row_ok, other=0.0).to(tl.float32)
        s = s * scale[:, None]
    if HAS_RESIDUAL:
        s += load_rows(r_ptr, rows, row_ok, C, CP)
    return s, scale


@triton.jit
def gelu_and_grad(y):
    """``(GELU(y), GELU'(y))``, the exact (erf) GELU, float32."""
    cdf = 0.5 * (1.0 + tl.math.erf(y * _SQRT_HALF))
    return y * cdf, cdf + y * _INV_SQRT_2PI * tl.exp(-0.5 * y * y)


@triton.jit
def add_norm_fwd_kernel_y(addends, norm, y_ptr, sum_ptr, stats_ptr, sizes, eps, ROWS: tl.constexpr, CP: tl.constexpr,
                          HAS_RESIDUAL: tl.constexpr, HAS_BRANCH_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr,
                          GELU: tl.constexpr, STORE_SUM: tl.constexpr):
    """``y = (s - mean(s)) / sqrt(var(s) + eps) * w + b`` per row (then ``GELU(y)`` where ``GELU``), ``s`` as the
    module docstring gives it; grid ``(cdiv(R, ROWS),)``. Writes ``y`` (``y_ptr``, its own dtype), the row means
    (``stats_ptr[0]``) and ``1 / std`` (``stats_ptr[1]``), float32, and ``s`` (``sum_ptr``) where ``STORE_SUM``."""
    R, C, T = sizes
    w_ptr, b_ptr = norm
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < R
    cols = tl.arange(0, CP)
    col_ok = cols < C
    s, _ = summed_rows(addends, rows, row_ok, C, T, ROWS, CP, HAS_RESIDUAL, HAS_BRANCH_BIAS, HAS_SCALE)
    mean = tl.sum(s, axis=1) / C
    centred = tl.where(col_ok[None, :], s - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / C + eps)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    y = centred * rstd[:, None] * w[None, :] + b[None, :]
    if GELU:
        y, _ = gelu_and_grad(y)
    mask = row_ok[:, None] & col_ok[None, :]
    tl.store(y_ptr + rows[:, None] * C + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    if STORE_SUM:
        tl.store(sum_ptr + rows[:, None] * C + cols[None, :], s.to(sum_ptr.dtype.element_ty), mask=mask)
    tl.store(stats_ptr + rows, mean, mask=row_ok)
    tl.store(stats_ptr + R + rows, rstd, mask=row_ok)


@triton.jit
def add_norm_bwd_block(sums, wb, grads_in, grads_out, addends, stats_ptr, block, sizes, ROWS: tl.constexpr,
                       CP: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_BRANCH_BIAS: tl.constexpr,
                       HAS_SCALE: tl.constexpr, GELU: tl.constexpr, HAS_DSUM: tl.constexpr):
    """Rows ``block * ROWS ..`` of :func:`add_norm_bwd_kernel_dx`: stores their ``ds`` (and ``dx``), returns
    ``sums = (dw, db, dbb)`` with their share added; ``wb = (w, b)``, the norm's float32 ``(CP,)`` tiles; the other
    arguments as the kernel takes them."""
    dw, db, dbb = sums
    w, b = wb
    dy_ptr, dsum_ptr = grads_in
    ds_ptr, dx_ptr = grads_out
    R, C, T = sizes
    rows = block * ROWS + tl.arange(0, ROWS)
    row_ok = rows < R
    cols = tl.arange(0, CP)
    mask = row_ok[:, None] & (cols[None, :] < C)
    mean = tl.load(stats_ptr + rows, mask=row_ok, other=0.0)
    rstd = tl.load(stats_ptr + R + rows, mask=row_ok, other=0.0)
    s, scale = summed_rows(addends, rows, row_ok, C, T, ROWS, CP, HAS_RESIDUAL, HAS_BRANCH_BIAS, HAS_SCALE)
    xh = tl.where(mask, (s - mean[:, None]) * rstd[:, None], 0.0)
    dy = load_rows(dy_ptr, rows, row_ok, C, CP)
    if GELU:  # the gradient through the GELU of the normalised row, rebuilt from xh
        _, slope = gelu_and_grad(xh * w[None, :] + b[None, :])
        dy = tl.where(mask, dy * slope, 0.0)
    g = dy * w[None, :]
    ds = (g - xh * (tl.sum(g * xh, axis=1) / C)[:, None] - (tl.sum(g, axis=1) / C)[:, None]) * rstd[:, None]
    if HAS_DSUM:
        ds += load_rows(dsum_ptr, rows, row_ok, C, CP)
    offsets = rows[:, None] * C + cols[None, :]
    tl.store(ds_ptr + offsets, ds.to(ds_ptr.dtype.element_ty), mask=mask)
    dx = ds
    if HAS_SCALE:
        dx = ds * scale[:, None]
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    if HAS_BRANCH_BIAS:
        dbb += tl.sum(dx, axis=0)
    return dw + tl.sum(dy * xh, axis=0), db + tl.sum(dy, axis=0), dbb


@triton.jit
def add_norm_bwd_kernel_dx(grads_in, grads_out, addends, norm, stats_ptr, part_ptr, sizes, blocks_per_program,
                           ROWS: tl.constexpr, CP: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                           HAS_BRANCH_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, GELU: tl.constexpr,
                           HAS_DSUM: tl.constexpr):
    """The backward of :func:`add_norm_fwd_kernel_y`; grid ``(programs,)``, program ``p`` taking the row blocks
    ``p * blocks_per_program ..`` (``ROWS`` rows each, :func:`add_norm_bwd_block`). Per row, with ``xh = (s - mean) *
    rstd`` rebuilt from the addends, ``dy`` passed through the GELU's slope where ``GELU``, and ``g = w * dy``
    (``grads_in = (dy_ptr, dsum_ptr)``: the gradients the norm and the sum received; ``grads_out = (ds_ptr,
    dx_ptr)``: those written):
    ``ds = (g - xh * mean(g * xh) - mean(g)) * rstd`` (plus ``dsum_ptr``'s rows where ``HAS_DSUM``), stored to
    ``ds_ptr`` (the gradient of ``s``, its own dtype), and ``sc * ds`` to ``dx_ptr`` where ``HAS_SCALE``. The
    program's float32 sums over its rows of ``dy * xh``, ``dy`` and the branch's gradient go to ``part_ptr[p, 0]``,
    ``[p, 1]`` and ``[p, 2]`` (``(programs, 3, CP)``)."""
    C = sizes[1]
    w_ptr, b_ptr = norm
    p = tl.program_id(0)
    cols = tl.arange(0, CP)
    w = tl.load(w_ptr + cols, mask=cols < C, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=cols < C, other=0.0).to(tl.float32)
    dw = tl.zeros((CP,), dtype=tl.float32)
    db = tl.zeros((CP,), dtype=tl.float32)
    dbb = tl.zeros((CP,), dtype=tl.float32)
    block = p * blocks_per_program
    for _ in range(0, loop_bound(blocks_per_program)):
        dw, db, dbb = add_norm_bwd_block((dw, db, dbb), (w, b), grads_in, grads_out, addends, stats_ptr, block, sizes,
                                         ROWS, CP, HAS_RESIDUAL, HAS_BRANCH_BIAS, HAS_SCALE, GELU, HAS_DSUM)
        block += 1
    tl.store(part_ptr + (p * 3) * CP + cols, dw)
    tl.store(part_ptr + (p * 3 + 1) * CP + cols, db)
    tl.store(part_ptr + (p * 3 + 2) * CP + cols, dbb)
