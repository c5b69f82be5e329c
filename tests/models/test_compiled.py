"""soft_mm.models.compiled: the backbone's ``compile_stages`` switch checked, its stages compiled once each (dynamo's
``eager`` backend: the same graphs without code generation) with the eager outputs, and copies that compile their
own."""
from __future__ import annotations

import copy

import pytest
import torch

from soft_mm.models import SOFT
from soft_mm.models.compiled import check_compile_stages

ARCH = {'embed_dims': [16, 32, 48, 64], 'num_heads': [1, 2, 3, 4], 'depths': [1, 1, 1, 1]}


def test_the_switch_takes_none_true_or_compile_keywords():
    assert check_compile_stages(None) is None and check_compile_stages(False) is None
    assert check_compile_stages(True) == dict(dynamic=True)
    assert check_compile_stages(dict(mode='reduce-overhead')) == dict(mode='reduce-overhead')
    assert check_compile_stages(dict(mode='reduce-overhead', pad_size_divisor=256)) == dict(
        mode='reduce-overhead', pad_size_divisor=256)
    with pytest.raises(ValueError, match=r"compile_stages must be None, True \(dict\(dynamic=True\)\) or a dict of "
                                         r"torch.compile keywords \('dynamic', 'mode', 'backend', 'fullgraph', "
                                         r"'options'\) and 'pad_size_divisor', got \{'dynamc': True\}"):
        SOFT(ARCH, compile_stages=dict(dynamc=True))
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match=r"compile_stages\['pad_size_divisor'\] must be an int >= 1 \(the input "
                                             rf"padded to a multiple of it\), got {bad!r}"):
            SOFT(ARCH, compile_stages=dict(pad_size_divisor=bad))


def test_each_stage_compiles_once_and_gives_the_eager_maps():
    torch.manual_seed(0)
    eager = SOFT(ARCH, soft_norm=True, drop_path_rate=0.0)
    eager.init_weights()  # the weights training starts from
    eager.eval()
    compiled = SOFT(ARCH, soft_norm=True, drop_path_rate=0.0, compile_stages=dict(backend='eager', dynamic=True)).eval()
    compiled.load_state_dict(eager.state_dict())
    for size in ((64, 96), (96, 64)):  # two sizes, one graph per stage (dynamic sizes)
        x = torch.randn(1, 3, *size)
        with torch.no_grad():
            for a, b in zip(compiled(x), eager(x)):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert len(compiled._compiled.runners) == 4
    twin = copy.deepcopy(compiled)  # (mmengine's EMA copies the model): the copy compiles its own stages
    assert twin._compiled.runners == {} and twin.compile_stages == compiled.compile_stages


def test_the_padded_buckets_give_the_maps_of_the_padded_input_cropped():
    """compile_stages' pad_size_divisor: the input padded with zeros at the bottom and right to the next multiple, the
    maps cropped to the unpadded input's sizes; two sizes of one bucket are one static graph."""
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(1)
        return graph_module.forward

    torch.manual_seed(0)
    eager = SOFT(ARCH, soft_norm=True, drop_path_rate=0.0)
    eager.init_weights()  # the weights training starts from
    eager.eval()
    bucketed = SOFT(ARCH, soft_norm=True, drop_path_rate=0.0,
                    compile_stages=dict(backend=counting_backend, dynamic=False, pad_size_divisor=64)).eval()
    bucketed.load_state_dict(eager.state_dict())
    for height, width in ((70, 100), (90, 128), (65, 75)):  # all in the 128 x 128 bucket
        x = torch.randn(1, 3, height, width)
        with torch.no_grad():
            maps = bucketed(x)
            padded = eager(torch.nn.functional.pad(x, (0, 128 - width, 0, 128 - height)))
        for i, (got, full) in enumerate(zip(maps, padded)):
            stride = 2 ** (i + 2)
            assert got.shape[-2:] == (-(-height // stride), -(-width // stride))
            torch.testing.assert_close(got, full[..., :got.shape[-2], :got.shape[-1]], rtol=1e-5, atol=1e-5)
    assert len(graphs) == 4  # one graph a stage for the three sizes


def test_sizes_of_one_kind_share_the_dynamic_graphs_on_the_cpu_route():
    # the dispatcher's reasons for passing over a backend name no traced size (a size written into a text fixes the
    # graph to it): three inputs of different token counts, one graph a stage
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(1)
        return graph_module.forward

    # (from a fresh dynamo: what earlier compiles of the stages' code saw changes what it specializes. The first
    # input is not square: dynamo's duck sizing would give a square one's height and width one symbol, and the next
    # size of another shape one recompile)
    torch._dynamo.reset()
    model = SOFT(ARCH, soft_norm=True, drop_path_rate=0.0, landmark_grid=2,
                 compile_stages=dict(backend=counting_backend, dynamic=True)).eval()
    with torch.no_grad():
        for size in ((96, 128), (112, 144), (120, 160)):  # (all on one side of the CPU convolution's size guard)
            model(torch.randn(1, 3, *size))
    assert len(graphs) == 4, graphs
    torch._dynamo.reset()
