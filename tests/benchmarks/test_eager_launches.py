"""Tests of benchmarks/eager_launches.py: a tiny CPU run of the value convs' two layouts and of the backbones with the
eager savings on and off, and its argument errors."""
import json

import pytest

from soft_mm.ops.functional import head_conv, pooling


def test_tiny_run_counts_fewer_calls_with_the_savings_and_restores_them(tmp_path, load_benchmark):
    tool = load_benchmark('eager_launches')
    shipped = pooling._eager_pool_matrix
    # 100x132: the SOFT stages' maps 25x33, 13x17 and 7x9 are pooled to multiples of their strides (32x40, 16x20,
    # 8x10), so all 11 SOFT layers of SOFT-Small build pooling matrices
    assert tool.main(['--device', 'cpu', '--sizes', '100x132', '--batch', '1', '--dtype', 'float32', '--rounds', '1',
                      '--repeats', '1', '--out', str(tmp_path)]) == 0
    data = json.loads((tmp_path / 'eager_launches.json').read_text())
    assert data['args']['device'] == 'cpu'
    assert [(r['map'], r['kernel'], r['takes']) for r in data['convs']] == [
        ([25, 33], 9, 'channels_last'), ([13, 17], 5, 'channels_last'), ([7, 9], 3, 'channels_last')]
    assert all(r[case] > 0 for r in data['convs'] for case in ('channels_last fwd', 'nchw fwd+bwd'))
    rows = {r['model']: r for r in data['backbones']}
    assert list(rows) == ['soft_norm_small', 'swin_t', 'convnext_t', 'soft_norm_small, savings off']
    on, off = rows['soft_norm_small'], rows['soft_norm_small, savings off']
    # two pooling matrices per SOFT layer, a dozen operators or more each (16 counted by launch_counts), gone
    saved = off['forward_launches']['launches'] - on['forward_launches']['launches']
    assert saved >= 11 * 2 * 12, (on, off)
    assert off['step_launches']['launches'] - on['step_launches']['launches'] == saved
    assert all(r['forward_ms'] > 0 and r['step_ms'] > 0 for r in rows.values())
    # switched back on after the run
    assert pooling._eager_pool_matrix is shipped and head_conv.CUDA_NCHW_MIN_KERNEL == 7
    table = (tmp_path / 'eager_launches.md').read_text()
    assert '| 100x132 | 25x33 | 64 (2) | 9 |' in table and 'ATen operators a forward / a step' in table


@pytest.mark.parametrize('argv, message', [
    (['--device', 'gpu'], '--device: Expected one of'),
    (['--batch', '0'], '--rounds, --repeats and --batch must be >= 1, got 5, 2 and 0'),
])
def test_rejects_bad_arguments(argv, message, load_benchmark, capsys):
    with pytest.raises(SystemExit):
        load_benchmark('eager_launches').parse_args(argv)
    assert message in capsys.readouterr().err
