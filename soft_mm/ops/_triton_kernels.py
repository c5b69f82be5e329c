"""The Triton kernels of :mod:`soft_mm.ops.triton_nystrom` (imported on first use: ``TRITON_INTERPRET`` is read when
a kernel is decorated, so this module is re-imported when that setting changes).

``INTERPRET`` (a constexpr, True only under the interpreter) picks the interpreter's forms: bfloat16 rounding emulated
in float32, and the loops with a bound known only at run time written as ``while`` loops. triton 3.6's interpreter
turns such a bound into a Python int with ``int()`` of a one-element numpy array, which numpy >= 2.4 refuses, while
its ``while`` condition takes ``bool()`` of it; a GPU compiles the ``for`` loops (which triton can pipeline)."""
import triton
import triton.language as tl

__all__ = ['backward', 'backward_block', 'k_times', 'kernel_block', 'kt_x', 'kt_x_block', 'load_f32',
           'newton_schulz_step', 'nystrom_middle', 'pdot', 'pdot_scaled', 'pow2_above', 'round_bf16']



@triton.jit
def round_bf16(x):
    """float32 -> the nearest bfloat16 value (ties to even), kept in float32: the interpreter's own cast to bfloat16
    is wrong (numpy has no bfloat16), so interpreted kernels emulate the operands' rounding this way."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)



@triton.jit
def load_f32(ptrs, mask):
    """A masked load as float32 with zeros outside the mask (no ``other=``: the interpreter converts it to the tensor's
    dtype wrongly for bfloat16)."""
    return tl.where(mask, tl.load(ptrs, mask=mask).to(tl.float32), 0.0)



@triton.jit
def pow2_above(x):
    """The smallest power of two >= max |x| over the tile (1 for a zero tile): ``x / it`` lies in [-1, 1]."""
    top = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
    return tl.where(top > 0.0, tl.exp2(tl.ceil(tl.log2(top))), 1.0)


@triton.jit
def pdot(a, b, LOW: tl.constexpr, INTERPRET: tl.constexpr):
    """``a @ b`` of float32 tiles with float32 accumulation, the operands rounded to the products' dtype first:
    ``LOW`` 0 float32 (IEEE, no TF32), 1 bfloat16, 2 float16 (on a GPU tensor-core products; under the interpreter
    the same rounded values multiplied in float32). For float16, ``b`` (an m×d factor, which the inverse can make
    large) is scaled into [-1, 1] by a power of two and the product scaled back, so it stays in float16's range;
    ``a`` must be representable (the kernel block, in [0, 1], or float16 values)."""
    return pdot_scaled(a, b, pow2_above(b) if LOW == 2 else 1.0, LOW, INTERPRET)


@triton.jit
def pdot_scaled(a, b, scale, LOW: tl.constexpr, INTERPRET: tl.constexpr):
    """:func:`pdot` with float16's power-of-two ``scale`` of ``b`` given (``pow2_above`` of ``b`` or of a tile with
    the same largest magnitude, e.g. its transpose): computed once before a loop whose ``b`` does not change."""
    if LOW == 1:
        if INTERPRET:
            return tl.dot(round_bf16(a), round_bf16(b), input_precision='ieee')
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    if LOW == 2:
        a16 = a.to(tl.float16)
        b16 = (b / scale).to(tl.float16)
        if INTERPRET:
            return tl.dot(a16.to(tl.float32), b16.to(tl.float32), input_precision='ieee') * scale
        return tl.dot(a16, b16) * scale
    return tl.dot(a, b, input_precision='ieee')


@triton.jit
def kernel_block(q_ptr, l_ptr, blk, H, N, M, D, sqb, sqh, sqn, sqd, BLOCK: tl.constexpr, MP: tl.constexpr,
                 DP: tl.constexpr):
    """Block ``blk`` of this program's (sample, head) group: ``(q (BLOCK, DP) float32, landmarks (MP, DP), K block
    (BLOCK, MP) float32 (zero outside the N tokens and M landmarks), token rows, row mask, group g = sample * H +
    head, sample, head)``."""
    g = tl.program_id(1)
    b = g // H
    hh = g % H
    rows = blk * BLOCK + tl.arange(0, BLOCK)
    dims = tl.arange(0, DP)
    marks = tl.arange(0, MP)
    row_ok = rows < N
    q = load_f32(q_ptr + b * sqb + hh * sqh + rows[:, None] * sqn + dims[None, :] * sqd,
                 row_ok[:, None] & (dims[None, :] < D))
    lm = load_f32(l_ptr + g * M * D + marks[:, None] * D + dims[None, :], (marks[:, None] < M) & (dims[None, :] < D))
    dot = tl.dot(q, tl.trans(lm), input_precision='ieee')
    exponent = dot - 0.5 * tl.sum(q * q, axis=1)[:, None] - 0.5 * tl.sum(lm * lm, axis=1)[None, :]
    k = tl.exp(tl.minimum(exponent, 0.0))
    k = tl.where(row_ok[:, None] & (marks[None, :] < M), k, 0.0)
    return q, lm, k, rows, row_ok, g, b, hh


@triton.jit
def kt_x_block(acc, q_ptr, l_ptr, x_ptr, blk, H, N, M, D, DV, sqb, sqh, sqn, sqd, sxb, sxh, sxn, sxd,
               BLOCK: tl.constexpr, MP: tl.constexpr, DP: tl.constexpr, DVP: tl.constexpr, LOW: tl.constexpr,
               INTERPRET: tl.constexpr):
    """``acc + K_blk^T x_blk`` for block ``blk`` of this program's group: the body of ``kt_x``'s loop."""
    cols = tl.arange(0, DVP)
    _, _, k, rows, row_ok, _, b, hh = kernel_block(q_ptr, l_ptr, blk, H, N, M, D, sqb, sqh, sqn, sqd, BLOCK, MP, DP)
    x = load_f32(x_ptr + b * sxb + hh * sxh + rows[:, None] * sxn + cols[None, :] * sxd,
                 row_ok[:, None] & (cols[None, :] < DV))
    return acc + pdot(tl.trans(k), x, LOW, INTERPRET)


@triton.jit
def kt_x(q_ptr, l_ptr, x_ptr, part_ptr, H, N, M, D, DV, sqb, sqh, sqn, sqd, sxb, sxh, sxn, sxd,
         BLOCK: tl.constexpr, MP: tl.constexpr, DP: tl.constexpr, DVP: tl.constexpr, LOW: tl.constexpr,
         INTERPRET: tl.constexpr):
    """Partial sums of ``K1^T x`` (x: v in the forward, grad_out in the backward). Grid ``(splits, B * H)``: program
    ``(split, g)`` sums the blocks ``split, split + splits, ...`` of BLOCK tokens of group g = sample * H + head, each
    block's kernel rebuilt in registers (``kernel_block``), into one ``(MP, DVP)`` float32 tile written to
    ``part_ptr[g, split]`` (padded: an unmasked store, fewer registers), summed by torch afterwards. q (strides
    ``sq*``) and x (``sx*``) are read through their strides, the landmarks contiguous ``(B*H, M, D)``; the products
    with x in the dtype ``LOW`` selects, accumulated in float32."""
    split = tl.program_id(0)
    splits = tl.num_programs(0)
    g = tl.program_id(1)
    marks = tl.arange(0, MP)
    cols = tl.arange(0, DVP)
    acc = tl.zeros((MP, DVP), dtype=tl.float32)
    num_blocks = tl.cdiv(N, BLOCK)
    if INTERPRET:
        blk = split
        while blk < num_blocks:
            acc = kt_x_block(acc, q_ptr, l_ptr, x_ptr, blk, H, N, M, D, DV, sqb, sqh, sqn, sqd, sxb, sxh, sxn, sxd,
                             BLOCK, MP, DP, DVP, LOW, INTERPRET)
            blk += splits
    else:
        for blk in range(split, num_blocks, splits):
            acc = kt_x_block(acc, q_ptr, l_ptr, x_ptr, blk, H, N, M, D, DV, sqb, sqh, sqn, sqd, sxb, sxh, sxn, sxd,
                             BLOCK, MP, DP, DVP, LOW, INTERPRET)
    tl.store(part_ptr + ((g * splits + split) * MP + marks[:, None]) * DVP + cols[None, :], acc)


@triton.jit
def k_times(q_ptr, l_ptr, mid_ptr, out_ptr, H, N, M, D, DV, sqb, sqh, sqn, sqd, sob, soh, son, sod,
            BLOCK: tl.constexpr, MP: tl.constexpr, DP: tl.constexpr, DVP: tl.constexpr, LOW: tl.constexpr,
            INTERPRET: tl.constexpr):
    """``out = K1 @ mixed`` for one block: grid ``(cdiv(N, BLOCK), B * H)``, program ``(blk, g)`` rebuilds the block's
    kernel ``(BLOCK, MP)`` in registers and multiplies it by the group's ``mixed = middle @ K1^T v`` (contiguous
    ``(B*H, M, DV)`` float32), operands in the dtype ``LOW`` selects, float32 accumulation; the output is written
    through its strides (``so*``) in its own dtype."""
    _, _, k, rows, row_ok, g, b, hh = kernel_block(q_ptr, l_ptr, tl.program_id(0), H, N, M, D, sqb, sqh, sqn, sqd,
                                                   BLOCK, MP, DP)
    marks = tl.arange(0, MP)
    cols = tl.arange(0, DVP)
    mid = load_f32(mid_ptr + (g * M + marks[:, None]) * DV + cols[None, :], (marks[:, None] < M) & (cols[None, :] < DV))
    out = pdot(k, mid, LOW, INTERPRET)
    tl.store(out_ptr + b * sob + hh * soh + rows[:, None] * son + cols[None, :] * sod,
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & (cols[None, :] < DV))


@triton.jit
def backward_block(lsum, lcnt, gctx_scale, mid_scale, q_ptr, l_ptr, v_ptr, go_ptr, mid_ptr, gctx_ptr, gq_ptr,
                   gv_ptr, blk, H, N, M, D, DV, sqb, sqh, sqn, sqd, svb, svh, svn, svd, sgb, sgh, sgn, sgd,
                   sgqb, sgqh, sgqn, sgqd, sgvb, sgvh, sgvn, sgvd, BLOCK: tl.constexpr, MP: tl.constexpr,
                   DP: tl.constexpr, DVP: tl.constexpr, LOW: tl.constexpr, INTERPRET: tl.constexpr):
    """Block ``blk`` of this program's group: stores its grad q and grad v, returns the landmark gradient's partial
    sums ``(lsum, lcnt)`` with the block's share added: the body of ``backward``'s loop. ``gctx_scale`` and
    ``mid_scale``: float16's power-of-two scales of the grad-context and middle tiles (the same for every block)."""
    g = tl.program_id(1)
    marks = tl.arange(0, MP)
    cols = tl.arange(0, DVP)
    dims = tl.arange(0, DP)
    q, lm, k, rows, row_ok, _, b, hh = kernel_block(q_ptr, l_ptr, blk, H, N, M, D, sqb, sqh, sqn, sqd, BLOCK, MP, DP)
    value_mask = row_ok[:, None] & (cols[None, :] < DV)
    # the order keeps few tiles alive at once (0 spills, triton_config): grad v first, then grad K1 one product at a
    # time
    small_mask = (marks[:, None] < M) & (cols[None, :] < DV)
    gctx = load_f32(gctx_ptr + (g * M + marks[:, None]) * DV + cols[None, :], small_mask)
    grad_v = pdot_scaled(k, gctx, gctx_scale, LOW, INTERPRET)
    tl.store(gv_ptr + b * sgvb + hh * sgvh + rows[:, None] * sgvn + cols[None, :] * sgvd,
             grad_v.to(gv_ptr.dtype.element_ty), mask=value_mask)
    v = load_f32(v_ptr + b * svb + hh * svh + rows[:, None] * svn + cols[None, :] * svd, value_mask)
    grad_k = pdot_scaled(v, tl.trans(gctx), gctx_scale, LOW, INTERPRET)
    go = load_f32(go_ptr + b * sgb + hh * sgh + rows[:, None] * sgn + cols[None, :] * sgd, value_mask)
    mid = load_f32(mid_ptr + (g * M + marks[:, None]) * DV + cols[None, :], small_mask)
    grad_k += pdot_scaled(go, tl.trans(mid), mid_scale, LOW, INTERPRET)
    grad_s = grad_k * k  # (BLOCK, MP), zero on masked rows and landmarks
    grad_q = tl.dot(grad_s, lm, input_precision='ieee') - q * tl.sum(grad_s, axis=1)[:, None]
    tl.store(gq_ptr + b * sgqb + hh * sgqh + rows[:, None] * sgqn + dims[None, :] * sgqd,
             grad_q.to(gq_ptr.dtype.element_ty), mask=row_ok[:, None] & (dims[None, :] < D))
    lsum += tl.dot(tl.trans(grad_s), q, input_precision='ieee')  # (MP, DP)
    lcnt += tl.sum(grad_s, axis=0)
    return lsum, lcnt


@triton.jit
def backward(q_ptr, l_ptr, v_ptr, go_ptr, mid_ptr, gctx_ptr, gq_ptr, gv_ptr, lsum_ptr, lcnt_ptr,
             H, N, M, D, DV, sqb, sqh, sqn, sqd, svb, svh, svn, svd, sgb, sgh, sgn, sgd,
             sgqb, sgqh, sgqn, sgqd, sgvb, sgvh, sgvn, sgvd, BLOCK: tl.constexpr, MP: tl.constexpr,
             DP: tl.constexpr, DVP: tl.constexpr, LOW: tl.constexpr, INTERPRET: tl.constexpr):
    """The products' backward. Grid ``(splits, B * H)`` as ``kt_x``: program ``(split, g)`` takes every
    ``splits``-th block of BLOCK tokens of its group and, per block (``backward_block``), rebuilds the kernel block,
    forms ``grad K1 = grad_out mixed^T + v grad_context^T`` and ``grad_s = grad K1 * K1`` in float32, writes the
    block's grad v ``= K1 grad_context`` and grad q ``= grad_s l - q rowsum(grad_s)`` through their strides
    (``sgv*``, ``sgq*``), and adds the block's share of the landmark gradient, ``grad_s^T q`` (``(MP, DP)``) and
    ``colsum(grad_s)`` (``(MP,)``), to float32 sums in registers, written once per program to ``lsum_ptr`` and
    ``lcnt_ptr`` and summed by torch. q, v and grad_out (``sg*``) are read through their strides; ``mixed`` and
    ``grad_context`` are contiguous ``(B*H, M, DV)`` float32."""
    split = tl.program_id(0)
    splits = tl.num_programs(0)
    g = tl.program_id(1)
    marks = tl.arange(0, MP)
    dims = tl.arange(0, DP)
    lsum = tl.zeros((MP, DP), dtype=tl.float32)
    lcnt = tl.zeros((MP,), dtype=tl.float32)
    # float16's scales of the m×d tiles, which every block multiplies by: once per program (fewer registers)
    gctx_scale = 1.0
    mid_scale = 1.0
    if LOW == 2:
        cols = tl.arange(0, DVP)
        small_mask = (marks[:, None] < M) & (cols[None, :] < DV)
        gctx_scale = pow2_above(load_f32(gctx_ptr + (g * M + marks[:, None]) * DV + cols[None, :], small_mask))
        mid_scale = pow2_above(load_f32(mid_ptr + (g * M + marks[:, None]) * DV + cols[None, :], small_mask))
    num_blocks = tl.cdiv(N, BLOCK)
    if INTERPRET:
        blk = split
        while blk < num_blocks:
            lsum, lcnt = backward_block(
                lsum, lcnt, gctx_scale, mid_scale, q_ptr, l_ptr, v_ptr, go_ptr, mid_ptr, gctx_ptr, gq_ptr, gv_ptr, blk,
                H, N, M, D, DV, sqb, sqh, sqn, sqd, svb, svh, svn, svd, sgb, sgh, sgn, sgd, sgqb, sgqh, sgqn, sgqd,
                sgvb, sgvh, sgvn, sgvd, BLOCK, MP, DP, DVP, LOW, INTERPRET)
            blk += splits
    else:
        for blk in range(split, num_blocks, splits):
            lsum, lcnt = backward_block(
                lsum, lcnt, gctx_scale, mid_scale, q_ptr, l_ptr, v_ptr, go_ptr, mid_ptr, gctx_ptr, gq_ptr, gv_ptr, blk,
                H, N, M, D, DV, sqb, sqh, sqn, sqd, svb, svh, svn, svd, sgb, sgh, sgn, sgd, sgqb, sgqh, sgqn, sgqd,
                sgvb, sgvh, sgvn, sgvd, BLOCK, MP, DP, DVP, LOW, INTERPRET)
    slot = g * splits + split  # one partial sum per program
    tl.store(lsum_ptr + (slot * MP + marks[:, None]) * DP + dims[None, :], lsum)
    tl.store(lcnt_ptr + slot * MP + marks, lcnt)


@triton.jit
def newton_schulz_step(v, p):
    """One Newton–Schulz iteration ``2 V - (V P) V`` of float32 tiles, IEEE float32 dots."""
    return 2.0 * v - tl.dot(tl.dot(v, p, input_precision='ieee'), v, input_precision='ieee')


@triton.jit
def nystrom_middle(l_ptr, mid_ptr, inv_ptr, M, D, num_iters, ridge, floor, MP: tl.constexpr, DP: tl.constexpr,
                   NORMALIZE: tl.constexpr, INTERPRET: tl.constexpr):
    """The whole m×m part of one (sample, head) group in one program, in registers, IEEE float32: the landmark kernel
    ``A = exp(min(l . l' - |l|^2 / 2 - |l'|^2 / 2, 0))``, ``P = A + ridge I``, the Newton–Schulz start
    ``V = alpha P^T`` with ``alpha = 1.8 / max(||A||_1 ||A||_inf, floor)``, ``num_iters`` iterations
    ``V = 2 V - (V P) V``, and the middle matrix ``V``, or ``D^-1/2 V D^-1/2`` with ``D = A 1`` (SOFT-Norm).
    Writes the inverse ``V`` and the middle matrix, ``(M, M)`` each per group; the padding (rows and columns past M)
    is zero in every tile, so the iteration on the padded tiles is the iteration on the M×M matrices."""
    g = tl.program_id(0)
    marks = tl.arange(0, MP)
    dims = tl.arange(0, DP)
    ok = marks < M
    valid = ok[:, None] & ok[None, :]
    lm = load_f32(l_ptr + g * M * D + marks[:, None] * D + dims[None, :], ok[:, None] & (dims[None, :] < D))
    half_sq = 0.5 * tl.sum(lm * lm, axis=1)
    exponent = tl.dot(lm, tl.trans(lm), input_precision='ieee') - half_sq[:, None] - half_sq[None, :]
    a = tl.where(valid, tl.exp(tl.minimum(exponent, 0.0)), 0.0)
    row_sums = tl.sum(a, axis=1)  # A >= 0: the row sums are those of |A|, and A is symmetric
    norm_inf = tl.max(row_sums, axis=0)
    norm_1 = tl.max(tl.sum(a, axis=0), axis=0)
    alpha = 1.8 / tl.maximum(norm_1 * norm_inf, floor)
    p = tl.where(valid & (marks[:, None] == marks[None, :]), a + ridge, a)
    v = alpha * tl.trans(p)
    if INTERPRET:
        step = 0
        while step < num_iters:
            v = newton_schulz_step(v, p)
            step += 1
    else:
        for _ in range(num_iters):
            v = newton_schulz_step(v, p)
    offsets = g * M * M + marks[:, None] * M + marks[None, :]
    tl.store(inv_ptr + offsets, v, mask=valid)
    if NORMALIZE:
        scale = tl.where(ok, 1.0 / tl.sqrt(tl.where(ok, row_sums, 1.0)), 0.0)
        v = scale[:, None] * v * scale[None, :]
    tl.store(mid_ptr + offsets, v, mask=valid)
