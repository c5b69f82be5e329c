"""The Triton kernels of the SOFT op's Triton backend, launched by :mod:`.nystrom_launch` (imported on first use:
``TRITON_INTERPRET`` is read when a kernel is decorated, so this module is re-imported when that setting changes).

The kernels, named ``nystrom_<fwd|bwd>_kernel_<outputs>`` and declared by the op (``KERNELS`` of
:mod:`.nystrom_config`), each state their grid and what they compute; what follows is what they share.

``K1`` is the Gaussian kernel of the tokens against the m landmarks; every kernel rebuilds its block of ``K1`` in
registers from q and the landmarks (:func:`kernel_block`), so no N×m tensor is ever written to memory. A group ``g =
sample * H + head`` is one (sample, head). The token kernels take their arguments grouped: a token tensor ``(B, H, N,
D)`` (q, v, x, o, do, dq, dv) is one tuple ``(pointer, (stride_b, stride_h, stride_n, stride_d))`` (triton specialises
each member as it does a plain argument), the sizes one tuple ``sizes = (H, N, M, D, DV)``; the landmarks and the m×d
factors are contiguous ``(B*H, M, D)`` float32. Each kernel moves its token tensors to its group once
(:func:`at_group`); the block helpers below index tokens and dims within it. Padded tile sizes (powers of two, at least
16): ``MP`` (landmarks), ``DP`` (head dim), ``DVP`` (value dim).

``PRODUCTS`` (a constexpr) is the dtype of the products with v or grad_out: :data:`PRODUCTS_FLOAT32` (IEEE float32, no
TF32), :data:`PRODUCTS_BFLOAT16` or :data:`PRODUCTS_FLOAT16`; every product accumulates in float32, and the kernel block
and its exponent are float32 in every case. Under the interpreter (:data:`~soft_mm.ops.triton_interpreter.INTERPRET`, a
constant of the module, not an argument) the bfloat16 rounding is emulated in float32. Every loop whose bound is known
only at run time is one ``for`` loop over :func:`~soft_mm.ops.triton_interpreter.loop_bound` of it, which a GPU
pipelines (its loads prefetched with ``cp.async``; a ``while`` loop is not pipelined), and each block helper has one
call site and takes the kernel's state once, in the tuples the kernel holds it in."""
import triton
import triton.language as tl

from ....triton_interpreter import INTERPRET, loop_bound

__all__ = [
    'MIDDLE_BWD_ROWS',
    'PRODUCTS_BFLOAT16',
    'PRODUCTS_FLOAT16',
    'PRODUCTS_FLOAT32',
    'at_group',
    'bwd_block',
    'context_block',
    'kernel_block',
    'load_f32',
    'load_group_tile',
    'load_tokens',
    'newton_schulz_step',
    'nystrom_bwd_kernel_dl_sum',
    'nystrom_bwd_kernel_dmid_dctx',
    'nystrom_bwd_kernel_dq_dv_dl',
    'nystrom_fwd_kernel_context',
    'nystrom_fwd_kernel_mc',
    'nystrom_fwd_kernel_o',
    'nystrom_middle_bwd_kernel_dl',
    'nystrom_middle_fwd_kernel_mid_inv',
    'pdot',
    'pdot_scaled',
    'pow2_above',
    'round_bf16',
    'store_group_tile',
    'store_tokens',
    'sum_partials',
]

# the values of PRODUCTS (the launches pass config.PRODUCTS_CODES[name])
PRODUCTS_FLOAT32 = tl.constexpr(0)
PRODUCTS_BFLOAT16 = tl.constexpr(1)
PRODUCTS_FLOAT16 = tl.constexpr(2)
# rows of the landmarks' gradient that nystrom_middle_bwd_kernel_dl builds at a time
MIDDLE_BWD_ROWS = tl.constexpr(16)


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
def pdot(a, b, PRODUCTS: tl.constexpr):
    """``a @ b`` of float32 tiles with float32 accumulation, the operands rounded to the ``PRODUCTS`` dtype first (on a
    GPU tensor-core products; under the interpreter the same rounded values multiplied in float32). For float16,
    ``b`` (an m×d factor, which the inverse can make large) is scaled into [-1, 1] by a power of two and the product
    scaled back, so it stays in float16's range; ``a`` must be representable (the kernel block, in [0, 1], or float16
    values)."""
    return pdot_scaled(a, b, pow2_above(b) if PRODUCTS == PRODUCTS_FLOAT16 else 1.0, PRODUCTS)


@triton.jit
def pdot_scaled(a, b, scale, PRODUCTS: tl.constexpr):
    """:func:`pdot` with float16's power-of-two ``scale`` of ``b`` given (``pow2_above`` of ``b`` or of a tile with
    the same largest magnitude, e.g. its transpose): computed once before a loop whose ``b`` does not change."""
    if PRODUCTS == PRODUCTS_BFLOAT16:
        if INTERPRET:
            return tl.dot(round_bf16(a), round_bf16(b), input_precision='ieee')
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    if PRODUCTS == PRODUCTS_FLOAT16:
        a16 = a.to(tl.float16)
        b16 = (b / scale).to(tl.float16)
        if INTERPRET:
            return tl.dot(a16.to(tl.float32), b16.to(tl.float32), input_precision='ieee') * scale
        return tl.dot(a16, b16) * scale
    return tl.dot(a, b, input_precision='ieee')


@triton.jit
def at_group(tensor, H):
    """A token tensor ``(pointer, strides)`` of ``(B, H, N, D)`` with its pointer moved to this program's group
    (``tl.program_id(1)``): the kernels offset every token tensor once per program, and the block helpers index tokens
    and dims only."""
    ptr, strides = tensor
    g = tl.program_id(1)
    return ptr + (g // H) * strides[0] + (g % H) * strides[1], strides


@triton.jit
def load_tokens(tensor, rows, row_ok, width, WP: tl.constexpr):
    """The ``(BLOCK, WP)`` float32 tile of token rows ``rows`` (masked by ``row_ok``) and the first ``width`` columns
    of a group's ``(N, width)`` slice (``tensor``: ``(pointer at the group, the tensor's four strides)``)."""
    ptr, strides = tensor
    cols = tl.arange(0, WP)
    mask = row_ok[:, None] & (cols[None, :] < width)
    return load_f32(ptr + rows[:, None] * strides[2] + cols[None, :] * strides[3], mask)


@triton.jit
def store_tokens(tensor, tile, rows, row_ok, width, WP: tl.constexpr):
    """:func:`load_tokens`' counterpart: ``tile`` written in the tensor's own dtype."""
    ptr, strides = tensor
    cols = tl.arange(0, WP)
    tl.store(ptr + rows[:, None] * strides[2] + cols[None, :] * strides[3], tile.to(ptr.dtype.element_ty),
             mask=row_ok[:, None] & (cols[None, :] < width))


@triton.jit
def load_group_tile(ptr, rows, cols, RP: tl.constexpr, CP: tl.constexpr):
    """The ``(RP, CP)`` float32 tile of a group's contiguous ``(rows, cols)`` matrix (the landmarks, an m×d factor),
    zero in the padding; ``ptr`` is already at the group."""
    r = tl.arange(0, RP)
    c = tl.arange(0, CP)
    return load_f32(ptr + r[:, None] * cols + c[None, :], (r[:, None] < rows) & (c[None, :] < cols))


@triton.jit
def kernel_block(q, l_ptr, blk, N, M, D, BLOCK: tl.constexpr, MP: tl.constexpr, DP: tl.constexpr):
    """Block ``blk`` of the group's tokens against its landmarks (``q`` and ``l_ptr`` at the group): ``(q (BLOCK,
    DP) float32, landmarks (MP, DP), K block (BLOCK, MP) float32 (zero outside the N tokens and M landmarks), token
    rows, row mask)``. The block is ``exp(min(q . l - |q|^2 / 2 - |l|^2 / 2, 0))`` with an IEEE float32 dot: the norm
    terms cancel against the dot product, so the exponent never runs in a lower dtype."""
    rows = blk * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < N
    q_tile = load_tokens(q, rows, row_ok, D, DP)
    lm = load_group_tile(l_ptr, M, D, MP, DP)
    dot = tl.dot(q_tile, tl.trans(lm), input_precision='ieee')
    exponent = dot - 0.5 * tl.sum(q_tile * q_tile, axis=1)[:, None] - 0.5 * tl.sum(lm * lm, axis=1)[None, :]
    k = tl.where(row_ok[:, None] & (tl.arange(0, MP)[None, :] < M), tl.exp(tl.minimum(exponent, 0.0)), 0.0)
    return q_tile, lm, k, rows, row_ok


@triton.jit
def context_block(acc, q, l_ptr, x, blk, N, M, D, DV, BLOCK: tl.constexpr, MP: tl.constexpr, DP: tl.constexpr,
                  DVP: tl.constexpr, PRODUCTS: tl.constexpr):
    """``acc + K_blk^T x_blk`` for block ``blk`` of the group (``q``, ``x`` and ``l_ptr`` at the group): the body of
    :func:`nystrom_fwd_kernel_context`'s loop."""
    _, _, k, rows, row_ok = kernel_block(q, l_ptr, blk, N, M, D, BLOCK, MP, DP)
    x_tile = load_tokens(x, rows, row_ok, DV, DVP)
    return acc + pdot(tl.trans(k), x_tile, PRODUCTS)


@triton.jit
def nystrom_fwd_kernel_context(q, x, l_ptr, part_ptr, sizes, BLOCK: tl.constexpr, MP: tl.constexpr, DP: tl.constexpr,
                               DVP: tl.constexpr, PRODUCTS: tl.constexpr):
    """Partial sums of ``K1^T x``: ``x`` is v in the forward (the context), grad_out in the backward.

    Grid ``(splits, B * H)``, a split reduction over the tokens: program ``(split, g)`` sums the blocks ``split, split
    + splits, ...`` of ``BLOCK`` tokens of group ``g``, each block's kernel rebuilt in registers, into one ``(MP, DVP)``
    float32 tile written to ``part_ptr[g, split]`` (padded: an unmasked store, fewer registers); a later kernel sums
    the ``splits`` partials (deterministic: the split depends on the sizes only; no atomics).

    Inputs: q ``(B, H, N, D)`` and x ``(B, H, N, DV)``, each ``(pointer, strides)``, in any float dtype; the landmarks
    contiguous ``(B*H, M, D)`` float32; ``sizes = (H, N, M, D, DV)``. The products with x in the ``PRODUCTS`` dtype,
    accumulated in float32."""
    H, N, M, D, DV = sizes
    split = tl.program_id(0)
    splits = tl.num_programs(0)
    g = tl.program_id(1)
    q = at_group(q, H)
    x = at_group(x, H)
    l_ptr += g * M * D
    acc = tl.zeros((MP, DVP), dtype=tl.float32)
    blk = split
    trips = tl.cdiv(tl.cdiv(N, BLOCK) - split, splits)
    for _ in range(0, loop_bound(trips)):
        acc = context_block(acc, q, l_ptr, x, blk, N, M, D, DV, BLOCK, MP, DP, DVP, PRODUCTS)
        blk += splits  # (carried, not split + trip * splits: the same registers as a range(split, end, splits))
    marks = tl.arange(0, MP)
    tl.store(part_ptr + ((g * splits + split) * MP + marks[:, None]) * DVP + tl.arange(0, DVP)[None, :], acc)


@triton.jit
def nystrom_fwd_kernel_o(q, o, l_ptr, mc_ptr, sizes, BLOCK: tl.constexpr, MP: tl.constexpr, DP: tl.constexpr,
                         DVP: tl.constexpr, PRODUCTS: tl.constexpr):
    """The output ``o = K1 @ middle_context``.

    Grid ``(cdiv(N, BLOCK), B * H)``: program ``(blk, g)`` rebuilds the ``(BLOCK, MP)`` kernel block in registers and
    multiplies it by its group's ``middle_context = middle @ K1^T v`` (``mc_ptr``: contiguous ``(B*H, M, DV)``
    float32), operands in the ``PRODUCTS`` dtype, float32 accumulation; o (``(pointer, strides)``, as q) is written
    through its strides in its own dtype; ``sizes = (H, N, M, D, DV)``."""
    H, N, M, D, DV = sizes
    g = tl.program_id(1)
    _, _, k, rows, row_ok = kernel_block(at_group(q, H), l_ptr + g * M * D, tl.program_id(0), N, M, D, BLOCK, MP, DP)
    mc = load_group_tile(mc_ptr + g * M * DV, M, DV, MP, DVP)
    o_tile = pdot(k, mc, PRODUCTS)
    store_tokens(at_group(o, H), o_tile, rows, row_ok, DV, DVP)


@triton.jit
def bwd_block(sums, scales, tokens, group_ptrs, blk, sizes, BLOCK: tl.constexpr, MP: tl.constexpr, DP: tl.constexpr,
              DVP: tl.constexpr, PRODUCTS: tl.constexpr):
    """Block ``blk`` of the group: stores its grad q and grad v, returns the landmark gradient's partial sums
    ``sums = (dl_sum, dl_colsum)`` with the block's share added: the body of :func:`nystrom_bwd_kernel_dq_dv_dl`'s
    loop. ``tokens = (q, v, do, dq, dv)`` and ``group_ptrs = (l_ptr, mc_ptr, dctx_ptr)``, each at the group;
    ``scales = (dctx_scale, mc_scale)``: float16's power-of-two scales of the grad-context and middle-context tiles
    (the same for every block); ``sizes = (H, N, M, D, DV)``."""
    dl_sum, dl_colsum = sums
    dctx_scale, mc_scale = scales
    q, v, do, dq, dv = tokens
    l_ptr, mc_ptr, dctx_ptr = group_ptrs
    _, N, M, D, DV = sizes
    q_tile, lm, k, rows, row_ok = kernel_block(q, l_ptr, blk, N, M, D, BLOCK, MP, DP)
    # the order keeps few tiles alive at once (0 spills): the m×d tiles loaded where they are used, grad v first,
    # then grad K1 one product at a time
    dctx = load_group_tile(dctx_ptr, M, DV, MP, DVP)
    store_tokens(dv, pdot_scaled(k, dctx, dctx_scale, PRODUCTS), rows, row_ok, DV, DVP)
    grad_k = pdot_scaled(load_tokens(v, rows, row_ok, DV, DVP), tl.trans(dctx), dctx_scale, PRODUCTS)
    do_tile = load_tokens(do, rows, row_ok, DV, DVP)
    mc = load_group_tile(mc_ptr, M, DV, MP, DVP)
    grad_k += pdot_scaled(do_tile, tl.trans(mc), mc_scale, PRODUCTS)
    grad_s = grad_k * k  # (BLOCK, MP), zero on masked rows and landmarks
    dq_tile = tl.dot(grad_s, lm, input_precision='ieee') - q_tile * tl.sum(grad_s, axis=1)[:, None]
    store_tokens(dq, dq_tile, rows, row_ok, D, DP)
    dl_sum += tl.dot(tl.trans(grad_s), q_tile, input_precision='ieee')  # (MP, DP)
    dl_colsum += tl.sum(grad_s, axis=0)
    return dl_sum, dl_colsum


@triton.jit
def nystrom_bwd_kernel_dq_dv_dl(q, v, do, dq, dv, l_ptr, factors, partials, sizes, BLOCK: tl.constexpr,
                                MP: tl.constexpr, DP: tl.constexpr, DVP: tl.constexpr, PRODUCTS: tl.constexpr):
    """The products' backward: grad q, grad v, and partial sums of grad landmarks.

    Grid ``(splits, B * H)`` as :func:`nystrom_fwd_kernel_context`: program ``(split, g)`` takes every ``splits``-th
    block of ``BLOCK`` tokens of its group and, per block, rebuilds the kernel block, forms ``grad K1 = do
    middle_context^T + v dctx^T`` and ``grad_s = grad K1 * K1`` in float32, writes the block's ``dv = K1 dctx`` and
    ``dq = grad_s l - q rowsum(grad_s)`` through their strides, and adds the block's share of the landmark gradient,
    ``grad_s^T q`` (``(MP, DP)``) and ``colsum(grad_s)`` (``(MP,)``), to float32 sums in registers, written once per
    program to ``partials = (dl_sum_ptr, dl_colsum_ptr)`` (``(B*H, splits, MP, DP)`` and ``(B*H, splits, MP)``; the
    landmarks' gradient is formed from them by :func:`nystrom_bwd_kernel_dl_sum`).

    Inputs: q, v and do (grad_out), written dq and dv, each ``(pointer, strides)``; ``factors = (mc_ptr, dctx_ptr)``,
    middle_context and the grad of the context (``middle^T K1^T do``), contiguous ``(B*H, M, DV)`` float32; the
    landmarks contiguous ``(B*H, M, D)`` float32; ``sizes = (H, N, M, D, DV)``. The products with v, do and their m×d
    partners in the ``PRODUCTS`` dtype, float32 accumulation; the products with q and the landmarks (the exponent's
    gradient) in IEEE float32."""
    H, N, M, D, DV = sizes
    mc_ptr, dctx_ptr = factors
    dl_sum_ptr, dl_colsum_ptr = partials
    split = tl.program_id(0)
    splits = tl.num_programs(0)
    g = tl.program_id(1)
    q = at_group(q, H)
    v = at_group(v, H)
    do = at_group(do, H)
    dq = at_group(dq, H)
    dv = at_group(dv, H)
    l_ptr += g * M * D
    mc_ptr += g * M * DV
    dctx_ptr += g * M * DV
    # float16's scales of the m×d tiles, which every block multiplies by: once per program (fewer registers)
    dctx_scale = 1.0
    mc_scale = 1.0
    if PRODUCTS == PRODUCTS_FLOAT16:
        dctx_scale = pow2_above(load_group_tile(dctx_ptr, M, DV, MP, DVP))
        mc_scale = pow2_above(load_group_tile(mc_ptr, M, DV, MP, DVP))
    dl_sum = tl.zeros((MP, DP), dtype=tl.float32)
    dl_colsum = tl.zeros((MP,), dtype=tl.float32)
    blk = split
    trips = tl.cdiv(tl.cdiv(N, BLOCK) - split, splits)
    for _ in range(0, loop_bound(trips)):
        dl_sum, dl_colsum = bwd_block((dl_sum, dl_colsum), (dctx_scale, mc_scale), (q, v, do, dq, dv),
                                      (l_ptr, mc_ptr, dctx_ptr), blk, sizes, BLOCK, MP, DP, DVP, PRODUCTS)
        blk += splits
    marks = tl.arange(0, MP)
    slot = g * splits + split  # one partial sum per program
    tl.store(dl_sum_ptr + (slot * MP + marks[:, None]) * DP + tl.arange(0, DP)[None, :], dl_sum)
    tl.store(dl_colsum_ptr + slot * MP + marks, dl_colsum)


@triton.jit
def newton_schulz_step(v, p):
    """One Newton–Schulz iteration ``2 V - (V P) V`` of float32 tiles, IEEE float32 dots."""
    return 2.0 * v - tl.dot(tl.dot(v, p, input_precision='ieee'), v, input_precision='ieee')


@triton.jit
def nystrom_middle_fwd_kernel_mid_inv(l_ptr, mid_ptr, inv_ptr, M, D, num_iters, ridge, floor, MP: tl.constexpr,
                                      DP: tl.constexpr, SOFT_NORM: tl.constexpr):
    """The m×m middle matrix and the inverse it holds, one (sample, head) group per program.

    Grid ``(B * H,)``; everything in registers, IEEE float32: the landmark kernel ``A = exp(min(l . l' - |l|^2 / 2 -
    |l'|^2 / 2, 0))``, ``P = A + ridge I``, the Newton–Schulz start ``V = alpha P^T`` with ``alpha = 1.8 /
    max(||A||_1 ||A||_inf, floor)``, ``num_iters`` iterations ``V = 2 V - (V P) V``, and the middle matrix ``V``, or
    ``D^-1/2 V D^-1/2`` with ``D = A 1`` (SOFT-Norm, ``SOFT_NORM``). Input: the landmarks, contiguous ``(B*H, M, D)``
    float32. Writes the inverse ``V`` (``inv_ptr``) and the middle matrix (``mid_ptr``), contiguous ``(M, M)`` per
    group; the padding (rows and columns past M) is zero in every tile, so the iteration on the padded tiles is the
    iteration on the M×M matrices."""
    g = tl.program_id(0)
    marks = tl.arange(0, MP)
    ok = marks < M
    valid = ok[:, None] & ok[None, :]
    lm = load_group_tile(l_ptr + g * M * D, M, D, MP, DP)
    half_sq = 0.5 * tl.sum(lm * lm, axis=1)
    exponent = tl.dot(lm, tl.trans(lm), input_precision='ieee') - half_sq[:, None] - half_sq[None, :]
    a = tl.where(valid, tl.exp(tl.minimum(exponent, 0.0)), 0.0)
    row_sums = tl.sum(a, axis=1)  # A >= 0: the row sums are those of |A|, and A is symmetric
    norm_inf = tl.max(row_sums, axis=0)
    norm_1 = tl.max(tl.sum(a, axis=0), axis=0)
    alpha = 1.8 / tl.maximum(norm_1 * norm_inf, floor)
    p = tl.where(valid & (marks[:, None] == marks[None, :]), a + ridge, a)
    v = alpha * tl.trans(p)
    for _ in range(0, loop_bound(num_iters)):
        v = newton_schulz_step(v, p)
    offsets = g * M * M + marks[:, None] * M + marks[None, :]
    tl.store(inv_ptr + offsets, v, mask=valid)
    if SOFT_NORM:
        scale = tl.where(ok, 1.0 / tl.sqrt(tl.where(ok, row_sums, 1.0)), 0.0)
        v = scale[:, None] * v * scale[None, :]
    tl.store(mid_ptr + offsets, v, mask=valid)


@triton.jit
def nystrom_middle_bwd_kernel_dl(dm_ptr, l_ptr, inv_ptr, dl_ptr, M, D, MP: tl.constexpr, DP: tl.constexpr,
                                 SOFT_NORM: tl.constexpr):
    """The landmarks' gradient through the m×m middle matrix, one (sample, head) group per program.

    Grid ``(B * H,)``; IEEE float32: from the middle matrix's gradient ``G`` (``dm_ptr``), the landmarks ``l`` and the
    final Newton–Schulz iterate ``V`` (``inv_ptr``), contiguous ``(B*H, M, M)`` and ``(B*H, M, D)`` float32, the
    gradient of ``A = exp(min(E, 0))`` (``E_ij = l_i . l_j - |l_i|^2 / 2 - |l_j|^2 / 2``) is the exact inverse's at
    ``V``, ``-V^T G V^T`` (the implicit backward of the iteration: alpha is not differentiated), plus with SOFT-Norm
    (``SOFT_NORM``; then ``G`` is first taken through ``D^-1/2 V D^-1/2``: ``G' = s G s``) the row sums' share,
    ``-s_i^3 / 2 (sum_j W_ij s_j + sum_j W_ji s_j)`` along row ``i`` with ``s = D^-1/2`` and ``W = G * V``. The
    exponent passes it on where ``E <= 0`` (``gE``), and ``dl = (gE + gE^T) l - (rowsum(gE) + colsum(gE)) l`` is
    written to ``dl_ptr`` (contiguous ``(B*H, M, D)`` float32).

    ``gE`` is built :data:`MIDDLE_BWD_ROWS` rows at a time (its rows of ``V^T`` and of the landmarks loaded as they
    are needed, the loop not unrolled), so that only ``G'``, ``V^T`` and the landmarks are held whole: 0 spilled
    registers at the published sizes (the whole tiles at once spilled 280-770 B). Each block's own rows of ``dl`` are
    stored as they are done, the transposed term summed over the blocks in registers and added at the end."""
    g = tl.program_id(0)
    marks = tl.arange(0, MP)
    ok = marks < M
    valid = ok[:, None] & ok[None, :]
    cols = tl.arange(0, DP)
    group_mm = g * M * M
    grad_middle = tl.load(dm_ptr + group_mm + marks[:, None] * M + marks[None, :], mask=valid, other=0.0)
    lm = load_group_tile(l_ptr + g * M * D, M, D, MP, DP)
    half_sq = 0.5 * tl.sum(lm * lm, axis=1)
    if SOFT_NORM:
        a = tl.where(valid, tl.exp(tl.minimum(tl.dot(lm, tl.trans(lm), input_precision='ieee')
                                              - half_sq[:, None] - half_sq[None, :], 0.0)), 0.0)
        scale = tl.where(ok, 1.0 / tl.sqrt(tl.where(ok, tl.sum(a, axis=1), 1.0)), 0.0)  # D^-1/2
        weighted = grad_middle * tl.load(inv_ptr + group_mm + marks[:, None] * M + marks[None, :], mask=valid,
                                         other=0.0)
        grad_scale = tl.sum(weighted * scale[None, :], axis=1) + tl.sum(weighted * scale[:, None], axis=0)
        row_term = -0.5 * scale * scale * scale * grad_scale  # added along each row of the gradient of A
        grad_middle = scale[:, None] * grad_middle * scale[None, :]
    v_t = tl.load(inv_ptr + group_mm + marks[None, :] * M + marks[:, None], mask=valid, other=0.0)  # V^T
    transposed = tl.zeros((MP, DP), dtype=tl.float32)  # sum over the blocks of gE_block^T l_block
    for start in range(0, MP, MIDDLE_BWD_ROWS):
        rows = start + tl.arange(0, MIDDLE_BWD_ROWS)
        rows_ok = rows < M
        block_valid = rows_ok[:, None] & ok[None, :]
        # rows of V^T (columns of V) and of the landmarks
        v_t_rows = tl.load(inv_ptr + group_mm + marks[None, :] * M + rows[:, None], mask=block_valid, other=0.0)
        lm_rows = load_f32(l_ptr + g * M * D + rows[:, None] * D + cols[None, :],
                           rows_ok[:, None] & (cols[None, :] < D))
        grad_a = -tl.dot(tl.dot(v_t_rows, grad_middle, input_precision='ieee'), v_t, input_precision='ieee')
        if SOFT_NORM:
            grad_a += tl.sum(tl.where(marks[None, :] == rows[:, None], row_term[None, :], 0.0), axis=1)[:, None]
        exponent = (tl.dot(lm_rows, tl.trans(lm), input_precision='ieee') - 0.5 * tl.sum(lm_rows * lm_rows, axis=1)
                    [:, None] - half_sq[None, :])
        grad_exponent = tl.where(block_valid & (exponent <= 0.0), grad_a * tl.exp(tl.minimum(exponent, 0.0)), 0.0)
        own = tl.dot(grad_exponent, lm, input_precision='ieee') - tl.sum(grad_exponent, axis=1)[:, None] * lm_rows
        tl.store(dl_ptr + g * M * D + rows[:, None] * D + cols[None, :], own,
                 mask=rows_ok[:, None] & (cols[None, :] < D))
        transposed += tl.dot(tl.trans(grad_exponent), lm_rows, input_precision='ieee')
        transposed -= tl.sum(grad_exponent, axis=0)[:, None] * lm
    tl.debug_barrier()  # every block's own rows stored before they are read back
    offsets = g * M * D + marks[:, None] * D + cols[None, :]
    mask = ok[:, None] & (cols[None, :] < D)
    tl.store(dl_ptr + offsets, tl.load(dl_ptr + offsets, mask=mask, other=0.0) + transposed, mask=mask)


@triton.jit
def sum_partials(part_ptr, g, splits, RP: tl.constexpr, CP: tl.constexpr):
    """The sum of group ``g``'s ``splits`` partial ``(RP, CP)`` float32 tiles, stored contiguously at ``part_ptr``
    as ``(groups, splits, RP, CP)`` (padded: what the split reductions write), in the order of the splits."""
    offsets = tl.arange(0, RP)[:, None] * CP + tl.arange(0, CP)[None, :]
    base = part_ptr + g * splits * RP * CP
    total = tl.zeros((RP, CP), dtype=tl.float32)
    for split in range(0, loop_bound(splits)):
        total += tl.load(base + split * RP * CP + offsets)
    return total


@triton.jit
def store_group_tile(ptr, tile, rows, cols, RP: tl.constexpr, CP: tl.constexpr):
    """:func:`load_group_tile`'s counterpart: the ``(rows, cols)`` corner of ``tile`` written to a group's contiguous
    matrix (``ptr`` at the group)."""
    r = tl.arange(0, RP)
    c = tl.arange(0, CP)
    tl.store(ptr + r[:, None] * cols + c[None, :], tile, mask=(r[:, None] < rows) & (c[None, :] < cols))


@triton.jit
def nystrom_fwd_kernel_mc(part_ptr, mid_ptr, ctx_ptr, mc_ptr, splits, M, DV, MP: tl.constexpr, DVP: tl.constexpr):
    """The forward's m×d factors from the context kernel's partial sums, one (sample, head) group per program.

    Grid ``(B * H,)``: ``context = sum of the splits' partials of K1^T v`` (``part_ptr``: ``(B*H, splits, MP, DVP)``
    float32) and ``middle_context = middle @ context`` (``mid_ptr``: contiguous ``(B*H, M, M)`` float32), IEEE
    float32, written contiguous ``(B*H, M, DV)`` to ``ctx_ptr`` and ``mc_ptr``."""
    g = tl.program_id(0)
    context = sum_partials(part_ptr, g, splits, MP, DVP)
    middle = load_group_tile(mid_ptr + g * M * M, M, M, MP, MP)
    store_group_tile(ctx_ptr + g * M * DV, context, M, DV, MP, DVP)
    store_group_tile(mc_ptr + g * M * DV, tl.dot(middle, context, input_precision='ieee'), M, DV, MP, DVP)


@triton.jit
def nystrom_bwd_kernel_dmid_dctx(part_ptr, mid_ptr, ctx_ptr, dmid_ptr, dctx_ptr, splits, M, DV, MP: tl.constexpr,
                                 DVP: tl.constexpr):
    """The backward's m×m and m×d gradients from the partial sums of ``K1^T grad_out``, one group per program.

    Grid ``(B * H,)``: ``gmc = sum of the splits' partials`` (the gradient of ``middle_context``; ``part_ptr`` as in
    :func:`nystrom_fwd_kernel_mc`), ``grad_middle = gmc context^T`` and ``grad_context = middle^T gmc`` (``mid_ptr``,
    ``ctx_ptr``: contiguous ``(B*H, M, M)`` and ``(B*H, M, DV)`` float32), IEEE float32, written contiguous to
    ``dmid_ptr`` and ``dctx_ptr``."""
    g = tl.program_id(0)
    grad_mc = sum_partials(part_ptr, g, splits, MP, DVP)
    context = load_group_tile(ctx_ptr + g * M * DV, M, DV, MP, DVP)
    store_group_tile(dmid_ptr + g * M * M, tl.dot(grad_mc, tl.trans(context), input_precision='ieee'), M, M, MP, MP)
    marks = tl.arange(0, MP)
    middle_t = load_f32(mid_ptr + g * M * M + marks[None, :] * M + marks[:, None],
                        (marks[:, None] < M) & (marks[None, :] < M))  # middle^T, loaded transposed
    store_group_tile(dctx_ptr + g * M * DV, tl.dot(middle_t, grad_mc, input_precision='ieee'), M, DV, MP, DVP)


@triton.jit
def nystrom_bwd_kernel_dl_sum(dl_sum_ptr, dl_colsum_ptr, l_ptr, dl_ptr, splits, M, D, MP: tl.constexpr,
                              DP: tl.constexpr):
    """The landmarks' gradient from :func:`nystrom_bwd_kernel_dq_dv_dl`'s partial sums, one group per program.

    Grid ``(B * H,)``: ``dl = sum(grad_s^T q) - l * sum(colsum(grad_s))`` over the splits (``dl_sum_ptr``:
    ``(B*H, splits, MP, DP)``, ``dl_colsum_ptr``: ``(B*H, splits, MP)`` float32; the landmarks contiguous ``(B*H, M,
    D)`` float32), written contiguous ``(B*H, M, D)`` float32 to ``dl_ptr``."""
    g = tl.program_id(0)
    total = sum_partials(dl_sum_ptr, g, splits, MP, DP)
    counts = tl.sum(sum_partials(dl_colsum_ptr, g, splits, MP, 1), axis=1)
    lm = load_group_tile(l_ptr + g * M * D, M, D, MP, DP)
    store_group_tile(dl_ptr + g * M * D, total - counts[:, None] * lm, M, D, MP, DP)
