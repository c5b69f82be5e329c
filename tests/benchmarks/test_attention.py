"""Tests of benchmarks/attention.py: its baselines compute what they claim (the plain math is the library's naive
reference, tested in tests/ops/soft/test_attention.py), and a tiny run writes its outputs."""
import json

import pytest
import torch
import torch.nn.functional as F
from helpers.repo import ROOT
from helpers.tool_process import run_python

TOOL = ROOT / 'benchmarks' / 'attention.py'


@pytest.fixture(scope='module')
def tool(load_benchmark):
    return load_benchmark('attention')


def test_nystrom_softmax_with_every_token_as_landmark_is_exact_softmax(tool):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 20, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    out = tool.nystrom_softmax(q, k, v, (4, 5), grid=7, pinv_iters=40)  # a 4x5 map: its 20 tokens are the landmarks
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), rtol=1e-8, atol=1e-8)
    approx = tool.nystrom_softmax(q, k, v, (4, 5), grid=2)
    assert (approx - F.scaled_dot_product_attention(q, k, v)).abs().max() > 1e-3  # 4 landmarks: an approximation


def test_flop_formula(tool):
    fwd, fwd_bwd = tool.case_flops('soft_op', (10, 20), 64, 2)
    m, d, n = 49, 32, 200
    assert fwd == 2 * 2 * (3 * n * m * d + 2 * 20 * m ** 3)
    assert fwd_bwd == 2 * 2 * (9 * n * m * d + 2 * 20 * m ** 3)
    assert tool.case_flops('sdpa', (10, 20), 64, 2) == (4.0 * 2 * n * n * d, 12.0 * 2 * n * n * d)
    assert tool.case_flops('pvt_sra', (16, 20), 64, 2)[0] == 4.0 * 2 * 320 * (2 * 3) * d
    assert tool.fit_exponent([1, 2, 4], [3, 12, 48]) == pytest.approx(2.0)


def test_tiny_run_writes_table_plot_and_json(tmp_path):
    # two methods at two sizes (each case is a fresh process of a few seconds); every method's case is built and run
    # in this process by the test below
    proc = run_python(TOOL, '--sizes', '8', '16x12', '--methods', 'soft_op', 'sdpa', '--repeats', '1',
                      '--max-case-s', '0', '--out', str(tmp_path), timeout=600)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / 'attention_benchmark.json').read_text())
    rows = {(r['method'], r['tokens']): r for r in data['rows']}
    assert sorted({r['tokens'] for r in data['rows']}) == [64, 192]
    assert all(r['fwd_ms'] > 0 and r['fwd_bwd_ms'] > 0 for r in data['rows'])
    # --max-case-s 0: sdpa is measured at 64 tokens only and estimated at 192 by N^2 scaling
    assert not rows[('sdpa', 64)]['estimated'] and rows[('sdpa', 192)]['estimated']
    assert rows[('sdpa', 192)]['fwd_bwd_ms'] == pytest.approx(rows[('sdpa', 64)]['fwd_bwd_ms'] * 9)
    assert rows[('soft_op', 192)]['fwd_bwd_peak_mib'] is not None and rows[('soft_op', 192)]['sgemm_gflops'] > 0
    assert set(data['exponents']) == {'soft_op', 'sdpa'}
    assert (tmp_path / 'attention_benchmark.png').stat().st_size > 1000
    table = (tmp_path / 'attention_benchmark.md').read_text()
    assert '(est.)' in table and 'time exponent' in table and 'vs sdpa est.' in table


@pytest.mark.parametrize('method', ['soft_op', 'plain_math', 'soft_conv', 'soft_avg', 'soft_norm_conv',
                                    'soft_norm_avg', 'sdpa', 'nystrom_softmax', 'pvt_sra'])
def test_every_case_builds_and_runs_forward_and_backward(tool, method):
    # in this process (the fresh-process runs cost seconds each): the case's output and a gradient for every input
    fn, leaves = tool.build_case(method, (16, 12), 64, 2, torch.device('cpu'))
    for leaf in leaves:
        leaf.requires_grad_(True)
    out = fn()
    assert out.shape[-2:] == (192, 32) or out.shape[-2:] == (192, 64)
    out.square().sum().backward()
    assert leaves and all(leaf.grad is not None and torch.isfinite(leaf.grad).all() for leaf in leaves)


def test_rejects_bad_sizes():
    proc = run_python(TOOL, '--sizes', '0', timeout=120)
    assert proc.returncode == 2
    assert "argument --sizes: '0' is not a size H or HxW of positive integers" in proc.stderr
