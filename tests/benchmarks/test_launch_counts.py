"""benchmarks/launch_counts.py: what a GPU would launch for SOFT-Norm-Small's forward and training step, counted on
CPU tensors on the GPU route, held at or under the budget (a count, not a time), against Swin-T counted the same way;
and the counter itself on small cases."""
import json

import pytest
import torch
from harness import build_backbone
from helpers.op_checks import triton_kernels
from launch_counts import BUDGET_SIZE, STEP_BUDGET, count_model, counting_launches

pytestmark = triton_kernels


def test_the_counter_counts_what_runs_a_kernel():
    x = torch.randn(4, 6)
    with counting_launches() as launches:
        y = x.t().reshape(6, 4).contiguous()  # views: none; the copy: one
        z = (y * 2).sum()  # two
        torch.empty(3)  # an allocation: none
    assert [launch.name for launch in launches] == ['aten.clone', 'aten.mul', 'aten.sum'], launches
    assert {launch.phase for launch in launches} == {'forward'}
    assert z.item() == pytest.approx(2 * x.sum().item(), rel=1e-5)


def test_soft_norm_small_training_step_within_the_budget_and_below_0_8_of_swin_t(tmp_path, load_benchmark, gpu_route):
    # SOFT through the tool at the budget's size, 64x64 (its count does not grow with the input: 224x224 gives 12
    # fewer, without the position embedding's resize); Swin-T at the 224x224 its windows tile without padding; both
    # with their default stochastic depth, as their detection configs train them. The Triton launches are counted
    # without running the kernels (benchmarks/host_time.py's empty launches: which launches a step makes does not
    # depend on the values they write; the interpreter ran them here in about 100 s, and the kernels' results are
    # the op tests'), the ATen operators around them run
    tool = load_benchmark('launch_counts')
    size = 'x'.join(map(str, BUDGET_SIZE))
    with load_benchmark('host_time').empty_triton_launches() as launched:
        assert tool.main(['--models', 'soft_norm_small', '--sizes', size, '--batch', '2', '--out', str(tmp_path)]) == 0
    assert sum(launched.values()) > 0  # (the counter saw the launches the empty kernels took)
    (row,) = json.loads((tmp_path / 'launch_counts.json').read_text())['rows']
    table = (tmp_path / 'launch_counts.md').read_text()
    assert f'## soft_norm_small per block, {size}' in table and '| Triton kernels |' in table
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    swin = count_model(build_backbone('swin_t', (224, 224), stochastic_depth=True), x, torch.bfloat16)
    step, ops = row['step']['total'], row['step']['ops']
    assert row['model'] == 'soft_norm_small' and step > row['forward']['total'] > 0
    assert step <= STEP_BUDGET, step
    assert step <= 0.8 * len(swin['step']), (step, len(swin['step']))
    # each of the 11 SOFT layers: 4 Triton launches forward, 5 backward (the m×m work and the partial sums in them),
    # and its block's two sums and LayerNorms and its landmarks' LayerNorm and GELU: 1 launch forward and 1 backward
    # each (and the partials' sum); each of the 4 softmax-stage blocks its first sum with its second LayerNorm
    assert sum(n for name, n in ops.items() if name.startswith('triton.nystrom_')) == 11 * 9
    assert sum(n for name, n in ops.items() if name.startswith('triton.add_norm_')) == (11 * 3 + 4) * 2
    # and its value conv with the attention output added: 1 launch forward, 2 backward (the values' and the filters')
    assert sum(n for name, n in ops.items() if name.startswith('triton.head_conv_')) == 11 * 3
    assert row['step']['categories']['Triton kernels'] == 11 * 9 + (11 * 3 + 4) * 2 + 11 * 3
    assert not {'aten.matmul', 'aten.bmm'} & set(ops), sorted(ops)
    # autocast's weight casts (370 before) replaced by one cast per stage, the value convs' filters read as they are
    # by their kernel: the casts left are the maps', the position embeddings' and the loss's (observed 45)
    assert row['step']['categories']['casts'] <= 48, row['step']['categories']
    # stochastic depth: one draw of every block's masks per stage (two launches; stage 1's one block has a rate of 0),
    # each scale applied inside the sum it guards (observed 84 launches of drop-path masks before)
    assert ops['aten.bernoulli_'] == 3 and ops.get('aten.mul', 0) <= 4, ops
    assert row['forward']['total'] < len(swin['forward']) + 150, (row['forward']['total'], len(swin['forward']))


def test_rejects_bad_arguments(load_benchmark, capsys):
    with pytest.raises(SystemExit):
        load_benchmark('launch_counts').parse_args(['--batch', '0'])
    assert '--batch must be >= 1, got 0' in capsys.readouterr().err
