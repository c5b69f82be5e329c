"""benchmarks/torch_compile.py: ``torch.compile`` of the SOFT backbone gives the eager outputs, from one whole graph per
input size that runs the eager code of the model (``soft_mm.ops.graph_mode.exporting()`` False) and the eager kernels,
the hand-written ones as custom-op nodes."""
from __future__ import annotations

import sys
from types import ModuleType

import pytest
import torch
from helpers.compile_recording import RecordingBackend

from soft_mm.models import SOFT
from soft_mm.ops import graph_mode
from soft_mm.ops.compat import HAS_CUSTOM_OP

SMALL_ARCH = {'embed_dims': [16, 32, 48, 64], 'num_heads': [1, 2, 3, 4], 'depths': [1, 1, 1, 1]}
# odd sizes, one below the 224 grid (fewer landmarks per side) and one above it (pooled landmarks)
SIZES = [(64, 96), (257, 193)]
ATOL = 1e-4  # float32, outputs of magnitude ~5


@pytest.fixture(scope='module')
def tool(load_benchmark) -> ModuleType:
    return load_benchmark('torch_compile')


def _model() -> SOFT:
    torch.manual_seed(0)
    model = SOFT(SMALL_ARCH, soft_norm=True)
    model.init_weights()  # the weights training starts from: outputs of magnitude ~5, as ATOL assumes
    return model.eval()


# What ``exporting()`` returned to soft_mm's modules while dynamo traced them, noted at trace time only: a list
# mutated by the traced code itself would be guarded on, and every call would recompile.
TRACED_FLAGS: list[bool] = []


def _note_traced_true(ctx) -> None:
    TRACED_FLAGS.append(True)


def _note_traced_false(ctx) -> None:
    TRACED_FLAGS.append(False)


@pytest.fixture
def capture_flags(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every value ``exporting()`` returned to soft_mm's modules while a graph was being traced."""
    from torch._dynamo.comptime import comptime  # runs its function while dynamo traces, nothing at run time

    original = graph_mode.exporting

    def noting() -> bool:
        flag = original()
        comptime(_note_traced_true if flag else _note_traced_false)
        return flag

    users = [module for name, module in list(sys.modules.items())
             if name.startswith('soft_mm') and getattr(module, 'exporting', None) is original]
    assert len(users) >= 3  # the graph_mode module itself (graph_mode(), the op's dispatch) and the model's layers
    for module in users:
        monkeypatch.setattr(module, 'exporting', noting)
    TRACED_FLAGS.clear()
    return TRACED_FLAGS


def assert_whole_graphs(rows: list[dict], backend: RecordingBackend, flags: list[bool]) -> None:
    """Each size was compiled by ``backend`` (no fallback) into one graph of the whole forward, traced with
    ``exporting()`` False wherever the model asked: a compiled model runs the code of the eager one. On torch < 2.4
    (no custom ops) the SOFT ops run eagerly between graphs: several graphs per size, the same flags."""
    assert [row['backend'] for row in rows] == [backend] * len(rows)
    if not HAS_CUSTOM_OP:
        assert len(backend.graphs) > len(rows), 'graph breaks at the SOFT ops (run eagerly on torch < 2.4)'
        assert flags and not any(flags), 'every shape-dependent branch took the eager path while compiled'
        return
    assert len(backend.graphs) == len(rows), 'one graph per input size: no graph break, no recompilation'
    for graph in backend.graphs:
        (output,) = [node for node in graph.graph.nodes if node.op == 'output']
        assert len(output.args[0]) == 4, 'the four stage maps come out of the graph'
    assert flags and not any(flags), 'every shape-dependent branch took the eager path while compiled'


def test_compiled_graph_matches_eager(tool: ModuleType, capture_flags: list[bool]) -> None:
    # aot_eager records the same graph as inductor (the graph-capture paths of the model run) without code generation
    backend = RecordingBackend('aot_eager')
    rows = tool.compare(_model(), SIZES, backend=backend, repeats=1)
    assert [row['size'] for row in rows] == SIZES
    assert_whole_graphs(rows, backend, capture_flags)
    for row in rows:
        assert row['max_abs_diff'] < ATOL


def test_compiled_model_runs_the_tiled_kernel_as_one_node(tool: ModuleType, capture_flags: list[bool]) -> None:
    # 400x368 input: 100x92 = 9200 stage-1 tokens, above AUTO_TILING_MIN_TOKENS, so eager runs the tiled backend, and
    # so must the compiled model: its custom op is one node of the graph (no Python tile loop traced into it)
    backend = RecordingBackend('aot_eager')
    rows = tool.compare(_model(), [(400, 368)], backend=backend, repeats=1)
    assert_whole_graphs(rows, backend, capture_flags)
    if HAS_CUSTOM_OP:  # stage 1's one SOFT block
        assert backend.targets().count(torch.ops.soft_mm.tiled_nystrom_products.default) == 1
    assert rows[0]['max_abs_diff'] < ATOL


def test_compiled_model_under_bfloat16_autocast_matches_eager(tool: ModuleType, capture_flags: list[bool]) -> None:
    # the custom ops' fake kernels run without autocast: the value conv's op (under torch.compile every SOFT stage's,
    # whatever its k: 9, 5 and 3 here) must get operands in one dtype at its entry, or tracing fails on a float32
    # weight against bfloat16 activations
    backend = RecordingBackend('aot_eager')
    rows = tool.compare(_model(), SIZES[:1], backend=backend, repeats=1, dtype=torch.bfloat16, float64_errors=True)
    assert_whole_graphs(rows, backend, capture_flags)
    if HAS_CUSTOM_OP:
        assert backend.targets().count(torch.ops.soft_mm.head_depthwise_conv.default) == 3
    assert rows[0]['max_abs_diff'] < 0.1  # bfloat16 outputs of magnitude ~5 (2^-8 relative), both the same kernels
    # against float64: bfloat16 rounding (2^-8 = 3.9e-3 relative), the compiled graph no worse than eager
    assert 1e-4 < rows[0]['eager_error'] < 3e-2 and rows[0]['compiled_error'] <= 1.5 * rows[0]['eager_error']


def test_unusable_backend_falls_back(tool: ModuleType, capsys: pytest.CaptureFixture) -> None:
    rows = tool.compare(_model(), SIZES[:1], backend='no_such_backend', repeats=1)
    assert rows[0]['backend'] == tool.FALLBACK_BACKEND
    assert rows[0]['max_abs_diff'] < ATOL
    assert "backend 'no_such_backend' failed" in capsys.readouterr().out


@pytest.mark.slow  # inductor compiles C++ kernels: about 3 minutes on 2 busy cores the first time
def test_inductor_matches_eager(tool: ModuleType, capture_flags: list[bool]) -> None:
    backend = RecordingBackend('inductor')
    rows = tool.compare(_model(), SIZES[:1], backend=backend, repeats=1)
    assert_whole_graphs(rows, backend, capture_flags)  # the C++ compiler works here: no silent fallback
    assert rows[0]['max_abs_diff'] < ATOL
