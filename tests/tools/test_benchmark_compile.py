"""tools/benchmark_compile.py: ``torch.compile`` of the SOFT backbone gives the eager outputs."""
from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch

from soft_mm.models import SOFT

REPO_ROOT = Path(__file__).resolve().parents[2]
SMALL_ARCH = {'embed_dims': [16, 32, 48, 64], 'num_heads': [1, 2, 3, 4], 'depths': [1, 1, 1, 1]}
# odd sizes, one below the 224 grid (fewer landmarks per side) and one above it (pooled landmarks)
SIZES = [(64, 96), (257, 193)]
ATOL = 1e-4  # float32, outputs of magnitude ~5


@pytest.fixture(scope='module')
def tool(load_tool) -> ModuleType:
    return load_tool('benchmark_compile')


def _model() -> SOFT:
    torch.manual_seed(0)
    return SOFT(SMALL_ARCH, soft_norm=True).eval()


def test_compiled_graph_matches_eager(tool: ModuleType) -> None:
    # aot_eager records the same graph as inductor (the graph-capture paths of the model run) without code generation
    rows = tool.compare(_model(), SIZES, backend='aot_eager', repeats=1)
    assert [row['size'] for row in rows] == SIZES
    for row in rows:
        assert row['backend'] == 'aot_eager'
        assert row['max_abs_diff'] < ATOL


def test_unusable_backend_falls_back(tool: ModuleType, capsys: pytest.CaptureFixture) -> None:
    rows = tool.compare(_model(), SIZES[:1], backend='no_such_backend', repeats=1)
    assert rows[0]['backend'] == tool.FALLBACK_BACKEND
    assert rows[0]['max_abs_diff'] < ATOL
    assert "backend 'no_such_backend' failed" in capsys.readouterr().out


@pytest.mark.slow  # inductor compiles C++ kernels: about 3 minutes on 2 busy cores the first time
def test_inductor_matches_eager(tool: ModuleType) -> None:
    rows = tool.compare(_model(), SIZES[:1], backend='inductor', repeats=1)
    assert rows[0]['backend'] == 'inductor'  # the C++ compiler works here: no silent fallback
    assert rows[0]['max_abs_diff'] < ATOL
