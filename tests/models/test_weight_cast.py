"""weights_cast_once on the GPU route (CPU tensors, Triton kernels interpreted), the way detection users train: each
stage's weights cast once per forward with exactly autocast's values (outputs and every gradient bit for bit), frozen
weights apart and doing no backward work, each stage's gradients ready when the backward leaves it (what DDP's
buckets need), and the cast standing aside where it would be wrong: a weight that is not a plain tensor (FSDP2's
DTensor), an outside checkpoint that recomputes the forward, the CPU route (the setups users reach besides:
test_weight_cast_setups.py)."""
from __future__ import annotations

import pytest
import torch
from helpers.cast_checks import ARCH, assert_same, count_casts, pyramid_model, step, without_cast
from helpers.kernel_launches import counted_launches
from helpers.op_checks import triton_kernels

from soft_mm.models import SOFT, weight_cast
from soft_mm.models.blocks import Block
from soft_mm.models.pyramid import SoftPyramid
from soft_mm.ops.route import route_of
from soft_mm.ops.triton_route import interpreted_triton_route

pytestmark = triton_kernels


@pytest.mark.parametrize('dtype', [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.cpu_float16)])
def test_outputs_and_gradients_are_those_of_autocasts_own_casts(gpu_route, monkeypatch, dtype):
    model = pyramid_model(arch=ARCH)
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(1))
    casts = count_casts(monkeypatch)
    with counted_launches() as once:
        result = step(model, x, dtype)
    # one cast per stage (every weight trainable), and nothing of the cast left on the layers after the forward
    assert len(casts) == 4 and all(not m.cast_weights for m in model.modules() if hasattr(m, 'cast_weights'))
    without_cast(monkeypatch)
    with counted_launches() as per_call:
        reference = step(model, x, dtype)
    assert_same(result, reference, grads_expected=len(list(model.parameters())))
    # autocast casts each GEMM weight at each call and its gradient back (the post-norm blocks' last biases are read in
    # float32 by the fused sum and norm): observed 119 casts against 33 (4 flat casts each way instead), 599 operators
    # against 501 (SOFT-Tiny: 165 against 37)
    casts, casts_ref = once.count('aten._to_copy'), per_call.count('aten._to_copy')
    assert casts_ref - casts >= 80 and len(per_call) - len(once) >= 80, (casts, casts_ref)


def test_the_parameters_are_back_after_the_forward_unchanged(gpu_route):
    model = pyramid_model(arch=ARCH)
    before = {name: (p, p.detach().clone()) for name, p in model.named_parameters()}
    step(model, torch.randn(1, 3, 64, 64))
    for name, p in model.named_parameters():
        assert p is before[name][0] and isinstance(p, torch.nn.Parameter) and torch.equal(p, before[name][1]), name
    assert all(not m.cast_weights for m in model.modules() if hasattr(m, 'cast_weights'))


def test_only_on_the_gpu_route_under_low_precision_autocast(gpu_route):
    model, x = pyramid_model(arch=ARCH), torch.randn(1, 3, 32, 32)
    stage = model.stages[0]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert weight_cast.cast_once_applies(stage, x, route_of(x))
    assert not weight_cast.cast_once_applies(stage, x, route_of(x))  # no autocast
    with torch.autocast('cpu', dtype=torch.float32):
        assert not weight_cast.cast_once_applies(stage, x, route_of(x))


def test_not_on_the_cpu_route():
    model, x = pyramid_model(arch=ARCH), torch.randn(1, 3, 32, 32)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert not weight_cast.cast_once_applies(model.stages[0], x, route_of(x))


def stage_one_output_needs_grad(model: SOFT, x: torch.Tensor) -> bool:
    seen = []
    handle = model.stages[0].register_forward_hook(lambda module, args, out: seen.append(out[0].requires_grad))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        model(x)
    handle.remove()
    return seen[0]


@pytest.mark.parametrize('route', ['gpu', 'cpu'])
def test_frozen_stages_do_no_backward_work_on_either_route(monkeypatch, route):
    torch.manual_seed(0)
    model = SOFT(ARCH, soft_norm=True, drop_path_rate=0.0, frozen_stages=1).train()
    x = torch.randn(2, 3, 64, 64)
    if route == 'cpu':
        assert not stage_one_output_needs_grad(model, x)
        return
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    casts = count_casts(monkeypatch)
    with interpreted_triton_route():
        assert not stage_one_output_needs_grad(model, x)
        # stage 1's linears (frozen) cast apart from stage 2's (trainable) and without a graph: one cast per stage
        assert len(casts) == 4
        with torch.autocast('cpu', dtype=torch.bfloat16):
            maps = model(x)
        assert maps[0].grad_fn is None and maps[1].grad_fn is not None
        with counted_launches() as backward:
            torch.autograd.backward([m.float().mean() for m in maps[1:]])
    # stage 1's one SOFT block runs none of its backward kernels: the trainable stages 2 and 3 have three SOFT blocks
    # (each 5 SOFT op launches and 3 add + LayerNorm launches backward: two sums and norms, the landmarks' norm), stage
    # 4 one softmax block (one sum and norm)
    assert backward.count('triton.nystrom_bwd_kernel_dq_dv_dl') == 3
    assert backward.count('triton.add_norm_bwd_kernel_dx') == 3 * 3 + 1
    assert all(p.grad is None for p in model.stages[0].parameters())
    assert all(p.grad is not None for p in model.stages[1].parameters())


def test_a_frozen_backbone_builds_no_graph(gpu_route):
    model = SOFT(ARCH, soft_norm=True, drop_path_rate=0.0).train().requires_grad_(False)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        maps = model(torch.randn(2, 3, 64, 64))
    assert all(m.grad_fn is None and not m.requires_grad for m in maps)


def test_any_frozen_subset_gets_no_gradient_and_the_rest_autocasts_gradients(gpu_route, monkeypatch):
    model = pyramid_model(arch=ARCH)
    # across stages: every query/key projection, one value projection, the MLPs' first layers of stage 4
    frozen = {name for name, p in model.named_parameters()
              if '.qk.' in name or name.startswith('stages.1.blocks.0.attn.v.') or
              (name.startswith('stages.3.') and '.fc1.' in name)}
    for name, p in model.named_parameters():
        p.requires_grad_(name not in frozen)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    casts = count_casts(monkeypatch)
    result = step(model, x)
    assert len(casts) == 8  # each stage: one cast of its trainable weights, one of its frozen ones
    without_cast(monkeypatch)
    reference = step(model, x)
    assert_same(result, reference, grads_expected=len(list(model.parameters())) - len(frozen))
    assert not frozen & set(result[1])


def test_each_stage_gradients_are_ready_when_the_backward_leaves_it(gpu_route):
    """What DDP's overlap needs: the last stage-4 parameter's gradient is accumulated before the backward reaches stage
    1, as on the CPU route (one cast of every weight would hand all of them their gradients at the very end)."""
    model = pyramid_model(arch=ARCH)
    order = []
    last = list(model.stages[3].parameters())[-1]
    last.register_post_accumulate_grad_hook(lambda p: order.append('stage 4 weight'))
    first = next(iter(model.stages[0].parameters()))
    first.register_post_accumulate_grad_hook(lambda p: order.append('stage 1 weight'))

    def watch_output(module, args, out):
        out[0].register_hook(lambda grad: order.append('stage 1 output'))

    handle = model.stages[0].register_forward_hook(watch_output)
    step(model, torch.randn(2, 3, 64, 64))
    handle.remove()
    assert order == ['stage 4 weight', 'stage 1 output', 'stage 1 weight'], order


class _Marked(torch.Tensor):
    """A tensor subclass, as FSDP2's and tensor parallelism's DTensor parameters are."""


def test_stands_aside_for_a_weight_that_is_not_a_plain_tensor(gpu_route, monkeypatch):
    model = pyramid_model(arch=ARCH)
    fc1 = model.stages[2].blocks[0].mlp.fc1
    fc1.weight = torch.nn.Parameter(fc1.weight.detach().as_subclass(_Marked))
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    casts = count_casts(monkeypatch)
    result = step(model, x)
    # stages 1 and 2 cast; stage 3 left to autocast, and stage 4 too (its input, computed with the subclass weight, is
    # of the subclass: not a plain eager tensor either)
    assert casts == [15, 20]
    without_cast(monkeypatch)
    assert_same(result, step(model, x))


def test_stands_aside_under_an_outside_checkpoint_and_block_wrappers_recompute_the_same(gpu_route, monkeypatch):
    from torch.utils.checkpoint import checkpoint

    model = pyramid_model(arch=ARCH)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    reference = step(model, x)
    casts = count_casts(monkeypatch)

    class Whole(torch.nn.Module):  # the whole backbone under a non-reentrant checkpoint: saved-tensor hooks around it
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward_pyramid(self, x):
            return checkpoint(self.inner.forward_pyramid, x, use_reentrant=False)

        def named_parameters(self, *args, **kwargs):
            return self.inner.named_parameters(*args, **kwargs)

        def zero_grad(self, set_to_none=True):
            self.inner.zero_grad(set_to_none)

    assert_same(step(Whole(model), x), reference)
    assert not casts  # the cast stood aside in the forward and in its recomputation
    # each block wrapped apart (as torch's apply_activation_checkpointing does): the stages cast, and the blocks'
    # recomputation, outside the cast, runs the same operations on autocast's casts of the same values
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper,
                                   check_fn=lambda module: isinstance(module, Block))
    assert_same(step(model, x), reference)
    assert len(casts) == 4


def test_the_plan_is_remade_when_a_weight_is_frozen_or_replaced(gpu_route, monkeypatch):
    """The stage's casts are worked out once and reused (no walk of the modules each step), and worked out again when
    what they depend on changes: a weight frozen, a parameter replaced, a BatchNorm's mode."""
    model = pyramid_model(arch=ARCH)
    x = torch.randn(1, 3, 64, 64)
    casts = count_casts(monkeypatch)
    step(model, x)
    plans = [weight_cast._PLANS[stage] for stage in model.stages]
    step(model, x)
    assert [weight_cast._PLANS[stage] for stage in model.stages] == plans  # the same objects: reused
    model.stages[1].blocks[0].mlp.fc1.weight.requires_grad_(False)
    model.stages[2].blocks[0].mlp.fc1.bias = torch.nn.Parameter(torch.zeros(4 * 48))
    model.stages[3].downsample.bn.eval()
    casts.clear()
    _, grads = step(model, x)
    remade = [weight_cast._PLANS[stage] is not plan for stage, plan in zip(model.stages, plans)]
    assert remade == [False, True, True, True]
    assert len(casts) == 5  # stage 2: its frozen weight in a cast of its own
    assert 'stages.1.blocks.0.mlp.fc1.weight' not in grads and 'stages.2.blocks.0.mlp.fc1.bias' in grads


def test_a_conv_whose_norm_does_not_fold_is_cast_in_eval_mode_too(gpu_route, monkeypatch):
    """A downsampling conv is left to autocast only where its BatchNorm folds into its weight (eval mode); with a norm
    that does not fold (GroupNorm, from norm_cfg) it is cast with the stage's other weights in either mode, with
    autocast's results."""
    torch.manual_seed(0)
    model = SoftPyramid(ARCH, soft_norm=True, drop_path_rate=0.0,
                        conv_norm_layer=lambda channels: torch.nn.GroupNorm(4, channels))
    model.init_pyramid_weights()
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    sizes = []
    for train in (True, False):
        model.train(train)
        casts = count_casts(monkeypatch)
        result = step(model, x)
        sizes.append(casts[:])
        monkeypatch.undo()
        monkeypatch.setenv('TRITON_INTERPRET', '1')
        without_cast(monkeypatch)
        assert_same(result, step(model, x))
        monkeypatch.undo()
        monkeypatch.setenv('TRITON_INTERPRET', '1')
    assert sizes[0] == sizes[1]  # the same tensors cast in training and in eval mode
    # while BatchNorm convs in eval mode are left out: stage 4's conv weight and bias fewer
    model = pyramid_model(arch=ARCH).eval()
    casts = count_casts(monkeypatch)
    step(model, x)
    assert [a - b for a, b in zip(sizes[1], casts)] == [6, 2, 2, 2]  # the stem's three convs in stage 1
