"""tools/benchmark_settings.py: variants parsed into validated attention settings, one row per variant."""
from __future__ import annotations

import pytest


def test_variants_are_parsed_and_validated(load_tool):
    tool = load_tool('benchmark_settings')
    assert tool.parse_variant('landmark_mode=avg,newton_iters=30,newton_ridge=0.001') == {
        'landmark_mode': 'avg', 'newton_iters': 30, 'newton_ridge': 0.001}
    with pytest.raises(ValueError, match="'iters=3' is not FIELD=VALUE with FIELD one of landmark_mode"):
        tool.parse_variant('iters=3')
    with pytest.raises(ValueError, match="landmark_mode='max' is not one of"):
        tool.parse_variant('landmark_mode=max')


def test_one_row_per_variant_with_the_first_as_baseline(load_tool, capsys):
    tool = load_tool('benchmark_settings')
    results = tool.main(['--variants', 'landmark_mode=avg', 'landmark_mode=conv', '--size', '64x64', '--batch', '1',
                         '--rounds', '1'])
    assert [text for text, _ in results] == ['landmark_mode=avg', 'landmark_mode=conv']
    assert all(seconds > 0 for _, seconds in results)
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith('landmark_mode=')]
    assert [row[0] for row in rows] == ['landmark_mode=avg', 'landmark_mode=conv'] and rows[0][-1] == '1.00x'
    with pytest.raises(SystemExit):
        tool.main(['--size', '16x16'])
