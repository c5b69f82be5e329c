"""Tests of benchmarks/backbones.py: tiny runs of SOFT and of timm's backbones, the rounds merged, the targets table
(the backbones themselves: tests/benchmarks/test_harness.py)."""
import json

import numpy as np
import pytest
import torch
from helpers.repo import ROOT
from helpers.tool_process import run_python

from soft_mm.models import SOFT

TOOL = ROOT / 'benchmarks' / 'backbones.py'


def run_tool(tmp_path, *args):
    proc = run_python(TOOL, '--repeats', '1', '--gemm-size', '256', '--out', str(tmp_path), *args)
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads((tmp_path / 'backbone_benchmark.json').read_text())


def test_tiny_soft_run_writes_table_plot_and_json(tmp_path):
    _, data = run_tool(tmp_path, '--models', 'soft_tiny', '--sizes', '64x96', '96x128',
                          '--train-max-pixels', str(64 * 96), '--flops-max-pixels', str(64 * 96))
    rows = {tuple(r['hw']): r for r in data['rows']}
    assert set(rows) == {(64, 96), (96, 128)}
    small, large = rows[(64, 96)], rows[(96, 128)]
    assert small['params'] == sum(p.numel() for p in SOFT(arch='tiny').parameters())
    assert small['gmacs'] > 0 and 'gmacs' not in large  # MACs only up to --flops-max-pixels
    assert small['gemm_gflops'] > 0 and small['rounds'] == 1
    assert small['fwd_bwd_s'] > 0 and small['fwd_bwd_peak_mib'] is not None and 'fwd_bwd_s' not in large
    assert len(small['stage_s']) == 4 and all(t > 0 for t in small['stage_s'])
    assert sum(small['stage_s']) <= small['fwd_s'] * 1.5  # the stages partition one forward (timed separately)
    assert (tmp_path / 'backbone_benchmark.png').stat().st_size > 1000
    table = (tmp_path / 'backbone_benchmark.md').read_text()
    assert 'stage 1 s' in table and 'MACs counted up to' in table and '% of GEMM rate' in table
    assert 'float32, batch 1' in table and 'GEMM rate (256^2 matmul' in table
    assert small['gemm_size'] == 256 and small['out_dtype'] == large['out_dtype'] == 'float32'


def test_bfloat16_rounds_and_timm_models(tmp_path):
    pytest.importorskip('timm')
    proc, data = run_tool(tmp_path, '--models', 'soft_tiny', 'efficientvit_b2', '--sizes', '64x96', '--dtype',
                          'bfloat16', '--rounds', '2', '--train-max-pixels', '0')
    rows = {r['model']: r for r in data['rows']}
    assert set(rows) == {'soft_tiny', 'efficientvit_b2'} and all(r['rounds'] == 2 for r in rows.values())
    assert rows['efficientvit_b2']['params'] > 10 ** 6 and rows['soft_tiny']['gmacs'] > 0
    # the worker's forward ran under bfloat16 autocast (read back from the output maps, not the label)
    assert {r['out_dtype'] for r in rows.values()} == {'bfloat16'}
    # rounds interleave: soft_tiny, efficientvit_b2, soft_tiny, efficientvit_b2
    order = [line.split()[0] for line in proc.stdout.splitlines() if line.strip().startswith(('soft_', 'efficient'))]
    assert order[:4] == ['soft_tiny', 'efficientvit_b2', 'soft_tiny', 'efficientvit_b2']
    assert 'bfloat16 autocast, batch 1, median of 1 x 2 round(s)' in (tmp_path / 'backbone_benchmark.md').read_text()


@pytest.fixture(scope='module')
def tool(load_benchmark):
    return load_benchmark('backbones')


def test_merge_rounds_takes_medians_and_the_largest_peak(tool):
    runs = [dict(params=5, fwd_s=s, fwd_bwd_s=2 * s, gemm_gflops=g, fwd_bwd_peak_mib=p, stage_s=[s] * 4)
            for s, g, p in ((3.0, 100.0, 10.0), (1.0, 300.0, 30.0), (2.0, 200.0, 20.0))]
    merged = tool.merge_rounds(runs)
    assert (merged['fwd_s'], merged['fwd_bwd_s'], merged['gemm_gflops']) == (2.0, 4.0, 200.0)
    assert merged['fwd_bwd_peak_mib'] == 30.0 and merged['stage_s'] == [2.0] * 4 and merged['rounds'] == 3


def test_rejects_bad_sizes():
    proc = run_python(TOOL, '--sizes', '12y5', timeout=120)
    assert proc.returncode == 2 and "argument --sizes: '12y5' is not a size H or HxW" in proc.stderr


def test_targets_table_reads_ratios_from_one_run_of_both_dtypes(tool):
    base, large = list(tool.BASE_SIZE), list(tool.LARGE_SIZE)

    def row(model, dtype, hw, fwd, fwd_bwd=None, peak=None, gmacs=None, gemm=None):
        return dict(model=model, dtype=dtype, hw=hw, fwd_s=fwd, fwd_bwd_s=fwd_bwd, fwd_bwd_peak_mib=peak,
                    gmacs=gmacs, gemm_gflops=gemm)

    rows = [row('soft_norm_small', 'bfloat16', base, 0.5, 2.0, 100.0, gmacs=75.0, gemm=400.0),
            row('swin_t', 'bfloat16', base, 0.8, 2.4, 120.0), row('convnext_t', 'bfloat16', base, 0.6),
            row('soft_norm_small', 'float32', base, 1.0, gmacs=75.0, gemm=200.0),
            row('swin_t', 'float32', base, 1.5), row('soft_norm_small', 'float32', large, 4.0),
            row('swin_t', 'float32', large, 6.0)]
    figures = {what: (figure, least) for what, figure, least in tool.target_rows(rows)}
    assert figures['bfloat16 800x1344 forward, x swin_t'] == (0.8 / 0.5, 1.5)
    assert figures['bfloat16 800x1344 forward, x convnext_t'][0] == pytest.approx(1.2)
    assert figures['bfloat16 800x1344 forward, x own float32'][0] == pytest.approx(2.0)
    assert figures['bfloat16 800x1344 forward, % of the bfloat16 GEMM rate'][0] == pytest.approx(75.0)  # 300/400
    assert figures['float32 800x1344 forward, % of the float32 GEMM rate'][0] == pytest.approx(75.0)  # 150/200
    assert figures['float32 1600x2688 forward, x swin_t'][0] == pytest.approx(1.5)
    assert figures['bfloat16 1600x2688 forward, x swin_t'][0] is None  # not run
    assert figures['bfloat16 800x1344 forward+backward peak memory, x swin_t'][0] == pytest.approx(1.2)
    table = tool.targets_markdown(rows)
    assert '| bfloat16 800x1344 forward, x swin_t | 1.60 | 1.5 | yes |' in table
    assert '| bfloat16 800x1344 forward, x convnext_t | 1.20 | 1.25 | no |' in table
    assert '| bfloat16 1600x2688 forward, x swin_t | – | 1.2 | – |' in table


def test_both_dtypes_in_one_run(tmp_path):
    proc, data = run_tool(tmp_path, '--models', 'soft_norm_small', '--sizes', '64x96', '--dtype', 'float32',
                          'bfloat16', '--train-max-pixels', '0', '--flops-max-pixels', '0')
    assert sorted((r['dtype'], r['out_dtype']) for r in data['rows']) == [('bfloat16', 'bfloat16'),
                                                                        ('float32', 'float32')]
    order = [line.split()[1] for line in proc.stdout.splitlines() if line.strip().startswith('soft_norm_small')]
    assert order[:2] == ['float32', 'bfloat16']
    table = (tmp_path / 'backbone_benchmark.md').read_text()
    assert 'float32, batch 1' in table and 'bfloat16 autocast, batch 1' in table
    assert 'soft_norm_small targets' in table


def test_modes_time_every_model_in_one_process(tmp_path):
    pytest.importorskip('timm')
    proc = run_python(TOOL, '--modes', 'float32', '--models', 'soft_tiny', 'efficientvit_b2', '--sizes', '64x96',
                      '--rounds', '2', '--repeats', '1', '--gemm-size', '256', '--out', str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / 'backbone_modes.json').read_text())['results']
    assert [r['mode'] for r in results] == ['float32']
    assert results[0]['gemm_gflops'] > 0 and set(results[0]['models']) == {'soft_tiny', 'efficientvit_b2'}
    for row in results[0]['models'].values():
        assert len(row['round_s']) == 2 and row['fwd_s'] == np.median(row['round_s']) and row['first_call_s'] > 0
    table = (tmp_path / 'backbone_modes.md').read_text()
    times = results[0]['models']
    ratio = times['efficientvit_b2']['fwd_s'] / times['soft_tiny']['fwd_s']
    assert '| efficientvit_b2 / soft_tiny |' in table and '| float32 | 64x96 |' in table
    assert f'{ratio:.2f}x |' in next(line for line in table.splitlines() if line.startswith('| float32 | 64x96'))


def test_bfloat16_mode_needs_hardware_bfloat16_gemms(tmp_path, load_benchmark, monkeypatch):
    tool, modes = load_benchmark('backbones'), load_benchmark('backbone_modes')
    monkeypatch.setattr(modes, 'native_bfloat16_gemm', lambda: False)
    args = tool.parse_args(['--modes', 'bfloat16', '--models', 'soft_tiny', '--out', str(tmp_path)])
    assert modes.run(args, str(TOOL)) == 0
    data = json.loads((tmp_path / 'backbone_modes.json').read_text())
    assert data['results'] == [] and data['notes'][0].startswith('bfloat16 not run: this CPU has no bfloat16 GEMM')
    assert data['notes'][0] in (tmp_path / 'backbone_modes.md').read_text()


def test_modes_need_the_cpu():
    proc = run_python(TOOL, '--modes', 'float32', '--device', 'cuda:0', timeout=120)
    assert proc.returncode == 2 and '--modes measures the CPU modes; --device must be cpu, got cuda:0' in proc.stderr


def test_onnxruntime_mode_exports_times_and_profiles(tmp_path, load_benchmark):
    """The onnxruntime mode in-process on a model of torch's exporter, and onnxruntime's profile summed per op type."""
    pytest.importorskip('onnxruntime')
    modes = load_benchmark('backbone_modes')
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1)).eval()
    x = torch.randn(1, 3, 32, 48)
    run = modes.prepare('onnxruntime', 'two_convs', model, x, tmp_path)
    out = run()
    with torch.no_grad():
        expected = model(x)
    assert len(out) == 1 and np.allclose(out[0], expected.numpy(), atol=1e-5)
    profile = modes.onnx_profile(tmp_path / 'two_convs.onnx', x, tmp_path)
    ops = {op: (ms, n) for op, ms, n in profile}
    # the two convs of one run (the ReLU fused into the first or not), nothing of the warm-up run
    assert sum(n for op, (_, n) in ops.items() if op.endswith('Conv')) == 2, ops
    assert all(ms > 0 for ms, _ in ops.values())


@pytest.mark.parametrize('mode, compile_mode', [('compile', None), ('compile-autotune', 'max-autotune')])
def test_compile_modes_differ_only_in_torch_compiles_mode_and_freeze_the_weights(load_benchmark, monkeypatch, mode,
                                                                                  compile_mode):
    import torch._inductor.config as inductor_config

    modes = load_benchmark('backbone_modes')
    calls = []

    def fake_compile(model, mode=None):
        calls.append(mode)
        return lambda x: (inductor_config.freezing, torch.is_grad_enabled())

    monkeypatch.setattr(torch, 'compile', fake_compile)
    run = modes.prepare(mode, 'one_linear', torch.nn.Linear(2, 2), torch.randn(1, 2), None)
    assert calls == [compile_mode] and run() == (True, False)  # frozen weights, no gradients, in every compile mode
    assert modes.MODE_DTYPES[mode] == torch.float32 and not inductor_config.freezing
