"""Tests of benchmarks/head_conv.py: a tiny run of SOFT-Tiny's value convs, PyTorch's backward and the custom one."""
import json

import pytest

from soft_mm.ops.functional import head_conv


def test_value_conv_shapes_follow_the_arch_and_the_stage_strides(load_benchmark):
    tool = load_benchmark('head_conv')
    # SOFT's three SOFT stages at strides 4, 8, 16 (sizes rounded up as the stride-2 convs round them), filters 9, 5, 3
    assert tool.value_convs('small', (800, 1344)) == [(64, 2, 200, 336, 9), (128, 4, 100, 168, 5),
                                                       (320, 10, 50, 84, 3)]
    assert tool.value_convs('tiny', (65, 97)) == [(64, 2, 17, 25, 9), (128, 4, 9, 13, 5), (320, 10, 5, 7, 3)]


def test_tiny_run_times_both_backwards_per_stage_and_dtype(tmp_path, load_benchmark):
    tool = load_benchmark('head_conv')
    assert tool.main(['--arch', 'tiny', '--sizes', '64x96', '--rounds', '1', '--repeats', '1',
                      '--out', str(tmp_path)]) == 0
    rows = json.loads((tmp_path / 'head_conv.json').read_text())['rows']
    assert [(r['kernel'], r['dtype']) for r in rows] == [(k, d) for k in (9, 5, 3) for d in ('float32', 'bfloat16')]
    assert all(r['pytorch'] > 0 and r['custom'] > 0 for r in rows)
    assert [r['takes'] for r in rows] == ['custom' if k >= head_conv.CUSTOM_BACKWARD_MIN_KERNEL else 'pytorch'
                                          for k in (9, 9, 5, 5, 3, 3)]
    table = (tmp_path / 'head_conv.md').read_text()
    assert '| 64x96 | 16x24 | 64 (2) | 9 | float32 |' in table and 'PyTorch / custom' in table


def test_rejects_bad_rounds(load_benchmark, capsys):
    with pytest.raises(SystemExit):
        load_benchmark('head_conv').parse_args(['--rounds', '0'])
    assert '--rounds and --repeats must be >= 1, got 0 and 2' in capsys.readouterr().err
