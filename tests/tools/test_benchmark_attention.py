import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_benchmark_attention_writes_table_plot_and_json(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / 'tools/benchmark_attention.py'), '--sizes', '8', '20',
                           '--repeats', '1', '--max-full-gib', '1e-4', '--out', str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / 'attention_scaling.json').read_text())['rows']
    assert [r['tokens'] for r in rows] == [64, 400]
    # landmarks are bounded by the 7x7 grid; conv mode at stride 8: ceil(8/8)=1, ceil(20/8)=3 per side
    assert [r['landmarks'] for r in rows] == [1, 9]
    # 2 heads x N^2 x 4 bytes: 64 tokens = 3.1e-5 GiB (under the 1e-4 cap, timed), 400 tokens = 1.2e-3 GiB (skipped)
    assert rows[0]['full_matrix_gib'] == 2 * 64 ** 2 * 4 / 2 ** 30
    assert rows[0]['softmax_ms'] > 0
    assert rows[1]['softmax_ms'] is None
    assert all(r['soft_ms'] > 0 for r in rows)
    assert (tmp_path / 'attention_scaling.png').stat().st_size > 1000
    assert 'skipped' in proc.stdout


def test_benchmark_attention_rejects_bad_sizes():
    proc = subprocess.run([sys.executable, str(ROOT / 'tools/benchmark_attention.py'), '--sizes', '0'],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert '--sizes must be positive' in proc.stderr
