"""weights_cast_once in the setups users reach, on the GPU route (CPU tensors, Triton kernels interpreted): a layer
replaced after the first step (each kind the cast holds, and a LoRA-style wrapper), FSDP1 with and without
``use_orig_params``, gradient checkpointing of the blocks (``with_cp``) keeping the cast, and mmengine's
``activation_checkpointing`` of the first stage; each against autocast's own per-call casts."""
from __future__ import annotations

import pytest
import torch
from helpers.cast_checks import ARCH, assert_same, count_casts, pyramid_model, step, without_cast
from helpers.op_checks import triton_kernels
from torch import nn

from soft_mm.models import weight_cast
from soft_mm.ops.route import route_of

pytestmark = triton_kernels


def _parent(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    *parents, name = path.split('.')
    owner = model
    for part in parents:
        owner = getattr(owner, part)
    return owner, name


def _like(layer: nn.Module, seed: int) -> nn.Module:
    """A new layer of ``layer``'s kind and shape with other weights."""
    generator = torch.Generator().manual_seed(seed)
    new = (nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None) if type(layer) is nn.Linear
           else nn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride, layer.padding,
                          bias=layer.bias is not None))
    with torch.no_grad():
        for p in new.parameters():
            p.copy_(0.05 * torch.randn(p.shape, generator=generator))
    return new


# each kind of layer the cast holds: a linear, the fused q/k + v (both projections) and q + kv projections, the
# landmark conv, a downsampling conv (training mode: its BatchNorm does not fold); in two rounds on one model, so that
# a fused projection is replaced alone (v, then qk; kv, then q), with its partner's plan kept
ROUNDS = [['stages.2.blocks.0.mlp.fc1', 'stages.1.blocks.0.attn.v', 'stages.3.blocks.0.attn.kv',
           'stages.0.blocks.0.attn.landmark_conv'],
          ['stages.1.blocks.1.attn.qk', 'stages.3.blocks.0.attn.q', 'stages.2.downsample.conv']]


def test_a_layer_replaced_after_a_step_is_the_one_that_computes(gpu_route, monkeypatch):
    model = pyramid_model(arch=ARCH)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    step(model, x)  # the stages' plans made
    for round_, paths in enumerate(ROUNDS):
        new = {}
        for path in paths:
            owner, name = _parent(model, path)
            new[path] = _like(getattr(owner, name), seed=9 + round_)
            setattr(owner, name, new[path])
        with monkeypatch.context() as patched:
            casts = count_casts(patched)
            result = step(model, x)
            assert len(casts) == 4, paths  # (one cast per stage, remade for the changed ones)
            without_cast(patched)
            reference = step(model, x)
        assert_same(result, reference)
        for path, layer in new.items():
            assert all(f'{path}.{p}' in result[1] for p, _ in layer.named_parameters()), path


class LoRA(nn.Module):
    """A low-rank update around a linear layer, as adapter libraries put one in place of a projection."""

    def __init__(self, base: nn.Linear, rank: int = 2) -> None:
        super().__init__()
        self.base = base
        self.down = nn.Linear(base.in_features, rank, bias=False)
        self.up = nn.Linear(rank, base.out_features, bias=False)
        nn.init.normal_(self.up.weight, std=0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.up(self.down(x))


PROJECTIONS = ('v', 'qk', 'proj')


def test_wrapped_projections_compute_through_their_wrappers(gpu_route, monkeypatch):
    model = pyramid_model(arch=ARCH)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(6))
    attn = model.stages[1].blocks[0].attn
    plain = step(model, x)
    for projection in PROJECTIONS:
        setattr(attn, projection, LoRA(getattr(attn, projection)))
    wrapped = step(model, x)
    # the updates join the output: each wrapper was called (its low-rank weights have gradients), not its base's
    # weight read directly
    assert not all(torch.equal(a, b) for a, b in zip(plain[0], wrapped[0]))
    for projection in PROJECTIONS:
        for name in (f'stages.1.blocks.0.attn.{projection}.up.weight',
                     f'stages.1.blocks.0.attn.{projection}.down.weight'):
            assert wrapped[1][name].abs().sum() > 0, name
    without_cast(monkeypatch)
    assert_same(wrapped, step(model, x))


@pytest.mark.parametrize('use_orig_params', [False, True])
def test_fsdp1_trains_with_autocasts_gradients(gpu_route, monkeypatch, tmp_path, use_orig_params):
    """FSDP1 (one gloo rank) swaps the layers' parameters for views of its flat parameter in the forward: the cast
    stands aside there, and the gradients are autocast's own, those of the unwrapped model."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel

    model = pyramid_model(arch=ARCH)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(7))
    without = monkeypatch.context()
    with without as patched:
        without_cast(patched)
        reference = step(model, x)

    class Top(nn.Module):
        def __init__(self, pyramid: nn.Module) -> None:
            super().__init__()
            self.pyramid = pyramid

        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            return self.pyramid.forward_pyramid(x)[0]

    dist.init_process_group('gloo', init_method=f'file://{tmp_path / "store"}', rank=0, world_size=1)
    try:
        sharded = FullyShardedDataParallel(Top(model), use_orig_params=use_orig_params, device_id=torch.device('cpu'))
        with torch.autocast('cpu', dtype=torch.bfloat16):
            maps = sharded(x)
        torch.autograd.backward([m.float().square().mean() for m in maps])
        if use_orig_params:
            with FullyShardedDataParallel.summon_full_params(sharded, with_grads=True):
                grads = {name.replace('_fsdp_wrapped_module.', '').removeprefix('pyramid.'): p.grad.clone()
                         for name, p in sharded.named_parameters() if p.grad is not None}
        else:  # one flat parameter (one rank: all of it), its gradient in the order of its names
            (flat,) = list(sharded.parameters())
            names = [name.removeprefix('pyramid.') for name in flat._fqns]
            numels = [reference[1][name].numel() for name in names]
            grads = {name: grad.reshape(reference[1][name].shape)
                     for name, grad in zip(names, flat.grad[:sum(numels)].split(numels))}
    finally:
        dist.destroy_process_group()
    assert all(torch.equal(a, b) for a, b in zip(maps, reference[0]))
    assert grads.keys() == reference[1].keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference[1][name], rtol=1e-6, atol=1e-9, msg=name)


def test_with_cp_keeps_the_cast_and_its_gradients(gpu_route, monkeypatch):
    model = pyramid_model(arch=ARCH)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(8))
    reference = step(model, x)
    model.with_cp = True
    casts = count_casts(monkeypatch)
    result = step(model, x)
    assert len(casts) == 4  # one per stage, as without checkpointing: the blocks recompute on the same casts
    assert_same(result, reference)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert weight_cast.cast_once_applies(model.stages[0], x, route_of(x))


def test_mmengine_activation_checkpointing_of_the_first_stage_gives_its_gradients(gpu_route):
    """mmengine's ``activation_checkpointing=['backbone.stages.0']`` puts a reentrant checkpoint on the stage's
    forward, whose output would need no gradient (its input, the image, needs none): the stage's weights get the
    gradients of the model without it."""
    mmengine = pytest.importorskip('mmengine')
    from mmengine.runner.activation_checkpointing import turn_on_activation_checkpointing

    model = pyramid_model(arch=ARCH)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(10))
    reference = step(model, x)
    turn_on_activation_checkpointing(model, ['stages.0', 'stages.2'])
    result = step(model, x)
    assert mmengine is not None and result[1].keys() == reference[1].keys()
    assert any(name.startswith('stages.0.') for name in result[1])
    assert_same(result, reference)
