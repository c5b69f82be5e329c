"""benchmarks/triton_rule.py: the Triton backend's float16 / bfloat16 errors beside the plain math's, one row per
token count and case, every row within the FlashAttention rule (here in the Triton interpreter on CPU tensors)."""
from __future__ import annotations

import re

import pytest

from soft_mm.ops.triton_route import TRITON_VERSION


@pytest.mark.triton_kernels
@pytest.mark.skipif(TRITON_VERSION is None, reason='triton is not installed (bash tools/install.sh adds it)')
def test_rows_hold_the_rule(load_benchmark, monkeypatch, capsys):
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    assert load_benchmark('triton_rule').main(['--tokens', '70', '--landmarks', '9', '--device', 'cpu']) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [row.split()[1] for row in rows] == ['float16', 'float32', 'bfloat16', 'float32'] and len(rows) == 4
    for row in rows:
        errors = [float(e) for e in re.findall(r'\d\.\de-\d\d', row)]
        assert len(errors) == 8 and 'OUTSIDE' not in row, row
        assert all(fast <= 0.5 * plain for fast, plain in zip(errors[:4], errors[4:])), row
        assert 0 < float(row.split()[-1]) <= 1, row  # the worst error over its bound


@pytest.mark.skipif(TRITON_VERSION is None, reason='triton is not installed (bash tools/install.sh adds it)')
def test_cuda_without_a_gpu_is_refused_with_the_alternative(load_benchmark, monkeypatch, capsys):
    import torch
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        load_benchmark('triton_rule').main(['--device', 'cuda'])
    assert exit_info.value.code == 2
    assert '--device cuda needs a CUDA device; use --device cpu (the Triton interpreter)' in capsys.readouterr().err
