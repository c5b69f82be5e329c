"""The weight-cast tests' model, training step and reference: a small SOFT-Norm pyramid, one bfloat16 (or float16)
autocast step's maps and gradients, and autocast's own per-call casts (the cast switched off) to hold them against."""
from __future__ import annotations

import torch

from soft_mm.models import pyramid, weight_cast
from soft_mm.models.pyramid import SoftPyramid

# four stages, two blocks in stage 2: small enough for the interpreter, every kind of layer present
# 3x3 value convs: their fused kernel's taps are a loop the interpreter runs tap by tap (9x9: 9 times the time)
ARCH = {'embed_dims': [16, 32, 48, 64], 'num_heads': [1, 2, 3, 4], 'depths': [1, 2, 1, 1], 'v_conv_kernels': [3, 3, 3]}


def pyramid_model(seed=0, **kwargs):
    torch.manual_seed(seed)
    model = SoftPyramid(kwargs.pop('arch', 'tiny'), soft_norm=True, drop_path_rate=0.0, **kwargs)
    model.init_pyramid_weights()
    return model


def step(model, x, dtype=torch.bfloat16):
    with torch.autocast('cpu', dtype=dtype):
        maps, _ = model.forward_pyramid(x)
    torch.autograd.backward([m.float().square().mean() for m in maps])
    # (names as the state dict has them: without a checkpoint wrapper's own level)
    grads = {name.replace('_checkpoint_wrapped_module.', ''): p.grad.clone() for name, p in model.named_parameters()
             if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return [m.detach() for m in maps], grads


def without_cast(monkeypatch):
    """Autocast's own per-call casts: the reference the cast must reproduce."""
    for module in (weight_cast, pyramid):
        monkeypatch.setattr(module, 'cast_once_applies', lambda stage, x, route: False)


def count_casts(monkeypatch) -> list[int]:
    """A list that gets the number of tensors of each flat cast made."""
    calls, cast = [], weight_cast.FlatCastPlan.__call__
    monkeypatch.setattr(weight_cast.FlatCastPlan, '__call__',
                        lambda plan, tensors, dtype: calls.append(len(tensors)) or cast(plan, tensors, dtype))
    return calls


def assert_same(result, reference, grads_expected=None):
    maps, grads = result
    ref_maps, ref_grads = reference
    assert all(torch.equal(a, b) for a, b in zip(maps, ref_maps))
    assert grads.keys() == ref_grads.keys()
    if grads_expected is not None:
        assert len(grads) == grads_expected
    for name in grads:
        assert torch.equal(grads[name], ref_grads[name]), name
