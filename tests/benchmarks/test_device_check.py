"""benchmarks/device_check.py, the prepared GPU check, run with --smoke: tiny sizes on CPU under the Triton
interpreter, so the script that a lent GPU runs once is known to work end to end, on a machine like the lent one (no
mm* package, no OpenCV) and started from outside the repository."""
import json
import subprocess
import sys

import pytest
from device_training import TRAINING_SMOKE, training_plan
from helpers.repo import ROOT
from helpers.tool_process import BARE_GPU_MACHINE_LACKS, blocked_imports_env

from soft_mm.ops.soft.backends.triton.nystrom_config import MAX_HEAD_DIM, MAX_LANDMARKS
from soft_mm.ops.triton_route import TRITON_VERSION


def test_the_blocker_makes_the_mm_packages_unimportable(tmp_path):
    # what the smoke run below relies on: mmengine (installed here) cannot be imported under the blocker
    env = blocked_imports_env(tmp_path / 'site')
    for name in BARE_GPU_MACHINE_LACKS:
        proc = subprocess.run([sys.executable, '-c', f'import {name}'], env=env, cwd=tmp_path, capture_output=True,
                              text=True, check=False, timeout=60)
        assert proc.returncode == 1 and f"No module named '{name}' (blocked by the test)" in proc.stderr, proc.stderr


def smoke_run(tmp_path, *args: str) -> tuple[dict, str]:
    """``device_check.py --smoke *args`` as the bare GPU machine runs it: no mm* package, from a folder outside the
    checkout, the checkout not on PYTHONPATH (the tool finds its own soft_mm); (the report, stdout)."""
    out = tmp_path / 'device_check.json'
    env = dict(blocked_imports_env(tmp_path / 'site'), TRITON_INTERPRET='1')
    proc = subprocess.run([sys.executable, str(ROOT / 'benchmarks/device_check.py'), '--smoke', *args, '--out',
                           str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=1800, env=env, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text()), proc.stdout


@pytest.mark.slow
@pytest.mark.triton_kernels
@pytest.mark.skipif(TRITON_VERSION is None, reason='triton is not installed (bash tools/install.sh adds it)')
def test_smoke_run_without_mm_packages_from_outside_the_repository_fills_every_table(tmp_path):
    report, stdout = smoke_run(tmp_path)
    assert report['soft_mm'] == str(ROOT / 'soft_mm')
    assert not [key for key in report if key.endswith('_error')], report
    assert report['correctness'] and all(row['ok'] for row in report['correctness'])
    # the decisions for the device: on CPU the interpreter is never chosen automatically, and forced it takes every
    # call (no GPU's limits apply)
    assert len(report['targets']) == 12 and {row['backend'] for row in report['targets']} <= {'reference', 'tiled'}
    assert all(row['triton_reason'] is None for row in report['targets'])
    assert all(row['float32_error'] < 3e-5 for row in report['correctness'])
    assert {(row['landmarks'], row['head_dim']) for row in report['correctness']} >= {(MAX_LANDMARKS, MAX_HEAD_DIM),
                                                                                       (1, 16)}
    methods = {(row['dtype'], row['method']) for row in report['op'] if 'fwd_bwd_ms' in row}
    assert methods == {(dtype, method) for dtype in ('bfloat16', 'float16', 'float32')
                       for method in ('triton', 'reference', 'sdpa')}
    assert {row['model'] for row in report['backbones'] if 'fwd_bwd_ms' in row} == {'soft_norm_small', 'swin_t',
                                                                                     'convnext_t'}
    (compiled,) = report['compile']  # one graph (fullgraph=True), the eager backend in the smoke run
    assert compiled['backend'] == 'eager' and compiled['max_rel_diff'] < 5e-2 and compiled['compiled_fwd_ms'] > 0
    # the table tests/ops/test_triton_cubins.py holds: 28 kernels (the m×m one and its backward among them) × 2
    assert {row['arch'] for row in report['cubins']} == {'sm_80', 'sm_90'} and len(report['cubins']) == 56
    assert 'sm_80 regs / spill B' in stdout
    # the training part: every row of the plan, in its order (the eager rows of both sizes first), none cut short
    training, plan = report['training'], training_plan(TRAINING_SMOKE)
    assert [(row['case'], row['model'], row.get('input', row.get('tokens'))) for row in training] == [
        (case.kind, case.model, case.input if case.kind != 'op' else case.tokens) for case in plan]
    assert [row['case'] for row in training[:9]] == ['eager'] * 9
    assert not [row for row in training if {'error', 'skipped', 'cut_short'} & set(row)], training
    steps = [row for row in training if row['case'] not in ('op', 'launch', 'conv')]
    assert all(row['step_ms'] > 0 and row['peak_mib'] >= 0 and row['seconds'] > 0 for row in steps), steps
    # the host per Triton launch: SOFT's step with the plans and with kernel[grid] (the same launches; on CPU both
    # kernel[grid], the interpreter's), and the add + LayerNorm call alone with each
    (launch,) = [row for row in training if row['case'] == 'launch']
    assert launch['triton_launches'] > 100 and launch['step_ms_plan'] > 0 and launch['step_ms_kernel[grid]'] > 0
    assert 'host_us_per_launch_saved' in launch and launch['add_norm_call_host_us_plan'] > 0
    assert all(row['graphs'] >= 1 and row['backend'] == 'eager' for row in steps if row['case'] == 'compiled')
    # the value conv on CPU: its third stage alone, both forms timed (the fused kernel is the GPU route's: not here)
    (conv,) = [row for row in training if row['case'] == 'conv']
    assert conv['stage3_triton_ms'] > 0 and conv['stage3_pytorch_ms'] > 0 and conv['stage3_fused'] is False, conv
    assert 'stage1_triton_ms' not in conv
    (op,) = [row for row in training if row['case'] == 'op']
    assert op['method'] == 'triton' and op['dtype'] == 'bfloat16' and op['tokens'] == 200 and op['fwd_bwd_ms'] > 0
    # the whole RetinaNet step, both backbones under the same neck and head: finite losses
    detectors = [row for row in training if row['case'] == 'retinanet']
    assert [row['model'] for row in detectors] == ['soft_norm_small', 'swin_t']
    assert all(set(row['losses']) == {'classification', 'bbox_regression'} and
               all(0 < value < 100 for value in row['losses'].values()) for row in detectors), detectors
    # the summary: one line per target, the speed targets measured (met or not: CPU times say nothing of a GPU)
    summary = report['summary']
    assert len(summary) == 9 and all(line['status'] in ('met', 'not met', 'not measured') for line in summary)
    # (the peak memory on CPU may read 0; the graphed detector and the micro-batches are the graphs part's rows)
    assert all(line['status'] != 'not measured' for i, line in enumerate(summary) if i not in (3, 5, 8)), summary
    assert 'the training plan on a GPU' in stdout and '| target | measured | needed | |' in stdout
    assert 'total' in stdout and 'runs only if time is left' in stdout
    # where the forward's time goes, per model: the operators with the most time (on CPU no kernel launches)
    assert [row['model'] for row in report['profile']] == ['soft_norm_small', 'swin_t']
    for row in report['profile']:
        assert row['wall_fwd_ms'] > 0 and row['kernels_per_fwd'] == 0 and len(row['top']) == 15
        assert row['top'][0]['ms'] >= row['top'][-1]['ms'] > 0


@pytest.mark.slow
@pytest.mark.triton_kernels
@pytest.mark.skipif(TRITON_VERSION is None, reason='triton is not installed (bash tools/install.sh adds it)')
def test_smoke_run_of_the_graphs_part_counts_recompiles_in_its_own_process(tmp_path):
    report, stdout = smoke_run(tmp_path, '--parts', 'graphs')
    assert set(report) == {'device', 'torch', 'soft_mm', 'targets', 'graphs', 'graphs_summary'}
    graphed, swin_detector, soft_detector, dynamic = report['graphs']
    assert (graphed['mode'], dynamic['mode']) == ('reduce-overhead', 'dynamic')
    # two accumulated micro-batches at the first size's bucket through the compiled stages (on CPU: dynamo's eager
    # backend) against an eager copy: as exact as the eager copy's own bfloat16 gradients against float32
    assert graphed['stochastic_depth'] is False and dynamic['stochastic_depth'] is True
    assert graphed['micro_batches_input'] == '1x64x128' and graphed['micro_batch_captures'] == 0
    assert 0 < graphed['grad_diff_eager_bf16_vs_fp32'] < 0.5, graphed  # (measured 0.12: bfloat16 ran)
    assert graphed['grad_diff_graphed_vs_eager'] <= graphed['grad_diff_eager_bf16_vs_fp32'], graphed
    assert graphed['micro_batches_equal'] is True
    assert any(line['status'] == 'met' and 'micro-batches' in line['target'] for line in report['graphs_summary'])
    # the detector step with SOFT's stages graphed (on CPU: compiled with dynamo's eager backend) beside Swin-T's
    assert (soft_detector['mode'], soft_detector['options']['pad_size_divisor']) == ('graphed', 64)
    assert swin_detector['model'] == 'swin_t' and 'mode' not in swin_detector
    assert all(row['step_ms'] > 0 and min(row['losses'].values()) > 0 for row in (swin_detector, soft_detector))
    graphed_line = report['graphs_summary'][5]
    assert 'stages as CUDA graphs' in graphed_line['target'] and graphed_line['status'] in ('met', 'not met')
    for row in (dynamic, graphed):
        assert not {'error', 'skipped', 'cut_short'} & set(row), row
        assert row['sizes'] == ['1x64x96', '1x64x128'] and row['options']['backend'] == 'eager'
        assert row['step_ms_1x64x96'] > 0 and row['step_ms_1x64x128'] > 0
        # dynamic shapes: at most two graphs per stage (the four stages) over both sizes, none once both were seen
        assert 4 <= row['first_size_graphs'] <= row['warm_graphs'] <= 2 * 4, row
        assert row['steady_graphs'] == 0 and row['steady_graph_breaks'] == 0, row
        # no CUDA graphs on CPU: none captured, and the row says so
        assert row['cuda_graphs'] is False and row['warm_captures'] == row['steady_captures'] == 0
        assert 'warm_reserved_mib' not in row  # (CUDA's allocator only)
    # the pad is asked for where CUDA graphs would be recorded, and either taken or the refusal recorded
    assert 'pad_size_divisor_refused' not in dynamic and dynamic['pad_size_divisor'] is None
    if graphed['pad_size_divisor'] is None:
        assert 'pad_size_divisor' in graphed['pad_size_divisor_refused'], graphed
    else:
        assert graphed['pad_size_divisor'] == 64 and graphed['padded_sizes'] == ['1x64x128', '1x64x128']
    assert 'the graphs plan on a GPU' in stdout


def test_a_failing_case_is_recorded_and_the_check_goes_on(load_benchmark, tmp_path, monkeypatch):
    tool = load_benchmark('device_check')
    calls = []

    def check_case(tokens, landmarks, head_dim, cfg, device):
        calls.append((tokens, landmarks, head_dim))
        if tokens == 63:
            raise RuntimeError('CUDA error: an illegal memory access was encountered\nmore lines')
        return dict(ok=True, float32_error=1e-6)

    monkeypatch.setattr(tool, 'check_case', check_case)
    report = tool.Report(str(tmp_path / 'report.json'), device='cpu')
    report.run_part('correctness', lambda: tool.check_correctness(tool.SMOKE, 'cpu', report))
    rows = json.loads((tmp_path / 'report.json').read_text())['correctness']
    # the smoke cases at d = 32, then the declared corners: the largest tiles and the smallest
    assert calls == [(1, 1, 32), (63, 9, 32), (130, 1, 32), (130, MAX_LANDMARKS, MAX_HEAD_DIM), (130, 1, 16)]
    assert [row['ok'] for row in rows] == [True, False, True, True, True]
    assert [row['head_dim'] for row in rows] == [32, 32, 32, MAX_HEAD_DIM, 16]
    assert rows[1]['error'] == 'RuntimeError: CUDA error: an illegal memory access was encountered'

    def broken_part():
        raise MemoryError('out of memory')

    report.run_part('op', broken_part)  # recorded, saved, and nothing raised
    saved = json.loads((tmp_path / 'report.json').read_text())
    assert saved['op_error'] == 'MemoryError: out of memory' and len(saved['correctness']) == 5


def test_a_corner_this_gpu_does_not_fit_is_recorded_with_the_dispatchers_reason(load_benchmark, tmp_path, monkeypatch):
    tool = load_benchmark('device_check')
    calls = []
    reason = ('needs 163,840 B of shared memory per block at m = 64, d = 64 (nystrom_bwd_kernel_dq_dv_dl, float32 '
              'products); this NVIDIA GeForce RTX 4090 (sm_89) allows 101,376')
    monkeypatch.setattr(tool, 'triton_refusal', lambda device, tokens, m, *_: reason if m == MAX_LANDMARKS else None)
    monkeypatch.setattr(tool, 'check_case', lambda *args: calls.append(args[:3]) or dict(ok=True))
    report = tool.Report(str(tmp_path / 'report.json'), device='an RTX 4090')
    rows = tool.check_correctness(tool.SMOKE, 'cuda', report)
    assert (130, MAX_LANDMARKS, MAX_HEAD_DIM) not in calls and len(calls) == 4
    (corner,) = [row for row in rows if row['landmarks'] == MAX_LANDMARKS]
    assert corner['ok'] and corner['refused'] == reason


def test_parts_run_in_their_order_and_alone(load_benchmark, tmp_path, monkeypatch, capsys):
    tool = load_benchmark('device_check')
    calls = []
    for name, part in (('check_correctness', 'correctness'), ('bench_op', 'op'), ('bench_backbones', 'backbones'),
                       ('compiled_backbone', 'compile'), ('compiled_kernels', 'cubins'),
                       ('profile_forward', 'profile'), ('bench_training', 'training'), ('bench_graphs', 'graphs')):
        monkeypatch.setattr(tool, name, lambda *args, part=part: calls.append((part, args[3:])) or [dict(ok=True)])
    out = tmp_path / 'report.json'
    assert tool.main(['--smoke', '--parts', 'graphs', 'training', 'profile', 'correctness', '--out', str(out)]) == 0
    # the training and graphs parts get --budget-s (None: their configuration's)
    assert calls == [('correctness', ()), ('profile', ()), ('training', (None,)), ('graphs', (None,))]
    assert set(json.loads(out.read_text())) == {'device', 'torch', 'soft_mm', 'targets', 'correctness', 'profile',
                                                'training', 'graphs'}
    assert '1. Triton backend' in capsys.readouterr().out
    calls.clear()
    assert tool.main(['--smoke', '--budget-s', '30', '--out', str(out)]) == 0  # the default: every part but graphs
    assert [part for part, _ in calls] == ['correctness', 'op', 'backbones', 'compile', 'cubins', 'profile',
                                           'training'] and calls[-1][1] == (30.0,)
    capsys.readouterr()
    for argv, message in ((['--parts', 'speed'], "argument --parts: invalid choice: 'speed'"),
                          (['--budget-s', '0'], '--budget-s must be > 0, got 0')):
        with pytest.raises(SystemExit):
            tool.main(['--smoke', *argv])
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tool.main(['--help'])
    assert 'graphs' in capsys.readouterr().out


def test_the_targets_part_prints_what_a_model_s_eager_call_is_told(load_benchmark, monkeypatch, capsys):
    # an MI250X under ROCm (capability 9.0, as an H100's): every call on the reference math, the device named as an
    # AMD GPU, and the BackendFallbackWarning an eager call raises there printed once, in its words
    import torch

    from soft_mm.ops.soft import dispatch
    from soft_mm.ops.soft.backends.triton import backend as triton_backend
    from soft_mm.ops.triton_route import DeviceLimits, triton_available
    if not triton_available():
        pytest.skip('without triton every GPU is declined for that')
    tool = load_benchmark('device_check')
    mi250x = DeviceLimits('AMD Instinct MI250X', (9, 0), 65_536, 'rocm', 'gfx90a')
    for owner in (tool, triton_backend):
        monkeypatch.setattr(owner, 'device_limits', lambda index=None: mi250x)
    monkeypatch.setattr(dispatch, '_DECISIONS', {})
    monkeypatch.setattr(dispatch, '_ANNOUNCED', set())
    rows = tool.target_decisions(tool.SMOKE, torch.device('cuda', 0))
    assert len(rows) == 12 and {row['backend'] for row in rows} == {'reference'}
    reason = ('is built and checked for NVIDIA GPUs (sm_75, sm_80, sm_86, sm_89, sm_90, sm_100, sm_103, sm_120, '
              'sm_121), not this AMD Instinct MI250X (gfx90a, ROCm): an AMD GPU, whatever capability torch reports for '
              'it (9.0)')
    assert {row['triton_reason'] for row in rows} == {reason}
    told = [message for row in rows for message in row['warnings']]
    # the Triton kernels passed over, and float16 (autocast) run in float32 there: each said once
    assert told == [f"soft_attention on cuda:0: the 'triton' backend {reason}; the 'reference' backend runs instead "
                    "(said once per device and reason; soft_mm.ops.soft.dispatch.BackendFallbackWarning is its "
                    "category)",
                    f"soft_attention on cuda:0: float16 products are not taken here (the 'triton' backend {reason}; "
                    "the 'reference' backend has no float16 products with float32 accumulation); the op runs in "
                    "float32 (said once per device and reason; soft_mm.ops.soft.dispatch.BackendFallbackWarning is its "
                    "category)"]
    out = capsys.readouterr().out
    assert 'AMD Instinct MI250X (gfx90a, ROCm): AMD GPU under ROCm, reported capability 9.0, 65,536 B' in out
    assert out.count('BackendFallbackWarning: ') == 2
