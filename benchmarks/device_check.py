"""The prepared GPU check: the SOFT op's Triton backend tested on the device, then timed against the PyTorch paths
and softmax attention, then SOFT-Norm-Small against Swin-T and ConvNeXt-T — one command: parts 1-5 took 219 s on an
H200 (2026-12-04), part 7 keeps within its own budget (235 s), part 8 runs alone within its own (205 s).

    python benchmarks/device_check.py            # on a CUDA machine: parts 1-7, the tables, device_check.json
    python benchmarks/device_check.py --parts training --out training.json   # issues 53, 58: 255 s at most
    python benchmarks/device_check.py --parts graphs --out graphs.json       # then part 8 in a process of its own
    python benchmarks/device_check.py --smoke    # tiny sizes on CPU under TRITON_INTERPRET=1: checks the script runs

Needs torch, triton and timm only (no mm* package, no network): it imports the op layer, the pyramid and the
benchmarks' harness (beside it), which import with torch and timm alone. Run it from the repository root or from
anywhere (``python /path/to/soft_mm/benchmarks/device_check.py``: the harness it imports puts its own checkout first on
``sys.path``), or install the checkout offline first, without build isolation (which would fetch setuptools from an
index)::

    PYTHONPATH=/path/to/soft_mm python /path/to/soft_mm/benchmarks/device_check.py
    pip install --no-deps --no-build-isolation -e /path/to/soft_mm   # or this, then python benchmarks/device_check.py

(the install needs setuptools >= 77 already installed there, for pyproject's ``license = "MIT"``; checked offline
with ``--no-index`` against setuptools 81).

The JSON file is rewritten after each part (and after each correctness case and each row of parts 7 and 8), so a
crash or a timeout keeps what was measured; a case or a part that raises is recorded with its error and the check goes
on. Every timed call of a model enters its own autocast region, as a training or test loop does per step, so no model
reuses autocast's cached weight casts from an earlier call.

First, which calls the Triton backend takes on this device (``targets``): its compute capability (or, under ROCm, its
AMD architecture) and shared memory per block, and the backend chosen at the published sizes and at the largest
declared corner, float32 and bfloat16 / float16 autocast, inference and training, with the reason where the Triton
backend declines (a GPU it is not built for, an AMD GPU, a triton older than the target is checked with, bfloat16
below sm_80, a kernel over the device's shared memory), and each ``BackendFallbackWarning`` a model's eager calls
would raise, in its words.

Parts:

1. correctness on the device: the Triton backend's outputs and gradients against the float64 reference at
   (N, m) = (1, 1), (63, 49), (300, 1), (300, 49), (4097, 49), d = 32, and at the backend's declared corners
   (m = MAX_LANDMARKS with d = MAX_HEAD_DIM, m = 1 with d = 16: the largest and the smallest tiles, launched on the
   device's real shared memory) (float32 within 3e-5, also with TF32 switched on globally as training scripts do;
   bfloat16 and float16 within half the error of the plain math in that dtype or twice the exact result's own
   rounding to it, the FlashAttention rule of :mod:`soft_mm.testing.error_rule`); the exit status is 1 if any case
   fails; a corner the dispatcher does not hand this device's Triton backend is recorded with the reason instead;
2. the op at 16k, 67k and 267k tokens (batch 2, 2 heads, d = 32, m = 49, SOFT-Norm), bfloat16, float16 and float32,
   forward and forward+backward: Triton, the reference PyTorch math, and ``scaled_dot_product_attention`` on the same
   q, v (softmax attention, what SOFT replaces), each with its peak memory, and the Triton time against the time to
   move q, v and the output once through memory at the device's measured copy bandwidth;
3. backbones at batch 2 x 800x1344 under bfloat16 autocast, forward and forward+backward, peak memory
   (:func:`harness.build_backbone`: SOFT-Norm-Small, timm's Swin-T and ConvNeXt-T);
4. SOFT-Norm-Small's backbone under ``torch.compile(fullgraph=True)`` (inductor; the SOFT op's Triton custom ops
   inside the one graph), bfloat16 autocast, forward: the compile time, the compiled and the eager time, and the
   largest difference of the compiled maps from the eager ones (relative to each map's largest value); ``--smoke``
   traces with the ``eager`` backend (the one graph, without inductor's code generation);
5. the Triton kernels compiled for sm_80, sm_90 and the device's own architecture (cubins, no launch): registers
   and spilled bytes per kernel and dtypes (:mod:`triton_cubins`, the table its test holds at 0 spills);
6. where the eager bfloat16 forward's time goes: SOFT-Norm-Small and Swin-T under ``torch.profiler``, the operators
   with the most device time, the kernels per forward and their summed time beside the wall time;
7. the training table (:func:`bench_training`, :mod:`device_training`), in order of value: the eager training step
   of SOFT-Norm-Small, Swin-T and ConvNeXt-T at batch 2 x 800x1344, 1 and 2 x 1600x2688, the host's time per Triton
   launch (the launch plans against ``kernel[grid]``), the op's forward+backward at 67k tokens, the whole RetinaNet
   step (torchvision's, AdamW), the compiled step of Swin-T then SOFT-Norm-Small, then ConvNeXt-T compiled if time is
   left; bfloat16 autocast; then one summary line per target of issues 53 and 58 (met, not met, not measured). The
   plan is printed with its estimate (what does not fit is dropped first, from the end); a case starts only where its
   estimate fits the time left, and stops between calls (or, inside a call, after a grace) when the part's budget is
   spent, keeping what it measured;
8. ``graphs``, only when named and best in a process of its own (:func:`bench_graphs`): SOFT-Norm-Small with
   ``compile_stages`` trained on two sizes in turn as CUDA graphs (``mode='reduce-overhead'``, ``pad_size_divisor``
   where the pyramid takes it), with the graphs compiled and the CUDA graphs captured before and after the sizes have
   been seen (recompiles, re-records), then two accumulated micro-batches' gradients against an eager copy's; the
   RetinaNet step with SOFT's stages as CUDA graphs beside Swin-T's eager one;
   then ``dynamic=True``.

``--parts correctness profile`` (any of the eight, by name) runs only those, e.g. a rerun within a short lease;
``--budget-s`` sets the time budget of parts 7 and 8.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

if '--smoke' in sys.argv:  # the interpreter must be chosen before triton is imported
    os.environ.setdefault('TRITON_INTERPRET', '1')

import torch
import torch.nn.functional as F
from device_training import (
    AUTOCAST_DTYPE,
    TRAINING_FULL,
    TRAINING_SMOKE,
    Case,
    backbone_step,
    estimate_plan,
    format_plan,
    format_summary,
    graphs_plan,
    run_plan,
    summarize,
    training_plan,
)
from harness import PeakMemory, build_backbone, in_autocast, median_time
from triton_cubins import format_table, resource_usage

import soft_mm
from soft_mm.ops import naive_soft_attention, soft_attention
from soft_mm.ops.precision import float32_matmul_precision
from soft_mm.ops.precision.soft_policy import precision_policy
from soft_mm.ops.soft.backends.triton.backend import TRITON, unsupported_reason
from soft_mm.ops.soft.backends.triton.nystrom_config import MAX_HEAD_DIM, MAX_LANDMARKS
from soft_mm.ops.soft.dispatch import Call, select
from soft_mm.ops.triton_route import device_limits, triton_available
from soft_mm.testing import outputs_and_grads, relative_error, rule_errors, rule_inputs
from soft_mm.utils.atomic import atomic_write_text

FULL = dict(check_cases=((1, 1), (63, 49), (300, 1), (300, 49), (4097, 49)), corner_tokens=300,
            op_tokens=(16384, 66816, 267264), batch=2, heads=2, head_dim=32, landmarks=49, image=(800, 1344), repeats=5,
            **TRAINING_FULL)  # parts 7 and 8 (device_training.py)
SMOKE = dict(check_cases=((1, 1), (63, 9), (130, 1)), corner_tokens=130, op_tokens=(200,), batch=1, heads=2,
             head_dim=32, landmarks=9, image=(64, 96), repeats=1, **TRAINING_SMOKE)
# (m, d) at the Triton backend's declared limits: the largest tiles (every kernel's shared memory at its most) and the
# smallest; run after the check cases at cfg['corner_tokens'] (a partial last block of every kernel: 300 on the GPU,
# 130 under --smoke, where the interpreter's time grows with the tokens)
CORNER_CASES = ((MAX_LANDMARKS, MAX_HEAD_DIM), (1, 16))
SETTINGS = dict(soft_norm=True, ridge=0.01)  # SOFT-Norm with the published models' ridge
BACKBONES = ('soft_norm_small', 'swin_t', 'convnext_t')


def op_inputs(tokens: int, landmarks: int, cfg: dict, device: torch.device, dtype: torch.dtype, seed: int = 0,
              head_dim: int | None = None):
    """``[q, landmarks, v, grad_out]`` of the FlashAttention rule (a trained layer's magnitudes), drawn in float64;
    ``head_dim`` defaults to the configuration's."""
    (q, lm, v), grad = rule_inputs(tokens, landmarks, head_dim or cfg['head_dim'], cfg['batch'], cfg['heads'],
                                   seed=seed, dtype=torch.float64)
    return [t.to(device=device, dtype=dtype) for t in (q, lm, v, grad)]


def triton_refusal(device: torch.device, tokens: int, landmarks: int, head_dim: int, products: torch.dtype | None,
                   needs_grad: bool) -> str | None:
    """Why the Triton backend would refuse a call on ``device`` even when forced (None: it takes it); ``products``
    None for float32 inputs, else the autocast dtype."""
    policy = precision_policy(device.type, products or torch.float32)
    call = Call(device.type, torch.float32, policy, tokens, needs_grad, 'eager', landmarks, head_dim, head_dim,
                device.index)
    return ', '.join(TRITON.unsupported_reasons(call, forced=True)) or None


def target_decisions(cfg: dict, device: torch.device) -> list[dict]:
    """The dispatcher's choice on this device at the published sizes and at the backend's largest declared corner, for
    float32 and bfloat16 / float16 autocast, inference and training: the backend taken automatically and, where it is
    not the Triton backend, why (the device's platform, capability and shared memory per block decide: see
    ``soft_mm/ops/soft/backends/triton/nystrom_limits.py``), with the ``BackendFallbackWarning`` a model's eager call
    raises there (:func:`~soft_mm.ops.soft.dispatch.decide`), printed in its words. Printed first, recorded as
    ``targets``."""
    import warnings  # (here, not at the top: the rest of this file is another change's)

    from soft_mm.ops.soft.dispatch import BackendFallbackWarning, decide
    if device.type == 'cuda':
        limits = device_limits(device.index)
        print(f'  {limits}: {"AMD GPU under ROCm, reported" if limits.platform == "rocm" else "compute"} capability '
              f'{limits.capability[0]}.{limits.capability[1]}, {limits.shared_memory_per_block:,} B of shared memory '
              'per block', flush=True)
    tokens = cfg['op_tokens'][0]
    rows = []
    corners = (('published', (cfg['landmarks'], cfg['head_dim'])), ('corner', (MAX_LANDMARKS, MAX_HEAD_DIM)))
    for sizes, (m, d) in corners:
        for dtype_name, products in (('float32', None), ('bfloat16', torch.bfloat16), ('float16', torch.float16)):
            for needs_grad in (False, True):
                policy = precision_policy(device.type, products or torch.float32)
                call = (device.type, torch.float32, policy, tokens, needs_grad, 'eager')
                where = dict(num_landmarks=m, head_dim=d, value_dim=d, device_index=device.index)
                backend, _ = select(*call, **where)
                with warnings.catch_warnings(record=True) as told:  # what the op's eager decision says (once)
                    warnings.simplefilter('always', BackendFallbackWarning)
                    decide(*call, **where)
                reason = None if backend.name == 'triton' else triton_refusal(device, tokens, m, d, products,
                                                                              needs_grad)
                announced = [str(w.message) for w in told if issubclass(w.category, BackendFallbackWarning)]
                rows.append(dict(sizes=sizes, landmarks=m, head_dim=d, dtype=dtype_name, training=needs_grad,
                                 backend=backend.name, triton_reason=reason, warnings=announced))
                print(f"  m={m:>2} d={d:>2} {dtype_name:<8} {'training ' if needs_grad else 'inference'}: "
                      f"{backend.name}{f' (triton {reason})' if reason else ''}", flush=True)
                for message in announced:
                    print(f'    BackendFallbackWarning: {message}', flush=True)
    return rows


def check_case(tokens: int, landmarks: int, head_dim: int, cfg: dict, device: torch.device) -> dict:
    """One correctness case (see :func:`check_correctness`)."""
    def fused(*t):
        return soft_attention(*t, backend='triton', **SETTINGS)

    def reference32(*t):
        return soft_attention(*t, backend='reference', **SETTINGS)

    *tensors, grad = op_inputs(tokens, landmarks, cfg, device, torch.float64, head_dim=head_dim)
    exact = outputs_and_grads(lambda *t: naive_soft_attention(*t, **SETTINGS), tensors, grad)

    def float32_error(fn: Callable) -> float:
        results = outputs_and_grads(fn, [t.float() for t in tensors], grad.float())
        return max(relative_error(a, b) for a, b in zip(results, exact))

    err32 = float32_error(fused)
    with float32_matmul_precision('tf32'):  # as a training script with allow_tf32 = True: the op must not see it
        tf32 = float32_error(fused)
    ref32 = float32_error(reference32)
    row = dict(float32_error=err32, float32_error_tf32_on=tf32, reference_float32_error=ref32)
    ok = max(err32, tf32) <= max(3e-5, 4 * ref32)
    line = f'float32 {err32:.1e} (TF32 on globally {tf32:.1e}, reference backend {ref32:.1e})'
    for name, dtype in (('bf16', torch.bfloat16), ('f16', torch.float16)):
        errors = rule_errors(fused, [t.to(dtype) for t in tensors], dtype, grad.to(dtype), **SETTINGS)
        ok = ok and errors.holds()
        row.update({f'{name}_errors': errors.fast, f'plain_{name}_errors': errors.plain,
                    f'rounded_{name}_errors': errors.rounded})
        ratio = max(e / p for e, p in zip(errors.fast, errors.plain))
        line += (f'; {str(dtype).replace("torch.", "")} {max(errors.fast):.1e}, at most {ratio:.2f}x the plain '
                 f'math\'s, {errors.worst():.2f} of the bound')
    print(f"  N={tokens:>5} m={landmarks:>2} d={head_dim:>3}: {line} {'ok' if ok else 'FAIL'}", flush=True)
    return dict(row, ok=ok)


def check_correctness(cfg: dict, device: torch.device, report: Report) -> list[dict]:
    """float32: within 3e-5 of float64 (or 4x the reference backend's float32 error, where the landmark kernel's
    conditioning amplifies rounding); bfloat16 and float16: every error at most half the plain math's in that dtype,
    both measured against float64 on the same rounded inputs (the FlashAttention rule). A case that raises is recorded
    (``ok`` False, its error) and the next one runs; the report is saved after each case."""
    rows = report.part('correctness')
    device = torch.device(device)
    cases = ([(tokens, landmarks, cfg['head_dim']) for tokens, landmarks in cfg['check_cases']]
             + [(cfg['corner_tokens'], landmarks, head_dim) for landmarks, head_dim in CORNER_CASES])
    for tokens, landmarks, head_dim in cases:
        row = dict(tokens=tokens, landmarks=landmarks, head_dim=head_dim)
        refused = triton_refusal(device, tokens, landmarks, head_dim, None, True) if device.type == 'cuda' else None
        if refused:  # e.g. a GPU with less shared memory: the reference math takes the call
            row.update(ok=True, refused=refused)
            print(f'  N={tokens:>5} m={landmarks:>2} d={head_dim:>3}: not taken by the Triton backend here '
                  f'(it {refused})', flush=True)
            rows.append(row)
            report.save()
            continue
        try:
            row.update(check_case(tokens, landmarks, head_dim, cfg, device))
        except Exception as err:  # recorded, and the check goes on
            row.update(ok=False, error=error_line(err))
            print(f'  N={tokens:>5} m={landmarks:>2} d={head_dim:>3}: FAIL, {row["error"]}', flush=True)
        rows.append(row)
        report.save()
    return rows


def measure(row: dict, forward: Callable, forward_backward: Callable, device: torch.device, repeats: int) -> dict:
    """Fill ``row`` with the forward time (no grad), the forward+backward time and its peak memory, or the error
    (out of memory, an unsupported size); prints it."""
    try:
        with torch.no_grad():
            row['fwd_ms'] = 1e3 * median_time(forward, device, repeats)
        memory = PeakMemory(device)
        memory.start()
        row['fwd_bwd_ms'] = 1e3 * median_time(forward_backward, device, repeats)
        row['peak_mib'] = memory.peak_mib()
    except Exception as err:  # out of memory, an unsupported size, a kernel that fails: recorded
        row['error'] = error_line(err)
    print('  ' + ', '.join(f'{k}={v:.4g}' if isinstance(v, float) else f'{k}={v}' for k, v in row.items()), flush=True)
    return row


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a large device-to-device copy (read + write)."""
    x = torch.empty(256 * 2 ** 20, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    seconds = median_time(lambda: y.copy_(x), device, 5)
    return 2 * x.numel() / seconds


# part 2's methods on the same (q, landmarks, v): the Triton backend, the reference PyTorch math, softmax attention
OP_METHODS: dict[str, Callable] = {
    'triton': lambda q, lm, v: soft_attention(q, lm, v, backend='triton', **SETTINGS),
    'reference': lambda q, lm, v: soft_attention(q, lm, v, backend='reference', **SETTINGS),
    'sdpa': lambda q, lm, v: F.scaled_dot_product_attention(q, q, v),
}


def op_row(method: str, inputs: list[torch.Tensor], cfg: dict, device: torch.device) -> dict:
    """One method of :data:`OP_METHODS` on ``inputs`` (:func:`op_inputs`): forward, forward+backward, peak memory
    (:func:`measure`)."""
    q, lm, v, grad = inputs
    fn = OP_METHODS[method]
    leaves = [t.detach().clone().requires_grad_() for t in (q, lm, v)]
    return measure(dict(dtype=str(q.dtype).replace('torch.', ''), tokens=q.shape[-2], method=method),
                   lambda: fn(q, lm, v), lambda: torch.autograd.backward(fn(*leaves), grad), device, cfg['repeats'])


def bench_op(cfg: dict, device: torch.device) -> list[dict]:
    rows = []
    bandwidth = copy_bandwidth(device)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for tokens in cfg['op_tokens']:
            inputs = op_inputs(tokens, cfg['landmarks'], cfg, device, dtype)
            moved = 3 * inputs[0].numel() * inputs[0].element_size()  # q, v and the output, once
            for name in OP_METHODS:
                row = op_row(name, inputs, cfg, device)
                if name == 'triton' and 'fwd_ms' in row:
                    row['fwd_vs_memory_time'] = row['fwd_ms'] / (1e3 * moved / bandwidth)
                    print(f"    triton forward = {row['fwd_vs_memory_time']:.2f}x the time to move q, v and the "
                          f'output once ({bandwidth / 1e9:.0f} GB/s copy bandwidth)', flush=True)
                rows.append(row)
    return rows


def bench_backbones(cfg: dict, device: torch.device) -> list[dict]:
    rows = []
    image = cfg['image']
    x = torch.randn(cfg['batch'], 3, *image, device=device)
    for name in BACKBONES:
        model = build_backbone(name, image).to(device)
        # each call in its own autocast region: no model reuses another call's weight casts
        rows.append(measure(dict(model=name, input=f"{cfg['batch']}x{image[0]}x{image[1]}"),
                            in_autocast(lambda model=model: model.eval()(x), device.type, AUTOCAST_DTYPE),
                            backbone_step(model, model, x), device, cfg['repeats']))
        model.cpu()
    return rows


def compiled_backbone(cfg: dict, device: torch.device, backend: str) -> list[dict]:
    """Part 4: SOFT-Norm-Small's backbone in one graph (``fullgraph=True``), ``backend`` (inductor on the device),
    bfloat16 autocast, against the same model eager."""
    image = cfg['image']
    x = torch.randn(cfg['batch'], 3, *image, device=device)
    model = build_backbone('soft_norm_small', image).to(device).eval()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    row = dict(model='soft_norm_small', input=f"{cfg['batch']}x{image[0]}x{image[1]}", backend=backend)
    compiled_fwd = in_autocast(lambda: compiled(x), device.type, AUTOCAST_DTYPE)  # an autocast region per call
    eager_fwd = in_autocast(lambda: model(x), device.type, AUTOCAST_DTYPE)
    with torch.no_grad():
        start = time.perf_counter()
        maps = compiled_fwd()
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
        row['compile_s'] = time.perf_counter() - start
        eager = eager_fwd()
        row['max_rel_diff'] = max(float((a.float() - b.float()).abs().max() / b.float().abs().max())
                                  for a, b in zip(maps, eager))
        row['compiled_fwd_ms'] = 1e3 * median_time(compiled_fwd, device, cfg['repeats'])
        row['eager_fwd_ms'] = 1e3 * median_time(eager_fwd, device, cfg['repeats'])
    print('  ' + ', '.join(f'{k}={v:.4g}' if isinstance(v, float) else f'{k}={v}' for k, v in row.items()), flush=True)
    return [row]


def profile_forward(cfg: dict, device: torch.device) -> list[dict]:
    """Part 6: where the eager bfloat16 forward's time goes (SOFT-Norm-Small and Swin-T, ``torch.profiler``, three
    forwards): the operators with the most device time, the kernels launched per forward and their summed time beside
    the forward's wall time (a wall time well above the kernels' is time the GPU waits for Python to launch them).
    Each forward enters its own autocast region, so the peers pay their weight casts in every forward as SOFT does."""
    from torch.profiler import ProfilerActivity, profile

    image = cfg['image']
    x = torch.randn(cfg['batch'], 3, *image, device=device)
    on_gpu = device.type == 'cuda'
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    time_key = 'self_device_time_total' if on_gpu else 'self_cpu_time_total'
    rows, runs = [], 3
    for name in BACKBONES[:2]:
        model = build_backbone(name, image).to(device).eval()
        forward = in_autocast(lambda model=model: model(x), device.type, AUTOCAST_DTYPE)
        with torch.no_grad():
            wall_ms = 1e3 * median_time(forward, device, cfg['repeats'])
            with profile(activities=activities) as prof:
                for _ in range(runs):
                    forward()
                if on_gpu:
                    torch.cuda.synchronize(device)
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        averages = sorted(prof.key_averages(), key=lambda e: getattr(e, time_key), reverse=True)
        top = [dict(op=e.key[:60], ms=getattr(e, time_key) / 1e3 / runs, calls=e.count / runs) for e in averages[:15]]
        row = dict(model=name, input=f"{cfg['batch']}x{image[0]}x{image[1]}", wall_fwd_ms=wall_ms,
                   kernels_per_fwd=len(kernels) / runs,
                   kernel_ms_per_fwd=sum(e.time_range.elapsed_us() for e in kernels) / 1e3 / runs, top=top)
        print(f"  {name}: wall {wall_ms:.2f} ms a forward, {row['kernels_per_fwd']:.0f} kernels summing to "
              f"{row['kernel_ms_per_fwd']:.2f} ms", flush=True)
        for entry in top:
            print(f"    {entry['ms']:8.3f} ms {entry['calls']:6.1f}x  {entry['op']}", flush=True)
        rows.append(row)
        model.cpu()
    return rows


def op_target(cfg: dict, device: torch.device, case: Case) -> dict:
    """The training table's op row: part 2's Triton forward and forward+backward at ``case.tokens`` in bfloat16."""
    return op_row(case.model, op_inputs(case.tokens, cfg['landmarks'], cfg, device, torch.bfloat16), cfg, device)


def bench_training(cfg: dict, device: torch.device, report: Report, budget_s: float | None = None) -> list[dict]:
    """Part 7, the table that answers issue 53's targets (:mod:`device_training`): the plan printed with its estimate,
    each row written to the report as it comes, within ``budget_s`` (default ``cfg['training_budget_s']``), then the
    summary, one line per target (printed, and the report's ``summary``)."""
    cases = training_plan(cfg)
    budget_s = cfg['training_budget_s'] if budget_s is None else budget_s
    _print_plan('the training plan', training_plan, FULL)
    rows = report.part('training')
    run_plan(cases, cfg, device, budget_s, rows, report.save, op_case=lambda case: op_target(cfg, device, case))
    report.data['summary'] = summarize(rows, cfg)
    print(format_summary(report.data['summary']), flush=True)
    return rows


def bench_graphs(cfg: dict, device: torch.device, report: Report, budget_s: float | None = None) -> list[dict]:
    """Part 8, in a process of its own: SOFT-Norm-Small's compile_stages on two sizes in turn as CUDA graphs, the
    RetinaNet step with SOFT's stages graphed beside Swin-T's eager one, then compile_stages with dynamic shapes
    (:func:`device_training.graphs_plan`), within ``budget_s`` (default ``cfg['graphs_budget_s']``); the summary of
    the targets its rows answer."""
    budget_s = cfg['graphs_budget_s'] if budget_s is None else budget_s
    _print_plan('the graphs plan', graphs_plan, FULL)
    rows = run_plan(graphs_plan(cfg), cfg, device, budget_s, report.part('graphs'), report.save)
    report.data['graphs_summary'] = summarize(rows, cfg)
    print(format_summary(report.data['graphs_summary']), flush=True)
    return rows


def _print_plan(title: str, plan: Callable[[dict], list[Case]], cfg: dict) -> None:
    """A plan at the GPU's sizes with its estimate (also under --smoke, which runs the same cases at tiny sizes)."""
    cases = plan(cfg)
    budget_key = 'training_budget_s' if plan is training_plan else 'graphs_budget_s'
    print(format_plan(f'{title} on a GPU', cases, estimate_plan(cases, cfg), cfg[budget_key]), flush=True)


def compiled_kernels(device: torch.device) -> list[dict]:
    """Registers and spills of every kernel compiled for sm_80, sm_90 and the device's architecture; prints the
    table."""
    archs = {80, 90}
    if device.type == 'cuda':
        major, minor = torch.cuda.get_device_capability(device)
        archs.add(10 * major + minor)
    rows = resource_usage(tuple(sorted(archs)))
    print(format_table(rows), flush=True)
    return rows


def error_line(err: BaseException) -> str:
    """``'Type: first line of the message'``, at most 200 characters."""
    lines = str(err).splitlines()
    return f'{type(err).__name__}: {lines[0] if lines else ""}'[:200]


class Report:
    """The JSON report, rewritten (atomically) whenever a part or a correctness case is done."""

    def __init__(self, path: str, **facts) -> None:
        self.path = Path(path)
        self.data: dict = dict(facts)

    def part(self, name: str) -> list:
        self.data[name] = []
        return self.data[name]

    def save(self) -> None:
        atomic_write_text(self.path, json.dumps(self.data, indent=1))

    def run_part(self, name: str, fn: Callable[[], list]) -> None:
        """``fn()``'s rows under ``name``; if it raises, the error and its traceback are recorded instead."""
        try:
            self.data[name] = fn()
        except Exception as err:  # recorded; the next part runs
            self.data[f'{name}_error'] = error_line(err)
            traceback.print_exc()
        self.save()


PARTS = ('correctness', 'op', 'backbones', 'compile', 'cubins', 'profile', 'training', 'graphs')
# 'graphs' only when named, in a run of its own (parts 1-7 take about 7.5 minutes together)
DEFAULT_PARTS = PARTS[:-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--smoke', action='store_true', help='tiny sizes on CPU under the Triton interpreter')
    parser.add_argument('--out', default='device_check.json')
    parser.add_argument('--parts', nargs='+', choices=PARTS, default=list(DEFAULT_PARTS), metavar='PART',
                        help=f'the parts to run, in their order, of {", ".join(PARTS)} (default: all but graphs, '
                             'which runs alone: --parts graphs)')
    parser.add_argument('--budget-s', type=float, default=None, metavar='SECONDS',
                        help='the time budget of the training and graphs parts, each (default: '
                             f"{FULL['training_budget_s']} and {FULL['graphs_budget_s']} s on a GPU)")
    args = parser.parse_args(argv)
    if args.budget_s is not None and args.budget_s <= 0:
        parser.error(f'--budget-s must be > 0, got {args.budget_s:g}')
    cfg = SMOKE if args.smoke else FULL
    device = torch.device('cpu' if args.smoke else 'cuda')
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise SystemExit('device_check: no CUDA device; run it on a GPU machine (or --smoke on CPU)')
    if not triton_available():  # e.g. torch < 2.8, which ships an older triton than the kernels need
        raise SystemExit(f'device_check: the Triton backend {unsupported_reason(device.type, forced=True)}; '
                         f'nothing to check with torch {torch.__version__}')
    name = torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu (Triton interpreter)'
    print(f'device {name}, torch {torch.__version__}', flush=True)
    report = Report(args.out, device=name, torch=torch.__version__, soft_mm=str(Path(soft_mm.__file__).parent))
    print('the Triton backend on this device (the backend each call gets, and why)', flush=True)
    report.run_part('targets', lambda: target_decisions(cfg, device))
    parts = {
        'correctness': ('Triton backend against the float64 reference', lambda: check_correctness(cfg, device, report)),
        'op': ('the SOFT op', lambda: bench_op(cfg, device)),
        'backbones': ('backbones, bfloat16 autocast', lambda: bench_backbones(cfg, device)),
        'compile': ('SOFT-Norm-Small in one compiled graph, bfloat16 autocast',
                    lambda: compiled_backbone(cfg, device, 'eager' if args.smoke else 'inductor')),
        'cubins': ('the Triton kernels compiled (registers / spilled bytes per thread)',
                   lambda: compiled_kernels(device)),
        'profile': ('where the eager bfloat16 forward\'s time goes', lambda: profile_forward(cfg, device)),
        'training': ('the training step: eager, the op, compiled, RetinaNet; the targets',
                     lambda: bench_training(cfg, device, report, args.budget_s)),
        'graphs': ('compile_stages on two sizes in turn: dynamic shapes, CUDA graphs',
                   lambda: bench_graphs(cfg, device, report, args.budget_s)),
    }
    for number, part in enumerate(PARTS, 1):
        if part in args.parts:
            title, run = parts[part]
            print(f'{number}. {title}', flush=True)
            report.run_part(part, run)
    print(f'wrote {args.out}')
    if 'correctness' not in args.parts:
        return 0
    correctness = report.data.get('correctness', [])
    return 0 if correctness and all(r['ok'] for r in correctness) else 1


if __name__ == '__main__':
    sys.exit(main())
