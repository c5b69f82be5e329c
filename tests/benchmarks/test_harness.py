"""benchmarks/harness.py, the one harness of the benchmark scripts: timing, peak memory, the GEMM rate, fresh-process
cases and their allocator setting, the backbones compared, inductor's weight freezing."""
import argparse
import json
import subprocess
import sys

import harness
import pytest
import torch
from harness import (
    GLIBC_MALLOC_TUNING,
    add_glibc_malloc_argument,
    build_backbone,
    gemm_gflops,
    glibc_malloc_note,
    inductor_freezing,
    run_in_fresh_process,
    timed,
)
from helpers.repo import ROOT

# in a fresh process, as the benchmarks measure: in the test process the 64 MiB may be served from memory that
# earlier tests freed but the allocator kept resident, which raises no peak
PEAK_SCRIPT = f"""
import sys
sys.path.insert(0, {str(ROOT / 'benchmarks')!r})
import torch
from harness import PeakMemory
memory = PeakMemory(torch.device('cpu'))
memory.start()
block = torch.ones(64 * 2 ** 20 // 4)  # 64 MiB, touched
print(memory.peak_mib(), float(block.sum()))
"""


def test_peak_memory_of_a_64_mib_block():
    done = subprocess.run([sys.executable, '-c', PEAK_SCRIPT], capture_output=True, text=True, timeout=300,
                          check=True)
    peak_mib, total = map(float, done.stdout.split())
    assert 60 <= peak_mib < 200 and total == 64 * 2 ** 20 // 4


def test_timing_and_gemm_rate_under_a_fake_clock(monkeypatch):
    """``timed`` is the clock's difference around the call; the GEMM rate is 2 n^3 / (median time) in GFLOP/s."""
    ticks = iter([10.0, 10.5, 20.0, 20.25, 30.0, 30.125, 40.0, 40.5])  # start / end of each timed call
    monkeypatch.setattr(harness.time, 'perf_counter', lambda: next(ticks))
    device = torch.device('cpu')
    calls = []
    assert timed(lambda: calls.append(1), device) == 0.5 and calls == [1]
    # three repeats of 0.25, 0.125 and 0.5 s: median 0.25 s for 2 * 64^3 FLOPs
    assert gemm_gflops(device, torch.float32, size=64, repeats=3) == 2 * 64 ** 3 / 0.25 / 1e9
    with pytest.raises(StopIteration):  # every tick used: one timed call per repeat, none besides
        next(ticks)


def test_median_time_warms_up_once_then_takes_the_median(monkeypatch):
    ticks = iter([0.0, 3.0, 10.0, 11.0, 20.0, 22.0])  # the timed calls only: 3, 1 and 2 s
    monkeypatch.setattr(harness.time, 'perf_counter', lambda: next(ticks))
    calls = []
    assert harness.median_time(lambda: calls.append(1), torch.device('cpu'), 3) == 2.0 and len(calls) == 4


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_gemm_rate_is_a_real_measurement(dtype):
    rate = gemm_gflops(torch.device('cpu'), dtype, size=256, repeats=2)
    assert 0.1 < rate < 1e5  # GFLOP/s of a real CPU: not 0, not a timer of nothing


WORKER = '''
import json, os, sys
spec = json.loads(sys.argv[2])
if spec.get('fail'):
    sys.exit('worker says no')
print('noise')
print(json.dumps({key: os.environ.get(key) for key in spec['keys']}))
'''


def test_the_workers_run_with_the_setting_asked_for_whatever_the_parent_has(tmp_path, monkeypatch):
    script = tmp_path / 'worker.py'
    script.write_text(WORKER)
    keys = sorted(GLIBC_MALLOC_TUNING)
    monkeypatch.setenv(keys[0], '123')  # a parent's own value never leaks into a case
    tuned, _ = run_in_fresh_process(str(script), {'keys': keys}, 'tuned')
    default, _ = run_in_fresh_process(str(script), {'keys': keys}, 'default')
    assert tuned == GLIBC_MALLOC_TUNING
    assert default == {key: None for key in keys}
    failed, stderr = run_in_fresh_process(str(script), {'keys': keys, 'fail': True}, 'tuned')
    assert failed is None and 'worker says no' in stderr
    # None: the parent's environment as it is (seg_full_res's rows)
    inherited, _ = run_in_fresh_process(str(script), {'keys': keys}, None)
    assert inherited == {keys[0]: '123', keys[1]: None}


def test_argument_and_note():
    parser = argparse.ArgumentParser()
    add_glibc_malloc_argument(parser)
    assert parser.parse_args([]).glibc_malloc == 'tuned'
    assert parser.parse_args(['--glibc-malloc', 'default']).glibc_malloc == 'default'
    assert 'MALLOC_MMAP_THRESHOLD_=4294967296' in glibc_malloc_note('tuned')
    assert glibc_malloc_note('default') == 'glibc malloc default'


def test_script_arguments_and_results(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    harness.add_sizes_argument(parser, ('56', '200x334'), 'token maps')
    harness.add_case_arguments(parser)
    args = parser.parse_args([])
    assert args.sizes == [(56, 56), (200, 334)] and args.worker is None and args.glibc_malloc == 'tuned'
    assert parser.parse_args(['--sizes', '8', '16x12', '--worker', '{}']).sizes == [(8, 8), (16, 12)]
    without = argparse.ArgumentParser()
    harness.add_case_arguments(without, glibc_malloc=False)
    assert vars(without.parse_args([])) == {'worker': None}
    folder = harness.write_results(tmp_path / 'out', 'bench', '| table |\n', args, rows=[{'a': 1}])
    assert folder == tmp_path / 'out' and (folder / 'bench.md').read_text() == '| table |\n'
    assert json.loads((folder / 'bench.json').read_text()) == {
        'args': {'sizes': [[56, 56], [200, 334]], 'glibc_malloc': 'tuned'}, 'rows': [{'a': 1}]}
    assert '| table |' in capsys.readouterr().out


def _params_m(model: torch.nn.Module) -> float:
    return sum(p.numel() for p in model.parameters()) / 1e6


def test_timm_backbones_build_without_mmdet():
    pytest.importorskip('timm')
    # backbone parameters without a classification head (millions): Swin-T 27.5, ConvNeXt-T 27.8 and
    # EfficientViT-B2 15.0 (timm, features_only); Swin-T is built for the input size and gives the four maps
    for name, params_m in (('swin_t', 27.5), ('convnext_t', 27.8), ('efficientvit_b2', 15.0)):
        assert abs(_params_m(build_backbone(name, (64, 96))) - params_m) < 0.2, name
    maps = build_backbone('swin_t', (64, 96)).eval()(torch.randn(1, 3, 64, 96))
    assert [tuple(m.shape) for m in maps] == [(1, 16, 24, 96), (1, 8, 12, 192), (1, 4, 6, 384), (1, 2, 3, 768)]


def test_mmdet_backbones_build():
    pytest.importorskip('mmdet')
    # backbone parameters (millions): PVT-Small 24.0, PVTv2-B2 24.8
    for name, params_m in (('pvt_s', 24.0), ('pvtv2_b2', 24.8)):
        assert abs(_params_m(build_backbone(name)) - params_m) < 0.2, name


def test_soft_backbones_are_the_mm_backbone_without_mmengine():
    # the same modules, initialisation and maps as soft_mm.models.SOFT (an mmengine BaseModule), from one seed
    pytest.importorskip('mmengine')
    from soft_mm.models import SOFT

    x = torch.randn(1, 3, 64, 96)
    torch.manual_seed(0)
    model = build_backbone('soft_norm_tiny').eval()
    torch.manual_seed(0)
    mm_backbone = SOFT(arch='tiny', soft_norm=True, drop_path_rate=0.0)
    mm_backbone.init_weights()  # the same initialisation as the harness's pyramid
    mm_backbone.eval()
    assert [f'pyramid.{key}' for key in mm_backbone.state_dict()] == list(model.state_dict())
    assert len(model.stages) == 4
    with torch.no_grad():
        maps, expected = model(x), mm_backbone(x)
    assert isinstance(maps, tuple) and len(maps) == 4
    for a, b in zip(maps, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_unfused_variant_turns_the_block_fusions_off():
    # the A/B switches belong to the benchmark: the unfused variant patches its own instances (the MLPs' and stage 4's
    # forwards, the attention layers' adds_residual protocol), the library's classes and modules are untouched
    from soft_mm.models import attention
    from soft_mm.models.attention import SoftAttention, SoftmaxAttention
    from soft_mm.models.blocks import GeluMlp
    from soft_mm.ops.functional.sdpa import softmax_attention

    def switches(name):
        modules = list(build_backbone(name).modules())
        return (['forward' in vars(m) for m in modules if isinstance(m, (GeluMlp, SoftmaxAttention))],
                [m.adds_residual for m in modules if isinstance(m, (SoftAttention, SoftmaxAttention))])

    (patched_on, adds), (patched_off, adds_off) = switches('soft_norm_tiny'), switches('soft_norm_tiny_unfused')
    assert len(patched_on) == len(patched_off) == 8 + 2 and len(adds) == len(adds_off) == 8  # tiny: 1+2+3+2 blocks
    assert not any(patched_on) and all(adds) and all(patched_off) and not any(adds_off)
    assert not hasattr(GeluMlp, 'fuse') and not hasattr(SoftmaxAttention, 'float32_core')  # no library switch
    assert attention.softmax_attention is softmax_attention
    # the same function: float32 outputs of the two within rounding (bfloat16 would show the fusions' rounding)
    torch.manual_seed(0)
    fused = build_backbone('soft_norm_tiny').eval()
    torch.manual_seed(0)
    unfused = build_backbone('soft_norm_tiny_unfused').eval()
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        for a, b in zip(fused(x), unfused(x)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert attention.softmax_attention is softmax_attention  # restored after stage 4's calls


def test_unknown_backbone_is_named():
    with pytest.raises(ValueError, match="unknown backbone 'resnet'; one of soft_tiny, "):
        build_backbone('resnet')


def test_inductor_freezing_is_restored_after_the_block():
    import torch._inductor.config as inductor_config

    before = inductor_config.freezing
    with inductor_freezing(not before):
        assert inductor_config.freezing is (not before)
    assert inductor_config.freezing is before
    with pytest.raises(RuntimeError, match='inside'), inductor_freezing(not before):
        raise RuntimeError('inside')
    assert inductor_config.freezing is before


def test_interleaved_medians_alternate_the_cases_round_by_round():
    calls = []
    cases = {'a': lambda: calls.append('a'), 'b': lambda: calls.append('b')}
    times = harness.interleaved_medians(cases, rounds=2, repeats=1, device=torch.device('cpu'),
                                setups={'b': lambda: calls.append('setup b')})
    # each round: a's warm-up and timed call, then b's setup, warm-up and timed call
    assert calls == ['a', 'a', 'setup b', 'b', 'b'] * 2
    assert set(times) == {'a', 'b'} and all(t >= 0 for t in times.values())
