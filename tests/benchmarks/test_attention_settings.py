"""benchmarks/attention_settings.py: variants parsed into validated attention settings, one row per variant."""
from __future__ import annotations

import pytest

from soft_mm.models.settings import attention_settings


def test_variants_are_parsed_and_validated(load_benchmark):
    tool = load_benchmark('attention_settings')
    assert tool.parse_variant('landmark_mode=avg,newton_iters=30,newton_ridge=0.001') == {
        'landmark_mode': 'avg', 'newton_iters': 30, 'newton_ridge': 0.001}
    with pytest.raises(ValueError, match="'iters=3' is not FIELD=VALUE with FIELD one of landmark_mode"):
        tool.parse_variant('iters=3')
    with pytest.raises(ValueError, match="landmark_mode='max' is not one of"):
        tool.parse_variant('landmark_mode=max')


def fake_clock(durations: list[float]):
    """A ``perf_counter`` whose every second call is later by the next of ``durations`` (start, end, start, ...)."""
    left = iter(durations)
    state = {'now': 0.0, 'calls': 0}

    def clock() -> float:
        if state['calls'] % 2:
            state['now'] += next(left)
        state['calls'] += 1
        return state['now']

    return clock


def test_one_row_per_variant_with_its_settings_and_the_ratio_to_the_first(load_benchmark, capsys, monkeypatch):
    tool = load_benchmark('attention_settings')
    built = {}
    build_variant = tool.build_variant

    def recording_build_variant(text, arch):
        built[text] = build_variant(text, arch)
        return built[text]

    monkeypatch.setattr(tool, 'build_variant', recording_build_variant)
    # warm-up round (dropped although fastest), then two timed rounds: the minimum of each variant's is kept
    monkeypatch.setattr(tool.time, 'perf_counter', fake_clock([0.125, 0.125, 0.5, 1.0, 0.25, 0.75]))
    results = tool.main(['--variants', 'landmark_mode=avg', 'landmark_mode=conv,newton_iters=3', '--size', '64x64',
                         '--batch', '1', '--rounds', '2'])
    assert results == [('landmark_mode=avg', 0.25), ('landmark_mode=conv,newton_iters=3', 0.75)]
    assert built['landmark_mode=avg'].attention_settings == attention_settings(landmark_mode='avg')
    assert built['landmark_mode=conv,newton_iters=3'].attention_settings == attention_settings(
        landmark_mode='conv', newton_iters=3)
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith('landmark_mode=')]
    assert [row[0] for row in rows] == ['landmark_mode=avg', 'landmark_mode=conv,newton_iters=3']
    assert [(row[1], row[-1]) for row in rows] == [('250.0', '1.00x'), ('750.0', '3.00x')]  # ms and t1 / t0
    with pytest.raises(SystemExit):
        tool.main(['--size', '16x16'])
