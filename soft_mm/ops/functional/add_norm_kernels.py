"""The Triton kernels of :mod:`soft_mm.ops.functional.add_norm` (loaded through
:func:`soft_mm.ops.triton_route.load_kernels`, under the current ``TRITON_INTERPRET`` setting).

* :func:`add_norm_fwd_kernel_y` — ``y = LayerNorm(residual + branch)`` of ``ROWS`` rows a program, the sum and the
  statistics in float32, ``y`` stored in its tensor's dtype, each row's mean and ``1 / std`` kept for the backward;
* :func:`add_norm_bwd_kernel_dx` — the gradient of the sum (the same for both addends) of a share of the rows, and the
  program's partial sums of the weight's and the bias's gradients (summed in torch afterwards).

Rows are ``(R, C)`` contiguous (a token matrix); ``CP`` is C padded to a power of two, masked.
"""
import triton
import triton.language as tl

__all__ = ['add_norm_bwd_block', 'add_norm_bwd_kernel_dx', 'add_norm_fwd_kernel_y', 'load_rows']


@triton.jit
def load_rows(ptr, rows, row_ok, C, CP: tl.constexpr):
    """The ``(ROWS, CP)`` float32 tile of ``rows`` of a contiguous ``(R, C)`` matrix, zero outside."""
    cols = tl.arange(0, CP)
    mask = row_ok[:, None] & (cols[None, :] < C)
    return tl.where(mask, tl.load(ptr + rows[:, None] * C + cols[None, :], mask=mask).to(tl.float32), 0.0)


@triton.jit
def add_norm_fwd_kernel_y(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, R, C, eps, ROWS: tl.constexpr,
                          CP: tl.constexpr):
    """``y = (s - mean(s)) / sqrt(var(s) + eps) * w + b`` with ``s = residual + branch`` (``r_ptr``, ``x_ptr``), per
    row; grid ``(cdiv(R, ROWS),)``. Writes ``y`` (``y_ptr``, its own dtype), the row means and ``1 / std`` (float32)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < R
    cols = tl.arange(0, CP)
    col_ok = cols < C
    s = load_rows(x_ptr, rows, row_ok, C, CP) + load_rows(r_ptr, rows, row_ok, C, CP)
    mean = tl.sum(s, axis=1) / C
    centred = tl.where(col_ok[None, :], s - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / C + eps)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    y = centred * rstd[:, None] * w[None, :] + b[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    tl.store(y_ptr + rows[:, None] * C + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + rows, mean, mask=row_ok)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def add_norm_bwd_block(dw, db, w, dy_ptr, x_ptr, r_ptr, mean_ptr, rstd_ptr, dx_ptr, block, R, C, ROWS: tl.constexpr,
                       CP: tl.constexpr):
    """Rows ``block * ROWS ..`` of :func:`add_norm_bwd_kernel_dx`: stores their ``ds``, returns ``(dw, db)`` with
    their share added."""
    rows = block * ROWS + tl.arange(0, ROWS)
    row_ok = rows < R
    cols = tl.arange(0, CP)
    mask = row_ok[:, None] & (cols[None, :] < C)
    mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
    s = load_rows(x_ptr, rows, row_ok, C, CP) + load_rows(r_ptr, rows, row_ok, C, CP)
    xh = tl.where(mask, (s - mean[:, None]) * rstd[:, None], 0.0)
    dy = load_rows(dy_ptr, rows, row_ok, C, CP)
    g = dy * w[None, :]
    ds = (g - xh * (tl.sum(g * xh, axis=1) / C)[:, None] - (tl.sum(g, axis=1) / C)[:, None]) * rstd[:, None]
    tl.store(dx_ptr + rows[:, None] * C + cols[None, :], ds.to(dx_ptr.dtype.element_ty), mask=mask)
    return dw + tl.sum(dy * xh, axis=0), db + tl.sum(dy, axis=0)


@triton.jit
def add_norm_bwd_kernel_dx(dy_ptr, x_ptr, r_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dwb_ptr, R, C, blocks_per_program,
                           ROWS: tl.constexpr, CP: tl.constexpr, INTERPRET: tl.constexpr,
                           INTERPRETED_BLOCKS: tl.constexpr):
    """The backward of :func:`add_norm_fwd_kernel_y`; grid ``(programs,)``, program ``p`` taking the row blocks
    ``p * blocks_per_program ..`` (``ROWS`` rows each, :func:`add_norm_bwd_block`). Per row, with ``xh = (s - mean) *
    rstd`` rebuilt from the addends and ``g = w * dy``: ``ds = (g - xh * mean(g * xh) - mean(g)) * rstd``, stored to
    ``dx_ptr`` (the gradient of both addends, its own dtype). The program's sums ``sum(dy * xh)`` and ``sum(dy)`` over
    its rows, float32, go to ``dwb_ptr[p, 0]`` and ``dwb_ptr[p, 1]`` (``(programs, 2, CP)``). Under the interpreter
    the loop's bound is ``INTERPRETED_BLOCKS``, ``blocks_per_program`` as a constexpr (0 when compiled; why:
    ``soft_mm/ops/soft/backends/triton/kernels.py``)."""
    p = tl.program_id(0)
    cols = tl.arange(0, CP)
    w = tl.load(w_ptr + cols, mask=cols < C, other=0.0).to(tl.float32)
    dw = tl.zeros((CP,), dtype=tl.float32)
    db = tl.zeros((CP,), dtype=tl.float32)
    block = p * blocks_per_program
    for _ in range(0, INTERPRETED_BLOCKS if INTERPRET else blocks_per_program):
        dw, db = add_norm_bwd_block(dw, db, w, dy_ptr, x_ptr, r_ptr, mean_ptr, rstd_ptr, dx_ptr, block, R, C, ROWS, CP)
        block += 1
    tl.store(dwb_ptr + (p * 2) * CP + cols, dw)
    tl.store(dwb_ptr + (p * 2 + 1) * CP + cols, db)
