"""bfloat16 mixed precision on CPU: the optim wrapper, mmcv's ops under bfloat16, and a bfloat16 training step of
each demo (detection, segmentation, classification) that is finite and lowers the loss."""
from __future__ import annotations

import math

import pytest
import torch
from helpers.demo_training import demo_config, demo_runner, train_steps
from mmengine.registry import OPTIM_WRAPPERS

from soft_mm.engine import CPUAmpOptimWrapper, enable_cpu_bf16_ops
from soft_mm.engine.amp import _float32_fallback
from soft_mm.ops.compat import autocast_dtype_of, autocast_enabled


def test_float32_fallback_casts_only_bfloat16_calls():
    seen = []

    def op(x, y, scale=1.0):
        seen.append((x.dtype, y.dtype, autocast_enabled('cpu')))
        return x * scale + y, torch.arange(3)

    wrapped = _float32_fallback(op, restore=True)
    assert _float32_fallback(wrapped, restore=True) is wrapped  # idempotent
    x, y = torch.randn(4), torch.randn(4)
    out, index = wrapped(x, y, scale=2.0)
    assert torch.equal(out, x * 2 + y) and seen[-1] == (torch.float32, torch.float32, False)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out, index = wrapped(x.bfloat16(), y)
    assert seen[-1] == (torch.float32, torch.float32, False)  # autocast off inside, inputs in float32
    assert out.dtype == torch.bfloat16 and index.dtype == torch.int64  # floating outputs back in bfloat16
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out, _ = _float32_fallback(op, restore=False)(x.bfloat16(), y)
    assert out.dtype == torch.float32


def test_mmcv_ops_take_bfloat16_after_enabling():
    pytest.importorskip('mmcv.ops')
    from mmcv.ops import RoIAlign, batched_nms
    gen = torch.Generator().manual_seed(0)
    corners = 100 * torch.rand(30, 2, generator=gen)
    boxes = torch.cat([corners, corners + 5 + 30 * torch.rand(30, 2, generator=gen)], 1)
    scores, labels = torch.rand(30, generator=gen), torch.randint(3, (30,), generator=gen)
    import sys
    with pytest.raises(RuntimeError, match='BFloat16'):  # what mmcv's CPU kernel does with bfloat16 by itself
        sys.modules['mmcv.ops.nms'].ext_module.nms(boxes.bfloat16(), scores.bfloat16(), iou_threshold=0.5, offset=0)
    enable_cpu_bf16_ops()
    enable_cpu_bf16_ops()  # idempotent
    _, keep = batched_nms(boxes, scores, labels, dict(type='nms', iou_threshold=0.5))
    dets_bf16, keep_bf16 = batched_nms(boxes.bfloat16(), scores.bfloat16(), labels, dict(type='nms', iou_threshold=0.5))
    assert dets_bf16.dtype == torch.float32 and len(keep_bf16) > 0  # kept in float32
    # the kept boxes are the same up to ties broken by bfloat16's coarser scores
    assert len(set(keep.tolist()) ^ set(keep_bf16.tolist())) <= 2
    feats = torch.randn(1, 8, 32, 32, generator=gen)
    rois = torch.tensor([[0, 2.0, 3.0, 20.0, 25.0], [0, 0.0, 0.0, 31.0, 31.0]])
    layer = RoIAlign((7, 7), spatial_scale=1.0, sampling_ratio=0)
    reference = layer(feats, rois)
    low = layer(feats.bfloat16(), rois)
    assert low.dtype == torch.bfloat16 and torch.allclose(low.float(), reference, atol=0.05)


def test_optim_wrapper_runs_the_step_under_bfloat16_autocast():
    model = torch.nn.Linear(8, 4)
    wrapper = OPTIM_WRAPPERS.build(dict(type='CPUAmpOptimWrapper', optimizer=torch.optim.SGD(model.parameters(), 0.1)))
    assert isinstance(wrapper, CPUAmpOptimWrapper)
    with wrapper.optim_context(model):
        assert autocast_enabled('cpu') and autocast_dtype_of('cpu') == torch.bfloat16
        out = model(torch.randn(2, 8))
    assert out.dtype == torch.bfloat16 and not autocast_enabled('cpu')
    before = model.weight.detach().clone()
    wrapper.update_params(out.float().square().sum())
    assert model.weight.dtype == torch.float32 and not torch.equal(model.weight, before)


# two images a batch for the dense demos (their configs take 4-8): the same steps on a quarter of the pixels
DEMOS = {
    'detection': ('configs/retinanet_soft_tiny_demo.py', {'train_dataloader.batch_size': 2}),
    'instance segmentation': ('configs/mask_rcnn_soft_tiny_demo.py', {'train_dataloader.batch_size': 2}),
    'segmentation': ('configs/upernet_soft_tiny_demo.py', {'train_dataloader.batch_size': 2}),
    'classification': ('configs/soft_tiny_in1k_demo.py',
                       {'train_dataloader.dataset.generator.num_train_per_class': 2,
                        'train_dataloader.dataset.generator.num_val_per_class': 1,
                        'train_dataloader.batch_size': 8,
                        'model.train_cfg': None}),  # no Mixup/CutMix: the same batch every step
}


@pytest.mark.parametrize('demo', list(DEMOS))
def test_bfloat16_training_steps_of_each_demo_lower_the_loss(demo, tmp_path, monkeypatch):
    """Six CPUAmpOptimWrapper steps on one batch of the demo: every loss finite, the last below the first."""
    config, options = DEMOS[demo]
    monkeypatch.chdir(tmp_path)
    cfg = demo_config(config, tmp_path, {**options, 'optim_wrapper.type': 'CPUAmpOptimWrapper',
                                         'optim_wrapper.optimizer.lr': 1e-3})
    runner, batch = demo_runner(cfg)
    optim_wrapper = runner.build_optim_wrapper(runner.optim_wrapper)
    assert isinstance(optim_wrapper, CPUAmpOptimWrapper)
    losses = train_steps(runner, optim_wrapper, batch, 6)
    assert all(math.isfinite(loss) for loss in losses), losses
    assert losses[-1] < losses[0], losses
