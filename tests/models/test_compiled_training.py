"""compile_stages on the GPU route (CPU tensors, Triton kernels interpreted) in training, the way a detection user
compiles the backbone: two batch sizes alternating, the compiles counted and bounded, the weights left to the
compiler."""
from __future__ import annotations

import torch
from helpers.op_checks import triton_kernels

from soft_mm.models import SOFT

pytestmark = triton_kernels
ARCH = {'embed_dims': [16, 32, 48, 64], 'num_heads': [1, 2, 3, 4], 'depths': [1, 1, 1, 1]}


def _training_steps(model, sizes, gpu_route: bool):
    """One bfloat16 training step per size (backward of the maps' means), on the GPU route where asked."""
    import contextlib

    from soft_mm.ops.triton_route import interpreted_triton_route

    route = interpreted_triton_route() if gpu_route else contextlib.nullcontext()
    maps_of = []
    with route:
        for size in sizes:
            x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(sum(size)))
            with torch.autocast('cpu', dtype=torch.bfloat16):
                maps = model(x)
            torch.autograd.backward([m.float().mean() for m in maps])
            maps_of.append([m.detach() for m in maps])
            model.zero_grad(set_to_none=True)
    return maps_of


def test_two_alternating_sizes_train_with_a_bounded_number_of_compiles_and_no_cast(monkeypatch):
    """The GPU route's training step under compile_stages with the sizes of two detection batches alternating (64x96,
    64x128, back to 64x96): each stage compiles one dynamic graph and never again (nor for two new sizes, 96x64 and
    128x96), and the weights are left to the compiler (no flat cast swapped into a compiled stage's parameters)."""
    from soft_mm.models import weight_cast

    monkeypatch.setenv('TRITON_INTERPRET', '1')
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(len(graph_module.graph.nodes))
        return graph_module.forward

    casts = []
    monkeypatch.setattr(weight_cast.FlatCastPlan, '__call__', lambda *args, **kwargs: casts.append(1))
    torch.manual_seed(0)
    # a 2 x 2 landmark grid: every stage's grid full at these sizes, as the 7 x 7 one is at detection sizes (a grid
    # that grows with the image changes the number of landmarks, the kernels' tiles, and so the graph)
    model = SOFT(ARCH, soft_norm=True, drop_path_rate=0.1, landmark_grid=2,
                 compile_stages=dict(backend=counting_backend, dynamic=True)).train()
    _training_steps(model, [(64, 96), (64, 128), (64, 96)], gpu_route=True)
    assert not casts
    assert len(graphs) == 4, graphs  # one graph a stage for both sizes (dynamic from the first)
    _training_steps(model, [(96, 64), (128, 96)], gpu_route=True)
    assert len(graphs) == 4, graphs  # new sizes too: the dynamic graphs take them, nothing recompiled

