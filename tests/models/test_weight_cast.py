"""weights_cast_once: on the GPU route under autocast the pyramid's weights are cast once per forward, and the model
computes exactly what autocast's per-call casts give it (outputs and every gradient bit for bit), with far fewer
launches; elsewhere nothing changes."""
import pytest
import torch
from helpers.kernel_launches import counted_launches
from helpers.op_checks import triton_kernels

from soft_mm.models import weight_cast
from soft_mm.models.pyramid import SoftPyramid
from soft_mm.ops.triton_route import interpreted_triton_route

pytestmark = triton_kernels


def pyramid(seed=0):
    torch.manual_seed(seed)
    model = SoftPyramid('tiny', soft_norm=True, drop_path_rate=0.0)
    model.init_pyramid_weights()
    return model


def step(model, x):
    with torch.autocast('cpu', dtype=torch.bfloat16):
        maps, _ = model.forward_pyramid(x)
    torch.autograd.backward([m.float().square().mean() for m in maps])
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return [m.detach() for m in maps], grads


@pytest.fixture
def gpu_route(monkeypatch):
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    with interpreted_triton_route():
        yield


def test_outputs_and_gradients_are_those_of_autocasts_own_casts(gpu_route, monkeypatch):
    model = pyramid()
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(1))
    with counted_launches() as once:
        maps, grads = step(model, x)
    monkeypatch.setattr(weight_cast, 'cast_once_applies', lambda model, x: False)
    with counted_launches() as per_call:
        ref_maps, ref_grads = step(model, x)
    assert all(torch.equal(a, b) for a, b in zip(maps, ref_maps))
    assert grads.keys() == ref_grads.keys() and len(grads) == len(list(model.parameters()))
    for name in grads:
        assert torch.equal(grads[name], ref_grads[name]), name
    # SOFT-Tiny: 38 linear layers, 6 landmark convs and 6 stem/downsampling convs, most with a bias: 97 casts forward
    # and as many backward left to autocast (observed 237 casts in all against 43), a few launches instead
    casts, casts_ref = once.count('aten._to_copy'), per_call.count('aten._to_copy')
    assert casts_ref - casts >= 2 * 90 and len(per_call) - len(once) >= 2 * 90, (casts, casts_ref)


def test_the_parameters_are_back_after_the_forward_unchanged(gpu_route):
    model = pyramid()
    before = {name: (p, p.detach().clone()) for name, p in model.named_parameters()}
    step(model, torch.randn(1, 3, 64, 64))
    for name, p in model.named_parameters():
        assert p is before[name][0] and isinstance(p, torch.nn.Parameter) and torch.equal(p, before[name][1]), name
    assert all(not m.cast_queries for m in model.modules() if hasattr(m, 'cast_queries'))


def test_only_on_the_gpu_route_under_low_precision_autocast_without_checkpointing(gpu_route):
    model, x = pyramid(), torch.randn(1, 3, 32, 32)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert weight_cast.cast_once_applies(model, x)
    assert not weight_cast.cast_once_applies(model, x)  # no autocast
    model.with_cp = True
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert not weight_cast.cast_once_applies(model, x)


def test_not_on_the_cpu_route():
    model, x = pyramid(), torch.randn(1, 3, 32, 32)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert not weight_cast.cast_once_applies(model, x)
