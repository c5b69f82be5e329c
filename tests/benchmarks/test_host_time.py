"""benchmarks/host_time.py: the host's time per training step on the GPU route, each Triton launch through triton's
real launch path to a stand-in driver (the launch plans and ``kernel[grid]``, in a process of its own) or empty.
Tested: a tiny run of each part writes its rows, with a launcher column and the ATen share; the empty launches compute
nothing and are made as often as the real kernels (against ``launch_counts``' counter over the interpreted kernels);
the narrowed models launch what the models do; the argument errors. No time is asserted."""
from __future__ import annotations

import json
import types
from collections import Counter

import pytest
import torch
from helpers.op_checks import triton_kernels
from launch_counts import counting_launches

from soft_mm.ops import triton_route

pytestmark = triton_kernels


def _real_and_empty_launches(tool, step) -> tuple[Counter, Counter]:
    """Per kernel name, the Triton launches of one ``step`` with the interpreted kernels (``launch_counts``' counter)
    and of one with the empty launches."""
    with triton_route.interpreted_triton_route(), counting_launches() as launches:
        step()
    real = Counter(launch.name.removeprefix('triton.') for launch in launches if launch.name.startswith('triton.'))
    with tool.gpu_route() as launched:
        step()
    return real, launched


def _soft_block(tool, batch: int = 2):
    """A post-norm SOFT block of stage 1 of the narrowed SOFT-Norm-Small (64x64 input: 16x16 tokens), a bfloat16
    forward + backward of it, and its input."""
    model = tool.build_narrow_backbone('soft_norm_small', (64, 64), 16)
    block = model.pyramid.stages[0].blocks[0]
    x = torch.randn(batch, 16 * 16, block.norm1.normalized_shape[0], generator=torch.Generator().manual_seed(0))
    x.requires_grad_()

    def step() -> None:
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = block(x, (16, 16))
        out.float().square().mean().backward()
    return step


def test_tiny_run_with_empty_launches_writes_the_three_backbones(tmp_path, load_benchmark):
    tool = load_benchmark('host_time')
    threads = torch.get_num_threads()
    assert tool.main(['--parts', 'backbones', '--sizes', '64x64', '--batch', '2', '--rounds', '1', '--repeats', '1',
                      '--launchers', 'empty', '--out', str(tmp_path)]) == 0
    data = json.loads((tmp_path / 'host_time.json').read_text())
    rows = {r['model']: r for r in data['rows']}
    assert list(rows) == list(tool.BACKBONE_MODELS) and data['args']['width_divisor'] == 16
    assert all(r['ms'] > 0 and r['route'] == 'gpu' and r['hw'] == [64, 64] for r in rows.values())
    assert all(r['launcher'] == 'empty' and r['aten_ms'] > 0
               and r['aten_ms'] + r['non_aten_ms'] == pytest.approx(r['ms']) for r in rows.values())
    assert rows['soft_norm_small']['ratio'] == 1.0
    # the same operators and launches as the models at their own widths
    assert all(r['launches'] == r['full_width_launches'] for r in rows.values()), rows
    # SOFT's layers took their Triton launches (empty); the peers have none
    assert rows['soft_norm_small']['triton'] > 0 and rows['swin_t']['triton'] == rows['convnext_t']['triton'] == 0
    table = (tmp_path / 'host_time.md').read_text()
    assert '| 64x64 | swin_t | GPU | — |' in table and '| ATen ms | other ms |' in table and '≠' not in table
    assert 'every Triton launch empty' in data['header'] and 'torch ' + torch.__version__ in data['header']
    assert torch.get_num_threads() == threads  # (the benchmark's switches are undone)


@pytest.mark.slow  # compiles SOFT's kernels for the stand-in sm_90 (cached by triton afterwards): a minute cold
def test_tiny_run_through_the_real_launch_path_has_a_row_per_launcher(tmp_path):
    """The command as users run it (no TRITON_INTERPRET: the script leaves it unset): SOFT once with the launch plans
    and once with ``kernel[grid]``, the same launches each, beside Swin-T and ConvNeXt-T."""
    import os
    import subprocess
    import sys

    from helpers.repo import ROOT

    env = {key: value for key, value in os.environ.items() if key != 'TRITON_INTERPRET'}
    result = subprocess.run([sys.executable, str(ROOT / 'benchmarks' / 'host_time.py'), '--parts', 'backbones',
                             '--rounds', '1', '--repeats', '1', '--out', str(tmp_path)], env=env, capture_output=True,
                            text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((tmp_path / 'host_time.json').read_text())
    rows = {r['case']: r for r in data['rows']}
    assert list(rows) == ['soft_norm_small', 'soft_norm_small (kernel[grid])', 'swin_t', 'convnext_t']
    soft, jit = rows['soft_norm_small'], rows['soft_norm_small (kernel[grid])']
    assert (soft['launcher'], jit['launcher']) == ('plan', 'kernel[grid]')
    assert soft['launches'] == jit['launches'] == soft['full_width_launches'] and soft['triton'] == jit['triton'] > 0
    assert "to a stand-in driver of sm_90" in data['header']
    assert '| 64x64 | soft_norm_small | GPU | plan |' in (tmp_path / 'host_time.md').read_text()


def test_empty_launches_are_the_real_kernels_launches_of_a_soft_block(load_benchmark):
    """One SOFT block's bfloat16 forward + backward: the interpreted kernels (counted by ``launch_counts``) and the
    empty launches, per kernel, the same."""
    tool = load_benchmark('host_time')
    real, launched = _real_and_empty_launches(tool, _soft_block(tool))
    # the SOFT op's kernels and the block's add + LayerNorm kernels, forward and backward
    assert any(name.startswith('nystrom_') for name in real) and any(name.startswith('add_norm_') for name in real)
    assert launched == real


def _tensors(args) -> list[torch.Tensor]:
    return [t for a in args for t in (_tensors(a) if isinstance(a, tuple) else [a] if isinstance(a, torch.Tensor)
                                      else [])]


def test_empty_launches_leave_every_tensor_as_it_was(load_benchmark):
    """A SOFT training step with empty launches: every tensor handed to a launch (inputs and the output buffers the
    wrappers allocated) has the same contents after it, and every kernel launched reaches the empty launch."""
    tool = load_benchmark('host_time')
    model = tool.build_narrow_backbone('soft_norm_small', (64, 64), 16)
    step = tool.backbone_step(model, torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0)))
    seen: Counter = Counter()

    class Watched:
        """The empty launch, checking the tensors it is handed before and after."""

        exact_values = False

        def __init__(self, inner) -> None:
            self.inner = inner

        def __call__(self, kernel, grid, args, meta) -> None:
            tensors = _tensors(args)
            before = [t.clone() for t in tensors]
            self.inner(kernel, grid, args, meta)
            for after, was in zip(tensors, before):
                torch.testing.assert_close(after, was, rtol=0, atol=0, equal_nan=True)
            seen[kernel.fn.__name__] += len(tensors) > 0

    with tool.gpu_route() as launched, triton_route.watching_launches(Watched):
        step()
    assert seen == launched and sum(seen.values()) > 100, (seen, launched)


def test_the_chains_part_times_each_node_with_each_launcher(tmp_path, load_benchmark):
    tool = load_benchmark('host_time')
    assert tool.main(['--parts', 'chains', '--rounds', '1', '--repeats', '1', '--launchers', 'empty',
                      '--out', str(tmp_path)]) == 0
    rows = {r['case']: r for r in json.loads((tmp_path / 'host_time.json').read_text())['rows']}
    assert list(rows) == ['SOFT op', 'SOFT op (reference backend)', 'add + LayerNorm', 'layer_norm(x + r) (ATen)']
    assert rows['SOFT op']['launches_per_node'] == 9 and rows['add + LayerNorm']['launches_per_node'] == 2
    assert all(r['nodes'] == tool.CHAIN_NODES and r['us_per_node'] > 0 for r in rows.values())
    assert rows['SOFT op']['us_per_launch'] == pytest.approx(rows['SOFT op']['us_per_node'] / 9)
    assert '## Chains of 40 nodes' in (tmp_path / 'host_time.md').read_text()


def test_an_empty_launch_counts_and_computes_nothing(load_benchmark):
    tool = load_benchmark('host_time')
    launched: Counter = Counter()

    class Kernel:
        fn = types.SimpleNamespace(__name__='copy_kernel')

        def __getitem__(self, grid):
            raise AssertionError('an empty launch launches nothing')

    out = torch.full((4,), 7.0)
    tool.EmptyLauncher(launched)(Kernel(), (2,), (torch.ones(4), out, 4), {'BLOCK': 2})
    assert launched == {'copy_kernel': 1} and torch.equal(out, torch.full((4,), 7.0))


@pytest.mark.slow  # the Triton interpreter runs SOFT-Norm-Small's kernels for one step: about half a minute
def test_empty_launches_are_the_real_kernels_launches_of_a_soft_step(load_benchmark):
    """One training step of the narrowed SOFT-Norm-Small at 64x64: the interpreted kernels' launches as
    ``launch_counts`` counts them, per kernel, equal to the empty launches of the same step."""
    tool = load_benchmark('host_time')
    model = tool.build_narrow_backbone('soft_norm_small', (64, 64), 16)
    step = tool.backbone_step(model, torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0)))
    real, launched = _real_and_empty_launches(tool, step)
    assert launched == real and sum(real.values()) > 100, (launched, real)


def test_narrow_refuses_a_divisor_that_leaves_a_fraction(load_benchmark):
    tool = load_benchmark('host_time')
    assert tool.narrow([64, 128, 320, 512], 16) == [4, 8, 20, 32]
    with pytest.raises(ValueError, match='width_divisor=3 does not divide the channels'):
        tool.narrow([64, 128], 3)


def test_retinanet_runs_a_train_step_of_both_detectors(tmp_path, load_benchmark):
    pytest.importorskip('mmdet')
    tool = load_benchmark('host_time')
    assert tool.main(['--parts', 'retinanet', '--sizes', '64x64', '--batch', '2', '--rounds', '1', '--repeats', '1',
                      '--launchers', 'empty', '--out', str(tmp_path)]) == 0
    data = json.loads((tmp_path / 'host_time.json').read_text())
    rows = {r['model']: r for r in data['rows']}
    assert list(rows) == list(tool.DETECTORS)
    assert all(r['part'] == 'retinanet' and r['ms'] > 0 and r['launches'] == r['full_width_launches']
               for r in rows.values()), rows
    assert rows['retinanet_soft_norm_small']['triton'] > 0 and rows['retinanet_swin_t']['triton'] == 0
    assert data['detectors']['retinanet_swin_t']['backbone'].startswith(('mmdet::swin/', 'SWIN_T'))
    assert data['detectors']['retinanet_swin_t']['neck_in_channels'] == [6, 12, 24, 48]
    # one step of each: the losses of the head, the optimizer's update and zero_grad, on the CPU route (the meter's
    # empty launches leave the kernels' outputs as torch.empty made them: a loss of 6e34 and a skipped step at some
    # seeds)
    for name in tool.DETECTORS:
        torch.manual_seed(0)
        model, optim_wrapper, _ = tool.build_retinanet(name, 16)
        head = model.bbox_head.retina_reg.weight.detach().clone()
        log_vars = tool.detector_step(model, optim_wrapper, tool.detection_batch(2, (64, 64)))()
        assert {'loss', 'loss_cls', 'loss_bbox'} <= set(log_vars), log_vars
        assert not torch.equal(model.bbox_head.retina_reg.weight, head)
        assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize('argv, message', [
    (['--launchers', 'plan', 'empty'], "--launchers: 'empty' runs alone"),
    (['--launchers', 'jit'], "--launchers: invalid choice: 'jit' (choose from plan, kernel[grid], empty)"),
    (['--batch', '0'], '--rounds, --repeats, --batch and --threads must be >= 1, got 5, 2, 0 and 1'),
    (['--threads', '0'], '--rounds, --repeats, --batch and --threads must be >= 1, got 5, 2, 2 and 0'),
    (['--width-divisor', '3'], "--width-divisor: invalid choice: 3"),
    (['--parts', 'heads'], "--parts: invalid choice: 'heads'"),
])
def test_rejects_bad_arguments(argv, message, load_benchmark, capsys):
    with pytest.raises(SystemExit):
        load_benchmark('host_time').parse_args(argv)
    assert message in capsys.readouterr().err


def test_retinanet_part_needs_mmdet(load_benchmark, capsys, monkeypatch):
    tool = load_benchmark('host_time')
    monkeypatch.setattr(tool, 'mmdet_available', lambda: "ModuleNotFoundError: No module named 'mmdet'")
    with pytest.raises(SystemExit):
        tool.parse_args(['--parts', 'retinanet'])
    assert "--parts retinanet needs mmdet and mmcv's compiled ops (ModuleNotFoundError" in capsys.readouterr().err
    assert tool.parse_args([]).parts == ['backbones', 'chains']
