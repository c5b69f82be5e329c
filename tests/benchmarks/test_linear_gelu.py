"""Tests of benchmarks/linear_gelu.py: a tiny run of SOFT-Norm-Tiny's fc1 layers and backbone, fused, unfused and in
the sigmoid form."""
import json

import pytest

from soft_mm.ops.functional import gelu


def test_tiny_run_times_every_fc1_shape_and_the_three_settings(tmp_path, load_benchmark):
    tool = load_benchmark('linear_gelu')
    assert tool.main(['--arch', 'tiny', '--sizes', '64x96', '--rounds', '1', '--repeats', '1',
                      '--out', str(tmp_path)]) == 0
    # the rule is put back
    assert (gelu.FUSED_FLOAT32_MAX_IN_FEATURES, gelu.FLOAT32_TANH_GELU) == tool.SETTINGS['rule'] == (128, 'sigmoid')
    data = json.loads((tmp_path / 'linear_gelu.json').read_text())
    # SOFT-Tiny's depths (1, 2, 3, 2): one fc1 shape per stage, 64x96 -> 16x24, 8x12, 4x6, 2x3 tokens; the SOFT stages'
    # GELU is tanh's, the softmax stage's erf's
    layers = [(r['tokens'], r['d_in'], r['d_out'], r['approximate'], r['count'], r['rule']) for r in data['layers']]
    assert layers == [(384, 64, 256, 'tanh', 1, 'sigmoid'), (96, 128, 512, 'tanh', 2, 'sigmoid'),
                      (24, 320, 1280, 'tanh', 3, 'sigmoid'), (6, 512, 2048, 'none', 2, 'unfused')]
    assert all(r['fused'] > 0 and r['unfused'] > 0 for r in data['layers'])
    assert [r['sigmoid'] is None for r in data['layers']] == [False, False, False, True]
    backbone, = data['backbone']
    assert backbone['hw'] == [64, 96]
    assert all(backbone[name] > 0 for name in ('rule', 'fused_bound', 'fused', 'unfused'))
    table = (tmp_path / 'linear_gelu.md').read_text()
    assert '| 24 | 320 → 1280 | tanh | 3 |' in table and 'GEMM rate' in table
    assert 'fused_bound / rule' in table and ' fused / rule' in table and 'unfused / rule' in table


def test_rejects_bad_rounds(load_benchmark, capsys):
    with pytest.raises(SystemExit):
        load_benchmark('linear_gelu').parse_args(['--rounds', '0'])
    assert '--rounds and --repeats must be >= 1, got 0 and 2' in capsys.readouterr().err
