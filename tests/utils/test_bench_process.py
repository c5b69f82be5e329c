"""Tests of soft_mm.utils.bench_process: the benchmark workers' fresh process and its allocator setting."""
import argparse

from soft_mm.utils.bench_process import (
    GLIBC_MALLOC_TUNING,
    add_glibc_malloc_argument,
    glibc_malloc_note,
    run_in_fresh_process,
)

WORKER = '''
import json, os, sys
spec = json.loads(sys.argv[2])
if spec.get('fail'):
    sys.exit('worker says no')
print('noise')
print(json.dumps({key: os.environ.get(key) for key in spec['keys']}))
'''


def test_the_workers_run_with_the_setting_asked_for_whatever_the_parent_has(tmp_path, monkeypatch):
    script = tmp_path / 'worker.py'
    script.write_text(WORKER)
    keys = sorted(GLIBC_MALLOC_TUNING)
    monkeypatch.setenv(keys[0], '123')  # a parent's own value never leaks into a case
    tuned, _ = run_in_fresh_process(str(script), {'keys': keys}, 'tuned')
    default, _ = run_in_fresh_process(str(script), {'keys': keys}, 'default')
    assert tuned == GLIBC_MALLOC_TUNING
    assert default == {key: None for key in keys}
    failed, stderr = run_in_fresh_process(str(script), {'keys': keys, 'fail': True}, 'tuned')
    assert failed is None and 'worker says no' in stderr


def test_argument_and_note():
    parser = argparse.ArgumentParser()
    add_glibc_malloc_argument(parser)
    assert parser.parse_args([]).glibc_malloc == 'tuned'
    assert parser.parse_args(['--glibc-malloc', 'default']).glibc_malloc == 'default'
    assert 'MALLOC_MMAP_THRESHOLD_=4294967296' in glibc_malloc_note('tuned')
    assert glibc_malloc_note('default') == 'glibc malloc default'
