"""Tests of benchmarks/dispatch_overhead.py: a tiny run of the two ways (the decision kept and made afresh), which
restores what it switched, and its argument errors."""
import pytest

from soft_mm.ops.soft import attention, dispatch
from soft_mm.ops.soft.backends.triton import backend as triton_backend


def test_tiny_run_times_both_ways_of_every_step_and_restores_the_switch(capsys, load_benchmark):
    tool = load_benchmark('dispatch_overhead')
    limits = triton_backend.device_limits
    assert tool.main(['--calls', '3', '--rounds', '1', '--tokens', '5', '--landmarks', '2']) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == ['soft_attention', '_decide', 'CUDA']
    assert all('afresh / kept' in line for line in lines[1:])
    times = tool.per_call_times(calls=2, rounds=1, repeats=1, tokens=5, landmarks=2)
    assert {step: sorted(ways) for step, ways in times.items()} == {
        step: ['afresh', 'kept'] for step in ('soft_attention', '_decide', 'CUDA decision')}
    assert all(t > 0 for ways in times.values() for t in ways.values())
    # the benchmark's own switches, undone: the op decides through the kept decisions, the Triton backend reads the
    # real device again
    assert attention.decide is dispatch.decide and triton_backend.device_limits is limits
    assert type(attention._EAGER_CALLS) is dict


def test_bad_arguments_are_named(load_benchmark):
    tool = load_benchmark('dispatch_overhead')
    with pytest.raises(SystemExit):
        tool.main(['--calls', '0'])
