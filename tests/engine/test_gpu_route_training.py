"""The RetinaNet demo trains on the GPU route (CPU tensors, the Triton kernels in triton's interpreter) in both mixed
precisions detection users train in: bfloat16 (CPUAmpOptimWrapper) and float16 with a dynamic loss scale (what
mmengine's AmpOptimWrapper does by default)."""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from helpers.demo_training import demo_config, demo_runner, train_steps
from helpers.kernel_launches import counted_launches
from helpers.op_checks import cpu_float16, triton_kernels
from mmengine.logging import MessageHub
from mmengine.optim import AmpOptimWrapper, OptimWrapper

from soft_mm.engine import CPUAmpOptimWrapper
from soft_mm.models import weight_cast
from soft_mm.models.attention import SoftAttention
from soft_mm.ops.triton_route import interpreted_triton_route

pytestmark = [*triton_kernels, pytest.mark.slow]


class CPUFloat16AmpOptimWrapper(AmpOptimWrapper):
    """mmengine's ``AmpOptimWrapper`` with its defaults (``loss_scale='dynamic'``) on CPU: its own ``backward`` (the
    loss scaled) and ``step`` (the gradients unscaled before clipping, the step through the scaler, the scale updated)
    as they are; replaced only what refuses a CPU (pitfall 13): ``__init__`` asserts a GPU and builds CUDA's
    ``GradScaler``, and mmengine's ``autocast`` takes only bfloat16 on CPU."""

    def __init__(self, **kwargs) -> None:
        OptimWrapper.__init__(self, **kwargs)
        self._scale_update_param = None
        self.loss_scaler = torch.amp.GradScaler('cpu')  # 'dynamic': GradScaler()'s defaults, init_scale 2 ** 16
        self.cast_dtype = torch.float16

    @contextmanager
    def optim_context(self, model: torch.nn.Module) -> Iterator[None]:
        with OptimWrapper.optim_context(self, model), torch.autocast('cpu', dtype=torch.float16):
            yield


# One image of 96x96 a batch, the demo's 128x128 shrunk: the interpreter's time grows with the tokens (a step here
# takes 20-40 s on 2 cores). Not 64x64: there stage 4's 2x2 map makes a 1x1 P6, on which the FPN's stride-2 P7 conv
# gets a garbage weight gradient in bfloat16 from oneDNN (torch 2.14.1 on an AMX CPU; a CPU kernel, no GPU route's).
# lr 1e-4: each step lowers the loss (at the demos' 1e-3 the second step's loss rises). Two steps: the second one's
# forward measures the first one's update (measured: the loss 2.177 -> 1.791 in bfloat16, 2.176 -> 1.775 in float16,
# 18% lower; the test asks for 9%) and its launches are counted.
IMAGE_SIZE = 96
OPTIONS = {'train_dataloader.batch_size': 1, 'optim_wrapper.optimizer.lr': 1e-4}
STEPS = 2
LEARNED = 0.91  # the last step's loss under this fraction of the first one's


def watch_last_gradients(module: torch.nn.Module, optim_wrapper: OptimWrapper) -> dict[str, torch.Tensor]:
    """A dict that holds ``module``'s gradients as the optim wrapper found them when it zeroed them after its last step
    (unscaled and clipped: what the optimizer stepped with)."""
    grads, zero_grad = {}, optim_wrapper.zero_grad

    def keeping_them(**kwargs):
        grads.clear()
        grads.update({name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None})
        zero_grad(**kwargs)

    optim_wrapper.zero_grad = keeping_them
    return grads


def watch_unscaling(optim_wrapper: OptimWrapper) -> list[float]:
    """A list that gets the norm of all gradients as the loss scaler finds them before it unscales them, each step."""
    norms, unscale = [], optim_wrapper.loss_scaler.unscale_

    def recording(optimizer):
        params = [p for group in optimizer.param_groups for p in group['params'] if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))))
        unscale(optimizer)

    optim_wrapper.loss_scaler.unscale_ = recording
    return norms


@pytest.mark.parametrize('dtype', [torch.bfloat16, pytest.param(torch.float16, marks=cpu_float16)],
                         ids=['bfloat16', 'float16'])
def test_the_detection_demo_trains_on_the_gpu_route(dtype, tmp_path, monkeypatch):
    """Two steps on one 96x96 image: finite losses, the second one more than 9% under the first (measured 18%),
    clip_grad seeing unscaled gradients, each stage's weights cast once a forward, the SOFT and add + LayerNorm Triton
    kernels run forward and backward in every SOFT layer, every backbone parameter a finite non-zero gradient; in
    float16 the dynamic loss scale from 2^16, the backward on the scaled loss and the steps taken."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    cfg = demo_config('configs/retinanet_soft_tiny_demo.py', tmp_path, OPTIONS)
    resize = next(step for step in cfg.train_dataloader.dataset.pipeline if step.type == 'Resize')
    resize.scale = (IMAGE_SIZE, IMAGE_SIZE)
    runner, batch = demo_runner(cfg)
    wrapper = CPUAmpOptimWrapper if dtype == torch.bfloat16 else CPUFloat16AmpOptimWrapper
    optim_wrapper = runner.build_optim_wrapper(dict(runner.optim_wrapper, type=wrapper))
    backbone = runner.model.backbone
    grads = watch_last_gradients(backbone, optim_wrapper)
    casts, cast = [], weight_cast.FlatCastPlan.__call__
    monkeypatch.setattr(weight_cast.FlatCastPlan, '__call__',
                        lambda plan, tensors, to: casts.append(to) or cast(plan, tensors, to))
    scaler = getattr(optim_wrapper, 'loss_scaler', None)
    scaled_norms = [] if scaler is None else watch_unscaling(optim_wrapper)
    scales, losses, grad_norms = [], [], []  # (the loss scale before each step, and after the last)

    def step():
        scales.append(None if scaler is None else scaler.get_scale())
        losses.extend(train_steps(runner, optim_wrapper, batch, 1))
        grad_norms.append(MessageHub.get_current_instance().get_scalar('train/grad_norm').current())

    with interpreted_triton_route():
        for _ in range(STEPS - 1):
            step()
        with counted_launches() as launches:
            step()
    scales.append(None if scaler is None else scaler.get_scale())
    # a step the dynamic loss scale skipped (an inf or NaN gradient) halved the scale
    skipped = [scaler is not None and after < before for before, after in zip(scales, scales[1:])]

    assert all(math.isfinite(loss) for loss in losses), losses
    assert losses[-1] < LEARNED * losses[0], losses
    # the demo's clip_grad saw the unscaled gradients of each step taken (scaled by 2^16, their norm would be ~1e6)
    assert all(math.isfinite(norm) and norm < 1e3 for norm, skip in zip(grad_norms, skipped) if not skip), grad_norms
    # the GPU route: each stage's weights cast once per forward to the autocast dtype, ...
    assert casts == [dtype] * 4 * STEPS, casts
    # ... and each SOFT layer of the backbone ran the SOFT op's Triton kernels forward and backward
    soft_layers = sum(isinstance(m, SoftAttention) for m in backbone.modules())
    kernels = Counter(name for name in launches if name.startswith('triton.'))
    assert soft_layers == 6 and kernels['triton.nystrom_fwd_kernel_o'] == soft_layers, kernels
    assert kernels['triton.nystrom_bwd_kernel_dq_dv_dl'] == soft_layers, kernels
    assert kernels['triton.add_norm_fwd_kernel_y'] > 0 and kernels['triton.add_norm_bwd_kernel_dx'] > 0, kernels
    # every backbone parameter got a finite gradient in the last step, none of them all zeros
    names = [name for name, _ in backbone.named_parameters()]
    assert list(grads) == names, set(names) - set(grads)
    for name, grad in grads.items():
        assert torch.isfinite(grad).all() and grad.abs().max() > 0, name

    if scaler is not None:
        # the dynamic loss scale: from 2^16, finite, and the steps it did not skip taken by the optimizer (the last
        # one among them: its gradients are those checked above)
        assert scales[0] == 2.0 ** 16 and all(math.isfinite(s) and s > 0 for s in scales), scales
        steps_taken = {int(state['step']) for state in optim_wrapper.optimizer.state.values()}
        assert steps_taken == {STEPS - sum(skipped)} and not skipped[-1], (scales, steps_taken)
        # the backward ran on the scaled loss: the gradients' norm before unscaling is the scale times the one that
        # clip_grad measured after it (the scaled float16 gradients rounded: equal to ~1e-3)
        assert len(scaled_norms) == STEPS
        for scaled, norm, scale in zip(scaled_norms, grad_norms, scales):
            assert scaled == pytest.approx(scale * norm, rel=1e-2), (scaled_norms, grad_norms, scales)
