"""Tests of benchmarks/softmax_attention.py: a tiny run of stage 4's attention, PyTorch's bfloat16 kernel against the
float32 core."""
import json

import pytest


def test_tiny_run_times_both_cases_with_their_errors(tmp_path, load_benchmark):
    tool = load_benchmark('softmax_attention')
    assert tool.main(['--sizes', '100x130', '--heads', '2', '--head-dim', '16', '--rounds', '1', '--repeats', '1',
                      '--out', str(tmp_path)]) == 0
    row, = json.loads((tmp_path / 'softmax_attention.json').read_text())['rows']
    assert row['tokens'] == 4 * 5  # ceil(100 / 32) x ceil(130 / 32)
    core, plain = row['float32_core'], row['bfloat16']
    assert core['ms'] > 0 and plain['ms'] > 0
    # the float32 core is the correctly rounded float64 result almost everywhere; PyTorch's bfloat16 kernel less often
    assert core['correctly_rounded'] > 0.99 and plain['correctly_rounded'] < core['correctly_rounded']
    assert 0 < core['mean_error'] < plain['mean_error']
    assert '| 100x130 | 20 |' in (tmp_path / 'softmax_attention.md').read_text()


def test_rejects_bad_arguments(load_benchmark, capsys):
    with pytest.raises(SystemExit):
        load_benchmark('softmax_attention').parse_args(['--heads', '0'])
    assert '--rounds, --repeats, --heads and --head-dim must be >= 1, got 5, 2, 0 and 32' in capsys.readouterr().err
