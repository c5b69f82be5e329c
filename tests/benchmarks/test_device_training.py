"""benchmarks/device_training.py, the device check's training parts: the plan and its estimate, the time guard inside a
case, an autocast region per call, the CUDA-graph counter and the summary (the whole parts run in
tests/benchmarks/test_device_check.py's smoke runs)."""
import json
import signal
import time

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode


@pytest.fixture(scope='module')
def tool(load_benchmark):
    return load_benchmark('device_training')


@pytest.fixture(scope='module')
def check(load_benchmark):
    return load_benchmark('device_check')


def test_the_gpu_plan_runs_the_eager_rows_first_and_the_targets_rows_fit_the_budget(tool, check):
    cases = tool.training_plan(check.FULL)
    kinds = [case.kind for case in cases]
    assert kinds == ['eager'] * 9 + ['launch', 'op', 'conv'] + ['retinanet'] * 2 + ['compiled'] * 3
    assert [(c.model, c.input) for c in cases[:9]] == [(m, size) for size in ('2x800x1344', '1x1600x2688',
                                                                              '2x1600x2688')
                                                       for m in ('soft_norm_small', 'swin_t', 'convnext_t')]
    assert cases[10].tokens == 66816 and cases[11].input == '2x800x1344'
    assert [c.model for c in cases[12:16]] == ['soft_norm_small', 'swin_t', 'swin_t', 'soft_norm_small']
    estimates = tool.estimate_plan(cases, check.FULL)
    assert all(e > 0 for e in estimates)
    # every row a target needs, and the RetinaNet rows, within the budget by the estimate; ConvNeXt-T's compile after
    assert sum(estimates[:16]) <= check.FULL['training_budget_s'] < sum(estimates)
    # each compile counted at its bound: the compiled rows cost the most
    assert min(estimates[14:16]) > max(estimates[:14])
    graphs = tool.graphs_plan(check.FULL)
    # the CUDA graphs first, the detector step with SOFT's stages graphed beside Swin-T's eager one, dynamic last
    assert [(c.kind, c.model, c.mode) for c in graphs] == [
        ('stages', 'soft_norm_small', 'reduce-overhead'), ('retinanet', 'swin_t', ''),
        ('retinanet', 'soft_norm_small', 'graphed'), ('stages', 'soft_norm_small', 'dynamic')]
    graph_estimates = tool.estimate_plan(graphs, check.FULL)
    assert sum(graph_estimates[:3]) <= check.FULL['graphs_budget_s'] < sum(graph_estimates)
    # both parts, each with its process's start (imports, CUDA, the targets' decisions: 15 s at most) and the hard
    # stop's grace, within 480 s
    assert check.FULL['training_budget_s'] + check.FULL['graphs_budget_s'] + 2 * (
        check.FULL['hard_stop_grace_s'] + 15) <= 480
    text = tool.format_plan('plan', cases, estimates, check.FULL['training_budget_s'])
    assert text.count('\n') == len(cases) and 'runs only if time is left' in text.splitlines()[-1]


class Tiny(nn.Module):
    """A stand-in backbone: two maps, a weight that autocast casts."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return y, y[:, :, ::2, ::2]


def test_the_guard_stops_inside_a_case_which_keeps_what_it_measured(tool, monkeypatch, tmp_path):
    now = [0.0]

    def timed(fn, device):  # each timed call takes 10 s of the fake clock
        fn()
        now[0] += 10.0
        return 10.0

    monkeypatch.setattr(tool, 'timed', timed)
    monkeypatch.setattr(tool, 'build_backbone', lambda name, image, stochastic_depth: Tiny())
    cfg = dict(tool.TRAINING_SMOKE, training_repeats=5, gate_on_estimates=False)
    cases = [tool.Case('eager', 'soft_norm_small', 1, (8, 8)), tool.Case('eager', 'swin_t', 1, (8, 8))]
    saved = []
    rows = []
    # 25 s: the first call (10 s), then two timed steps (20, 30 s): the third is not begun
    tool.run_plan(cases, cfg, torch.device('cpu'), 25.0, rows,
                  lambda: saved.append(json.loads(json.dumps(rows))), clock=lambda: now[0])
    first, second = rows
    assert first['cut_short'] == "the part's 25 s were spent"
    assert first['first_call_s'] == 10.0 and first['step_ms_each'] == [1e4, 1e4] and first['step_ms'] == 1e4
    assert 'peak_mib' not in first and 'error' not in first
    assert second['skipped'] == "the part's 25 s were spent" and 'step_ms' not in second
    assert [len(rows) for rows in saved] == [1, 2]  # each row written as it came
    # the summary takes the cut-short figure and says so; the rows never measured are 'not measured'
    lines = tool.summarize(rows, dict(cfg, training_sizes=((1, (8, 8)), (1, (16, 16)))))
    assert len(lines) == 9 and all(line['status'] == 'not measured' for line in lines)
    assert lines[0]['measured'] == 'no swin_t row'


def test_a_case_whose_estimate_does_not_fit_is_skipped_before_it_starts(tool, monkeypatch):
    monkeypatch.setattr(tool, 'build_backbone', lambda *args, **kwargs: pytest.fail('the case must not start'))
    rows = []
    case = tool.Case('compiled', 'soft_norm_small', 1, (8, 8))
    tool.run_plan([case], dict(tool.TRAINING_FULL), torch.device('cpu'), 30.0, rows, lambda: None)
    (row,) = rows
    assert row['skipped'].startswith('needs about 1') and row['skipped'].endswith('s of the budget left')


def test_the_alarm_interrupts_a_call_that_outlasts_the_budget(tool):
    previous = signal.getsignal(signal.SIGALRM)
    guard = tool.TimeGuard(0.05, grace_s=0.05)
    start = time.perf_counter()
    with pytest.raises(tool.OutOfTime, match=r'interrupted 0\.05 s later, inside a call'), guard.hard_stop():
        time.sleep(5)
    assert time.perf_counter() - start < 2
    assert signal.getsignal(signal.SIGALRM) is previous
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


class CastCount(TorchDispatchMode):
    """Counts the dtype conversions (``aten._to_copy``) run inside it: autocast's weight casts among them."""

    def __init__(self):
        super().__init__()
        self.casts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.casts += func is torch.ops.aten._to_copy.default
        return func(*args, **(kwargs or {}))


def casts_per_call(fn, calls=3):
    counts = []
    for _ in range(calls):
        with CastCount() as count:
            fn()
        counts.append(count.casts)
    return counts


def test_each_call_enters_its_own_autocast_region(tool, load_benchmark):
    harness = load_benchmark('harness')
    model, x = Tiny(), torch.randn(2, 3, 8, 8)
    step = tool.backbone_step(model, model, x)
    forward = harness.in_autocast(lambda: model(x), 'cpu', torch.bfloat16)
    for fn in (step, forward):
        counts = casts_per_call(fn)
        assert counts[0] > 0 and len(set(counts)) == 1, counts  # every call casts the weights anew
        # what the counts would show with one region around the calls: autocast's cache spares the later casts
        with torch.autocast('cpu', dtype=torch.bfloat16):
            shared = casts_per_call(fn)
        assert shared[1] < shared[0] == counts[0], shared


def test_the_capture_counter_counts_every_cuda_graph_capture(tool, monkeypatch):
    seen = []
    monkeypatch.setattr(torch.cuda.CUDAGraph, 'capture_begin', lambda self, *args, **kwargs: seen.append(kwargs))
    with tool.graph_captures() as captures:
        torch.cuda.CUDAGraph.capture_begin(object(), capture_error_mode='thread_local')
        torch.cuda.CUDAGraph.capture_begin(object())
    assert captures == [2] and seen == [dict(capture_error_mode='thread_local'), {}]
    torch.cuda.CUDAGraph.capture_begin(object())  # restored: no longer counted
    assert captures == [2] and len(seen) == 3


def rows_for_summary(soft_ms, swin_ms, soft_mib, peer_mib, op_ms):
    rows = []
    for size, scale in (('2x800x1344', 1), ('1x1600x2688', 2)):
        for model, ms, mib in (('soft_norm_small', soft_ms, soft_mib), ('swin_t', swin_ms, peer_mib),
                               ('convnext_t', 30.0, peer_mib)):
            rows.append(dict(case='eager', model=model, input=size, step_ms=ms * scale, peak_mib=mib * scale))
    rows += [dict(case='compiled', model='soft_norm_small', input='2x800x1344', step_ms=40.0, cut_short='spent',
                  step_ms_each=[40.0, 41.0]),
             dict(case='op', model='triton', tokens=66816, fwd_bwd_ms=op_ms)]
    return rows


def test_the_summary_answers_each_target(tool, check):
    lines = tool.summarize(rows_for_summary(50.0, 65.0, 1800.0, 2600.0, 2.96), check.FULL)
    assert [line['needed'] for line in lines] == ['≥ 1.2×', '≥ 1.2×', '≥ 1.5×', '< 1 each', '≥ 1.0×', '≥ 1.3×',
                                                  '> 0 µs', '≤ 1.0 ms', "≤ 2× eager bfloat16's error, no re-record"]
    eager, compiled, large, memory, retinanet, graphed, launch, op, micro = lines
    assert retinanet['status'] == graphed['status'] == launch['status'] == micro['status'] == 'not measured'
    assert eager['status'] == 'met' and eager['figure'] == pytest.approx(1.3) and '2x800x1344' in eager['target']
    assert compiled['status'] == 'not measured' and compiled['measured'] == 'no swin_t row'
    assert large['status'] == 'not met' and large['figure'] == pytest.approx(1.3)
    assert memory['status'] == 'met' and memory['figure'] == pytest.approx(1800 / 2600)
    assert op['status'] == 'not met' and op['measured'] == '2.96 ms'
    rows = rows_for_summary(50.0, 80.0, 2700.0, 2600.0, 0.9)
    rows.append(dict(case='compiled', model='swin_t', input='2x800x1344', step_ms=60.0))
    rows += [dict(case='retinanet', model='soft_norm_small', input='2x800x1344', step_ms=100.0),
             dict(case='retinanet', model='soft_norm_small', input='2x800x1344', mode='graphed', step_ms=60.0),
             dict(case='retinanet', model='swin_t', input='2x800x1344', step_ms=90.0),
             dict(case='launch', model='soft_norm_small', input='2x800x1344', triton_launches=200,
                  **{'step_ms_plan': 100.0, 'step_ms_kernel[grid]': 102.0}, host_us_per_launch_saved=10.0),
             dict(case='stages', model='soft_norm_small', mode='reduce-overhead', micro_batches_equal=True,
                  micro_batch_captures=0, grad_diff_graphed_vs_fp32=0.011, grad_diff_eager_bf16_vs_fp32=0.01)]
    eager, compiled, large, memory, retinanet, graphed, launch, op, micro = tool.summarize(rows, check.FULL)
    assert micro['status'] == 'met' and micro['measured'] == ("1.10e-02 against eager's 1.00e-02; 0 captures during "
                                                               'the micro-batches')
    rows[-1]['micro_batch_captures'] = 1  # a re-record during the micro-batches
    assert tool.summarize(rows, check.FULL)[8]['status'] == 'not met'
    rows[-1].update(micro_batch_captures=0, micro_batches_equal=False)
    assert tool.summarize(rows, check.FULL)[8]['status'] == 'not met'
    assert eager['status'] == large['status'] == op['status'] == 'met' and memory['status'] == 'not met'
    # the detector step: Swin-T eager / SOFT eager 0.9 (not met), / SOFT graphed 1.5 (met); 10 µs a launch saved
    assert retinanet['status'] == 'not met' and retinanet['figure'] == pytest.approx(0.9)
    assert graphed['status'] == 'met' and graphed['figure'] == pytest.approx(1.5)
    assert launch['status'] == 'met' and launch['measured'].startswith('10.0 µs (102.0 against 100.0 ms a step')
    assert compiled['status'] == 'met' and compiled['measured'].endswith('(cut short: soft_norm_small after 2 calls)')
    # a pair of peak memories missing: not measured, unless another pair is already above
    rows = [row for row in rows_for_summary(50.0, 80.0, 1000.0, 2600.0, 0.9)
            if not (row.get('model') == 'convnext_t' and row.get('input') == '1x1600x2688')]
    memory = tool.summarize(rows, check.FULL)[3]
    assert memory['status'] == 'not measured' and memory['measured'].endswith('not measured: convnext_t 1x1600x2688')
    table = tool.format_summary(lines)
    assert len(table.splitlines()) == 2 + 9 and '| 2.96 ms | ≤ 1.0 ms | not met |' in table
