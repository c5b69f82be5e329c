"""The four ways a backbone runs on a CPU, side by side: ``benchmarks/backbones.py --modes``.

    python benchmarks/backbones.py --modes float32 bfloat16 compile onnxruntime \
        --models soft_norm_small swin_t convnext_t --sizes 800x1344 1600x2688 --rounds 3

Modes (forward only, batch 1, no gradients):

* ``float32``: PyTorch eager.
* ``bfloat16``: PyTorch eager under ``torch.autocast('cpu', torch.bfloat16)``.
* ``compile``: ``torch.compile`` (inductor, float32, weight freezing: :func:`harness.inductor_freezing`), every model
  compiled the same way; the first call's time (the compilation) is reported apart.
* ``compile-autotune``: the same with ``mode='max-autotune'``: inductor benchmarks its own C++ GEMM template (the
  epilogue, e.g. GELU or a residual add, fused into it) against the library's GEMM for each linear and keeps the
  faster; several minutes of compilation per model on two cores.
* ``onnxruntime``: float32 ONNX run by onnxruntime's CPU provider with as many threads as PyTorch uses; every model
  exported the way its users export it: SOFT by ``tools/deployment/export_onnx.py`` (torch's dynamo exporter, dynamic
  batch, height and width, recorded at the tool's default size), the others by torch's TorchScript-based exporter at
  the benchmark size (opset 17). The export and the session's creation are reported apart.

One fresh process per (mode, size) builds every model (seeded alike), prepares each for the mode, measures the GEMM
rate of the mode's dtype (a square matmul), and then runs ``--rounds`` rounds, each timing every model ``--repeats``
times after a warm-up, the models interleaved within a round so that drift hits all of them alike. A model's time is
the median over its rounds of the median of each round. Ratios are the other model's time over the first SOFT
model's (above 1: SOFT faster), computed within one process.

With ``--profile`` the first SOFT model's forward is also profiled in each mode (``torch.profiler`` for the PyTorch
modes, onnxruntime's own profiler for ``onnxruntime``), and the operators with the most self time are tabulated.
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness
import torch
from torch import nn

MODES = ('float32', 'bfloat16', 'compile', 'compile-autotune', 'onnxruntime')
MODE_DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'compile': torch.float32,
               'compile-autotune': torch.float32, 'onnxruntime': torch.float32}
COMPILE_MODES = {'compile': None, 'compile-autotune': 'max-autotune'}  # the mode torch.compile is given
PROFILE_ROWS = 12
ORT_PROFILE_WARMUPS = 3  # onnxruntime runs before the profiled one
REPO_ROOT = Path(__file__).resolve().parents[1]


def _export_tool() -> Any:
    """``tools/deployment/export_onnx.py`` as a module (the tools are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location('export_onnx', REPO_ROOT / 'tools/deployment/export_onnx.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def export_onnx(name: str, model: nn.Module, x: torch.Tensor, path: Path) -> None:
    """Write ``model`` to ``path`` as its users would: SOFT by the project's export tool, the others by torch's
    TorchScript-based exporter at the input's size."""
    if name in harness.SOFT_BACKBONES:
        model.in_channels = x.shape[1]
        _export_tool().export(model, path)
        return
    with torch.no_grad():
        torch.onnx.export(_export_tool()._TupleOutputs(model).eval(), (x,), str(path), input_names=['input'],
                          opset_version=17, dynamo=False)


def onnx_session(path: Path, profile_prefix: str | None = None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return ort.InferenceSession(str(path), options, providers=['CPUExecutionProvider'])


def prepare(mode: str, name: str, model: nn.Module, x: torch.Tensor, workdir: Path) -> Callable[[], Any]:
    """The forward of ``model`` on ``x`` in ``mode``, as a no-argument callable (built, compiled or exported here)."""
    if mode in ('float32', 'bfloat16'):
        autocast = harness.autocast_to('cpu', MODE_DTYPES[mode])

        def eager() -> Any:
            with torch.no_grad(), autocast:
                return model(x)
        return eager
    if mode in COMPILE_MODES:
        compiled = torch.compile(model, mode=COMPILE_MODES[mode])

        def run_compiled() -> Any:
            with torch.no_grad(), harness.inductor_freezing():
                return compiled(x)
        return run_compiled
    path = workdir / f'{name}.onnx'
    export_onnx(name, model, x, path)
    session = onnx_session(path)
    feed = {session.get_inputs()[0].name: x.numpy()}
    return lambda: session.run(None, feed)


def torch_profile(fn: Callable[[], Any]) -> list[tuple[str, float, int]]:
    """``(operator, self CPU ms, calls)`` of one call of ``fn``, most self time first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    rows = [(e.key, e.self_cpu_time_total / 1e3, e.count) for e in prof.key_averages()]
    return sorted(rows, key=lambda r: -r[1])


def onnx_profile(path: Path, x: torch.Tensor, workdir: Path) -> list[tuple[str, float, int]]:
    """``(node op type, ms, nodes run)`` of one onnxruntime run of ``path`` after :data:`ORT_PROFILE_WARMUPS` runs,
    most time first (a fresh session's first runs also touch fresh memory: beside the timed sessions, SOFT-Norm-Small's
    element-wise nodes took 2-10x their steady time in the second run)."""
    session = onnx_session(path, str(workdir / 'ort_profile'))
    feed = {session.get_inputs()[0].name: x.numpy()}
    for _ in range(ORT_PROFILE_WARMUPS + 1):
        session.run(None, feed)
    trace = json.loads(Path(session.end_profiling()).read_text())
    # the last run's node events ('cat': 'Node', name '<node>_kernel_time')
    runs = [e for e in trace if e.get('cat') == 'Session' and e.get('name') == 'model_run']
    start = runs[-1]['ts'] if runs else 0
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for event in trace:
        if event.get('cat') == 'Node' and event.get('name', '').endswith('_kernel_time') and event['ts'] >= start:
            op = event.get('args', {}).get('op_name', '?')
            totals[op][0] += event['dur'] / 1e3
            totals[op][1] += 1
    return sorted(((op, ms, int(n)) for op, (ms, n) in totals.items()), key=lambda r: -r[1])


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One (mode, size): every model prepared, then ``rounds`` interleaved rounds of ``repeats`` timed forwards."""
    mode, (h, w), names = spec['mode'], spec['hw'], spec['models']
    device = torch.device('cpu')
    result: dict[str, Any] = dict(mode=mode, hw=[h, w], threads=torch.get_num_threads(), models={})
    result['gemm_gflops'] = harness.gemm_gflops(device, MODE_DTYPES[mode], spec['gemm_size'])
    x = torch.randn(1, 3, h, w)
    runners = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for name in names:
            torch.manual_seed(0)
            model = harness.build_backbone(name, (h, w)).eval()
            start = time.perf_counter()
            fn = prepare(mode, name, model, x, workdir)
            prepared = time.perf_counter() - start
            first = harness.timed(fn, device)  # the warm-up; compilation happens here
            runners[name] = fn
            result['models'][name] = dict(params=sum(p.numel() for p in model.parameters()), prepare_s=prepared,
                                          first_call_s=first, round_s=[])
        for _ in range(spec['rounds']):
            for name in names:
                times = [harness.timed(runners[name], device) for _ in range(spec['repeats'])]
                result['models'][name]['round_s'].append(statistics.median(times))
        for row in result['models'].values():
            row['fwd_s'] = statistics.median(row['round_s'])
        soft = next((n for n in names if n in harness.SOFT_BACKBONES), None)
        if spec.get('profile') and soft is not None:
            if mode == 'onnxruntime':
                result['profile'] = onnx_profile(workdir / f'{soft}.onnx', x, workdir)[:PROFILE_ROWS]
            else:
                result['profile'] = torch_profile(runners[soft])[:PROFILE_ROWS]
            result['profile_model'] = soft
    return result


def markdown(results: list[dict[str, Any]], models: list[str], header: str) -> str:
    """The times per mode and size, the ratios against the first SOFT model, the preparation times, the GEMM rates
    and (when profiled) SOFT's operators with the most self time."""
    soft = next((m for m in models if m in harness.SOFT_BACKBONES), models[0])
    others = [m for m in models if m != soft]
    lines = [header, '', '| mode | input | GEMM GFLOP/s | ' + ' | '.join(f'{m} s' for m in models) + ' | '
             + ' | '.join(f'{m} / {soft}' for m in others) + ' |', '|---' * (3 + len(models) + len(others)) + '|']
    for r in results:
        times = {m: r['models'][m]['fwd_s'] for m in models if m in r['models']}
        cells = [f'{times[m]:.3f}' if m in times else '–' for m in models]
        ratios = [f'{times[m] / times[soft]:.2f}x' if m in times and soft in times else '–' for m in others]
        lines.append(f"| {r['mode']} | {r['hw'][0]}x{r['hw'][1]} | {r['gemm_gflops']:.0f} | " + ' | '.join(cells)
                     + ' | ' + ' | '.join(ratios) + ' |')
    lines += ['', 'Preparation (compile: the first call; onnxruntime: export + session, then the first run), '
              'seconds:', '', '| mode | input | ' + ' | '.join(models) + ' |', '|---' * (2 + len(models)) + '|']
    for r in results:
        if r['mode'] in (*COMPILE_MODES, 'onnxruntime'):
            cells = []
            for m in models:
                row = r['models'].get(m)
                cells.append('–' if row is None else f"{row['prepare_s']:.0f} + {row['first_call_s']:.1f}")
            lines.append(f"| {r['mode']} | {r['hw'][0]}x{r['hw'][1]} | " + ' | '.join(cells) + ' |')
    for r in results:
        if r.get('profile'):
            total = sum(ms for _, ms, _ in r['profile'])
            lines += ['', f"{r['profile_model']}, {r['mode']} at {r['hw'][0]}x{r['hw'][1]}: the {len(r['profile'])} "
                      f'operators with the most self time ({total:.0f} ms together; one forward)', '',
                      '| operator | self ms | calls |', '|---|---|---|']
            lines += [f'| {op} | {ms:.1f} | {n} |' for op, ms, n in r['profile']]
    return '\n'.join(lines) + '\n'


def native_bfloat16_gemm() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (oneDNN with AVX512-BF16 or AMX). Without, torch
    runs bfloat16 matmuls in its scalar reference kernel, one thread, hundreds of times slower than float32."""
    supported = getattr(torch.ops.mkldnn, '_is_mkldnn_bf16_supported', None)
    return bool(torch.backends.mkldnn.is_available() and supported is not None and supported())


def run(args: Any, script: str) -> int:
    """``backbones.py --modes``: one fresh process per (mode, size), then the table."""
    sizes = sorted(args.sizes, key=lambda s: s[0] * s[1])
    results, notes = [], []
    modes = list(args.modes)
    if 'bfloat16' in modes and not native_bfloat16_gemm():
        modes.remove('bfloat16')
        notes.append('bfloat16 not run: this CPU has no bfloat16 GEMM in hardware (AVX512-BF16 or AMX), so torch '
                     'would run every bfloat16 matmul in its one-thread reference kernel.')
        print(notes[-1], file=sys.stderr)
    for hw in sizes:
        for mode in modes:
            spec = dict(mode=mode, hw=list(hw), models=args.models, rounds=args.rounds, repeats=args.repeats,
                        gemm_size=args.gemm_size, profile=args.profile, modes_worker=True)
            print(f'{mode} at {hw[0]}x{hw[1]} ...', flush=True)
            result, stderr = harness.run_in_fresh_process(script, spec, args.glibc_malloc)
            if result is None:
                print(f'{mode} at {hw[0]}x{hw[1]} failed: {stderr.strip().splitlines()[-1:] or "no output"}',
                      file=sys.stderr)
                return 1
            for name, row in result['models'].items():
                rounds = ' '.join(f'{t:.3f}' for t in row['round_s'])
                print(f"  {name:>16} fwd {row['fwd_s']:.3f} s (rounds {rounds}); prepare {row['prepare_s']:.1f} s, "
                      f"first call {row['first_call_s']:.1f} s", flush=True)
            results.append(result)
    threads = results[0]['threads'] if results else torch.get_num_threads()
    header = (f'Backbones in {len(modes)} modes, CPU, {threads} threads, batch 1, forward; median of '
              f'{args.repeats} per round, median of {args.rounds} round(s) interleaved across models; '
              f'{harness.glibc_malloc_note(args.glibc_malloc)}')
    table = markdown(results, args.models, header) + ''.join(f'\n{note}\n' for note in notes)
    harness.write_results(args.out, 'backbone_modes', table, args, results=results, notes=notes)
    print(f'saved {Path(args.out) / "backbone_modes.md"} and backbone_modes.json')
    return 0
