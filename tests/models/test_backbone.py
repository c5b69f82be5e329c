"""Tests of the SOFT mm backbone: shapes at odd and detection resolutions, bounded landmarks, out_indices,
frozen_stages, norm_eval, with_cp, stochastic depth, every attention setting, init_weights and the Pretrained
init_cfg, the convs' norm_cfg (SyncBN) and position embeddings."""
from __future__ import annotations

import math

import pytest
import torch
from helpers.op_checks import cpu_float16
from torch import nn

from soft_mm.models import ARCH_SETTINGS, SOFT, SoftAttention, SoftVisionTransformer
from soft_mm.models import pyramid as pyramid_module

TINY_DIMS = ARCH_SETTINGS['tiny']['embed_dims']
# A narrow custom arch (same strides, landmark strides and kernels as the published ones) for the tests of settings,
# where the width of the published models only costs time.
NARROW_ARCH = {'embed_dims': (16, 32, 48, 64), 'num_heads': (1, 2, 2, 2), 'depths': (1, 2, 2, 2)}


def make(**kwargs) -> SOFT:
    """A SOFT model built from seed 0 as training starts it: ``init_weights()`` called, unless an ``init_cfg`` is given
    (its test calls ``init_weights()`` itself)."""
    torch.manual_seed(0)
    model = SOFT(**{'arch': 'tiny', **kwargs})
    if 'init_cfg' not in kwargs:
        model.init_weights()
    return model


def make_narrow(**kwargs) -> SOFT:
    return make(**{'arch': NARROW_ARCH, **kwargs})


def stage_sizes(h: int, w: int) -> list[tuple[int, int]]:
    """Map sizes after the stride-4 stem (two stride-2 3x3 convs, padding 1) and each stride-2 downsampling."""
    sizes = []
    for i in range(4):
        for _ in range(2 if i == 0 else 1):
            h, w = math.ceil(h / 2), math.ceil(w / 2)
        sizes.append((h, w))
    return sizes


def record_landmarks(monkeypatch) -> list[tuple[tuple[int, int], int]]:
    """Patch SoftAttention.sample_landmarks to record (hw_shape, number of landmarks) of every call."""
    records = []
    original = SoftAttention.sample_landmarks

    def recording(self, q, hw_shape, route=None):
        landmarks = original(self, q, hw_shape, route)
        records.append((tuple(hw_shape), landmarks.shape[2]))
        return landmarks

    monkeypatch.setattr(SoftAttention, 'sample_landmarks', recording)
    return records


@pytest.mark.parametrize('hw', [(224, 224), (33, 47), (512, 512), (800, 1333)])
def test_channels_strides_and_bounded_landmarks(hw, monkeypatch):
    model = make().eval()
    records = record_landmarks(monkeypatch)
    with torch.no_grad():
        outs = model(torch.randn(1, 3, *hw))
    sizes = stage_sizes(*hw)
    assert [tuple(o.shape) for o in outs] == [(1, c, *s) for c, s in zip(TINY_DIMS, sizes)]
    assert model.out_channels == list(TINY_DIMS)
    assert all(o.isfinite().all() for o in outs)
    # one record per SOFT block (depths 1, 2, 3), at the stage maps, never more than 7 x 7 landmarks
    assert [r[0] for r in records] == [sizes[0]] + [sizes[1]] * 2 + [sizes[2]] * 3
    assert all(m <= 49 for _, m in records)
    if hw == (800, 1333):
        assert sizes[0] == (200, 334)
        assert [m for _, m in records] == [49] * 6  # m stays 49 (a bare stride-8 conv would give 25 x 41 = 1025)
    if hw == (224, 224):
        assert [m for _, m in records] == [49] * 6  # the published 7 x 7 landmarks in every stage


def test_maps_are_contiguous_nchw_for_raw_buffer_ops():
    """mmcv's C++ ops (RoIAlign in Mask R-CNN's RoI heads) read the buffer as NCHW whatever the strides say; a
    channels-last map (what the (B, N, C) tokens become when only transposed) gives them scrambled features."""
    mmcv_ops = pytest.importorskip('mmcv.ops')
    from torchvision.ops import roi_align

    model = make_narrow().eval()
    with torch.no_grad():
        outs = model(torch.randn(2, 3, 61, 83))
    assert all(o.is_contiguous() for o in outs)
    rois = torch.tensor([[0, 3.0, 5.0, 40.0, 30.0], [1, 20.0, 11.0, 77.0, 58.0]])
    for stride, feat in zip((4, 8, 16, 32), outs):
        expected = roi_align(feat, rois, (7, 7), spatial_scale=1 / stride, sampling_ratio=2, aligned=True)
        got = mmcv_ops.RoIAlign((7, 7), 1 / stride, sampling_ratio=2, aligned=True)(feat, rois)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_bfloat16_autocast_keeps_the_residual_stream_in_bfloat16():
    """Under CPU bfloat16 autocast every block reads and writes bfloat16 tokens, as Swin's and ConvNeXt's do: a
    float32 position embedding must not promote the stream (every linear would then cast its input back, and the
    adds mix dtypes). The classifier's prefix token joins the stream in its dtype too."""
    dtypes = []

    def record(module, args, output):
        dtypes.append((args[0].dtype, output.dtype))

    for model, size in ((make_narrow(), (61, 83)), (SoftVisionTransformer(NARROW_ARCH, num_classes=3), (224, 224))):
        model.eval()
        dtypes.clear()
        hooks = [m.register_forward_hook(record) for m in model.modules() if type(m).__name__ == 'Block']
        with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
            out = model(torch.randn(1, 3, *size))
        for hook in hooks:
            hook.remove()
        assert len(dtypes) == sum(NARROW_ARCH['depths'])
        assert set(dtypes) == {(torch.bfloat16, torch.bfloat16)}
        assert all(o.dtype == torch.bfloat16 for o in (out if isinstance(out, (list, tuple)) else [out]))
    with torch.no_grad():  # float32 unchanged: the cast is a no-op
        assert all(o.dtype == torch.float32 for o in make_narrow().eval()(torch.randn(1, 3, 61, 83)))


@cpu_float16
def test_cuda_autocast_rules_keep_the_residual_stream_and_the_op_output_in_float16(monkeypatch):
    """CUDA's float16 autocast (mmdet's --amp on a GPU) reproduced on CPU: linears and convs in float16 (CPU autocast
    does that) and LayerNorm in float32 with a float32 output (CUDA autocast's rule, patched in here; CPU autocast
    keeps LayerNorm in its input's dtype). The landmarks then arrive in float32 (a LayerNorm ends their path), yet
    the SOFT op's output follows autocast and the post-norm blocks keep the stream in float16, as under CPU autocast.
    """
    import torch.nn.functional as F

    import soft_mm.models.attention as attention_module

    layer_norm = F.layer_norm

    def cuda_autocast_layer_norm(x, shape, weight=None, bias=None, eps=1e-5):
        if not torch.is_autocast_enabled('cpu'):
            return layer_norm(x, shape, weight, bias, eps)
        with torch.autocast('cpu', enabled=False):
            return layer_norm(x.float(), shape, None if weight is None else weight.float(),
                              None if bias is None else bias.float(), eps)

    op_dtypes, block_dtypes = [], []
    soft_attention = attention_module.soft_attention

    def recorded_soft_attention(q, landmarks, v, **kwargs):
        out = soft_attention(q, landmarks, v, **kwargs)
        op_dtypes.append((q.dtype, landmarks.dtype, v.dtype, out.dtype))
        return out

    monkeypatch.setattr(F, 'layer_norm', cuda_autocast_layer_norm)
    monkeypatch.setattr(attention_module, 'soft_attention', recorded_soft_attention)
    model = make_narrow().eval()
    for module in model.modules():
        if type(module).__name__ == 'Block':
            module.register_forward_hook(lambda m, args, out: block_dtypes.append((args[0].dtype, out.dtype)))
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.float16):
        assert cuda_autocast_layer_norm(torch.randn(2, 4).half(), (4,)).dtype == torch.float32  # the rule holds
        model(torch.randn(1, 3, 61, 83))
    assert len(op_dtypes) == 5 and set(op_dtypes) == {(torch.float16, torch.float32, torch.float16, torch.float16)}
    assert len(block_dtypes) == 7 and set(block_dtypes) == {(torch.float16, torch.float16)}


@pytest.mark.parametrize('hw', [(32, 32), (8, 8), (1, 1)])
def test_maps_smaller_than_a_landmark_window(hw):
    # 32x32: stage-1 map 8x8, smaller than the 8 * 7 window the conv landmarks assume; 8x8: stage-1 map 2x2.
    model = make(drop_path_rate=0.0)
    x = torch.randn(2, 3, *hw, requires_grad=True)
    outs = model(x)
    assert [tuple(o.shape[2:]) for o in outs] == stage_sizes(*hw)
    assert all(o.isfinite().all() for o in outs)
    sum(o.pow(2).mean() for o in outs).backward()
    assert x.grad.isfinite().all() and x.grad.abs().max() > 0


def test_out_indices_subsets_and_early_stop():
    model = make_narrow().eval()
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        full = model(x)
        model.out_indices = (1, 3)
        subset = model(x)
    assert len(subset) == 2
    torch.testing.assert_close(subset[0], full[1], rtol=0, atol=0)
    torch.testing.assert_close(subset[1], full[3], rtol=0, atol=0)

    only_first = make_narrow(out_indices=(0,)).eval()
    assert only_first.out_channels == [16]
    calls = []
    only_first.stages[1].register_forward_pre_hook(lambda *args: calls.append(1))
    with torch.no_grad():
        outs = only_first(x)
    assert len(outs) == 1 and outs[0].shape == (1, 16, 16, 24) and not calls  # later stages are not run

    assert make_narrow(out_indices=2).out_channels == [48]
    assert make_narrow(out_indices=[3, 1]).out_channels == [64, 32]


@pytest.mark.parametrize('out_indices', [(), (4,), (-1,), (0, 5)])
def test_bad_out_indices(out_indices):
    with pytest.raises(ValueError, match='out_indices'):
        SOFT(out_indices=out_indices)


def expected_frozen(name: str, frozen_stages: int) -> bool:
    if frozen_stages < 0:
        return False
    if name.startswith('stages.0.downsample.') or name == 'stages.0.pos_embed':
        return True
    if any(name.startswith(f'stages.{i}.') for i in range(frozen_stages)):
        return True
    return frozen_stages == 4 and name.startswith('norm.')


@pytest.mark.parametrize('frozen_stages', [-1, 0, 1, 2, 3, 4])
def test_frozen_stages_requires_grad_and_eval_mode(frozen_stages):
    model = make_narrow(frozen_stages=frozen_stages)
    model.train()
    for name, param in model.named_parameters():
        assert param.requires_grad != expected_frozen(name, frozen_stages), name
    frozen_modules = {'stages.0.downsample'} if frozen_stages >= 0 else set()
    frozen_modules |= {f'stages.{i}' for i in range(max(frozen_stages, 0))}
    if frozen_stages == 4:
        frozen_modules.add('norm')
    for name, module in model.named_modules():
        frozen = any(name == f or name.startswith(f + '.') for f in frozen_modules)
        assert module.training != frozen, name
    num_frozen = sum(not p.requires_grad for p in model.parameters())
    assert (num_frozen > 0) == (frozen_stages >= 0)


def test_bad_frozen_stages():
    for frozen_stages in (-2, 5, 1.0):
        with pytest.raises(ValueError, match='frozen_stages'):
            SOFT(frozen_stages=frozen_stages)


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_training_step_leaves_frozen_parameters_and_bn_statistics_unchanged():
    model = make_narrow(frozen_stages=2, drop_path_rate=0.0)
    model.train()
    before = snapshot(model)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9,
                                weight_decay=0.1)
    outs = model(torch.randn(2, 3, 64, 64))
    sum(o.pow(2).mean() for o in outs).backward()
    optimizer.step()
    after = snapshot(model)
    for key in before:
        unchanged = torch.equal(before[key], after[key])
        if key.startswith(('stages.0.', 'stages.1.')):
            assert unchanged, key
    # the step did train the rest, BN statistics included
    assert not torch.equal(before['stages.2.downsample.bn.running_mean'], after['stages.2.downsample.bn.running_mean'])
    assert not torch.equal(before['stages.2.pos_embed'], after['stages.2.pos_embed'])
    assert not torch.equal(before['stages.3.blocks.1.mlp.fc2.weight'], after['stages.3.blocks.1.mlp.fc2.weight'])


@pytest.mark.parametrize('norm_eval', [False, True])
def test_norm_eval_keeps_batchnorm_in_eval(norm_eval):
    model = make_narrow(norm_eval=norm_eval)
    model.train()
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(bns) == 6  # three in the stem, one per downsampling
    assert all(bn.training != norm_eval for bn in bns)
    assert all(m.training for m in model.modules() if isinstance(m, nn.LayerNorm))
    before = [bn.running_mean.clone() for bn in bns]
    with torch.no_grad():
        model(torch.randn(2, 3, 32, 32))
    changed = [not torch.equal(b, bn.running_mean) for b, bn in zip(before, bns)]
    assert all(changed) if not norm_eval else not any(changed)
    model.eval()
    assert not any(m.training for m in model.modules())


@pytest.mark.parametrize('conv_bias', [True, False])
def test_conv_bn_act_folds_eval_batchnorm_exactly(conv_bias):
    """In eval mode the BatchNorm is folded into the conv: the same outputs and the same gradients (conv weight and
    bias, BatchNorm scale and shift, input) as conv -> BatchNorm -> ReLU run one after the other, in float64."""
    torch.manual_seed(0)
    block = pyramid_module.ConvBNAct(5, 7, stride=2).double()
    if not conv_bias:
        block.conv.bias = None
    with torch.no_grad():
        block.bn.running_mean.normal_()
        block.bn.running_var.uniform_(0.2, 3.0)
        block.bn.weight.normal_()
        block.bn.bias.normal_()
    block.eval()
    x = torch.randn(2, 5, 13, 10, dtype=torch.float64, requires_grad=True)
    params = [p for p in block.parameters()]
    bn_calls = []
    hook = block.bn.register_forward_hook(lambda *_: bn_calls.append(1))
    folded = block(x)
    assert not bn_calls, 'the eval-mode BatchNorm is folded into the conv, not run as a pass of its own'
    hook.remove()
    reference = torch.relu(block.bn(block.conv(x)))
    assert torch.equal(folded > 0, reference > 0) and bool((folded > 0).any())
    torch.testing.assert_close(folded, reference, rtol=1e-13, atol=1e-13)
    grad = torch.randn_like(folded)
    got = torch.autograd.grad(folded, [x, *params], grad)
    want = torch.autograd.grad(reference, [x, *params], grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    # training mode normalises with the batch statistics and updates the running ones, as plain BatchNorm does
    block.train()
    before = block.bn.running_mean.clone()
    torch.testing.assert_close(block(x), torch.relu(nn.functional.batch_norm(
        block.conv(x), None, None, block.bn.weight, block.bn.bias, training=True, eps=block.bn.eps)))
    assert not torch.equal(before, block.bn.running_mean)


@pytest.mark.parametrize('train', [False, True])
def test_conv_bn_act_takes_a_channels_last_batch_of_one_as_it_is(train):
    """A stage's map is a channels-last view of its tokens, whose size-1 batch dim has an arbitrary stride: the conv
    runs channels-last on it (the weight handed over in channels-last memory; with an NCHW weight the conv would
    copy the input to NCHW and write NCHW), with the values of the NCHW input's, in float64."""
    torch.manual_seed(0)
    block = pyramid_module.ConvBNAct(8, 6, stride=2).double().train(train)
    tokens = torch.randn(1, 13 * 10, 8, dtype=torch.float64)
    x = tokens.transpose(1, 2).reshape(1, 8, 13, 10)
    assert x.is_contiguous(memory_format=torch.channels_last) and x.stride(0) != 13 * 10 * 8
    out = block(x)
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    torch.testing.assert_close(out, block(x.contiguous()), rtol=1e-13, atol=1e-13)


def test_conv_bn_act_after_fusing_outside():
    """A block whose BatchNorm something replaced (mmcv's ``fuse_conv_bn`` puts an Identity there) runs its
    modules as they are."""
    torch.manual_seed(0)
    block = pyramid_module.ConvBNAct(3, 4, stride=1).double().eval()
    x = torch.randn(1, 3, 6, 6, dtype=torch.float64)
    expected = block(x)
    with torch.no_grad():
        scale = block.bn.weight / torch.sqrt(block.bn.running_var + block.bn.eps)
        block.conv.weight.mul_(scale.reshape(-1, 1, 1, 1))
        block.conv.bias.copy_((block.conv.bias - block.bn.running_mean) * scale + block.bn.bias)
    block.bn = nn.Identity()
    torch.testing.assert_close(block(x), expected, rtol=1e-13, atol=1e-13)


def test_with_cp_same_outputs_and_gradients():
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    results = []
    for with_cp in (False, True):
        model = make_narrow(with_cp=with_cp, drop_path_rate=0.0).double()
        calls = []
        model.stages[0].blocks[0].register_forward_pre_hook(lambda *args, calls=calls: calls.append(1))
        outs = model(x)
        sum(o.pow(2).mean() for o in outs).backward()
        results.append(([o.detach() for o in outs], {n: p.grad for n, p in model.named_parameters()}))
        assert len(calls) == (2 if with_cp else 1)  # checkpointing recomputes the block in backward
    (outs_plain, grads_plain), (outs_cp, grads_cp) = results
    for a, b in zip(outs_plain, outs_cp):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert grads_plain.keys() == grads_cp.keys()
    for name in grads_plain:
        torch.testing.assert_close(grads_cp[name], grads_plain[name], rtol=1e-9, atol=1e-12, msg=name)


def test_with_cp_applies_to_trainable_blocks_after_a_frozen_stem():
    model = make_narrow(with_cp=True, frozen_stages=0, drop_path_rate=0.0)
    model.train()
    calls = []
    model.stages[0].blocks[0].register_forward_pre_hook(lambda *args: calls.append(1))
    sum(o.pow(2).mean() for o in model(torch.randn(2, 3, 32, 32))).backward()
    assert model.stages[0].blocks[0].attn.qk.weight.grad is not None
    assert len(calls) == 2


def test_drop_path_schedule_and_train_eval_behaviour():
    tiny = make(drop_path_rate=0.3)
    blocks = [block for stage in tiny.stages for block in stage.blocks]
    rates = [getattr(block.drop_path, 'drop_prob', 0.0) for block in blocks]
    assert len(blocks) == 8 and rates == pytest.approx(torch.linspace(0, 0.3, 8).tolist(), abs=1e-7)
    assert isinstance(blocks[0].drop_path, nn.Identity) and rates[-1] == pytest.approx(0.3)
    assert all(type(b.drop_path).__name__ == 'DropPath' for b in blocks[1:])  # stochastic depth, not dropout

    model = make_narrow(drop_path_rate=0.3)
    no_drop = make_narrow(drop_path_rate=0.0)
    no_drop.load_state_dict(model.state_dict())
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        model.eval()
        no_drop.eval()
        torch.testing.assert_close(model(x)[-1], model(x)[-1], rtol=0, atol=0)
        torch.testing.assert_close(model(x)[-1], no_drop(x)[-1], rtol=0, atol=0)  # identity at eval
        model.train()
        no_drop.train()
        first, second = model(x)[-1], model(x)[-1]
        assert (first - second).abs().max() > 1e-3  # stochastic in training
        torch.testing.assert_close(no_drop(x)[-1], no_drop(x)[-1], rtol=0, atol=0)


@pytest.mark.parametrize('kwargs', [{'soft_norm': True}, {'landmark_mode': 'avg'}, {'landmark_grid': 3},
                                    {'newton_iters': 2}, {'newton_ridge': 0.05}])
def test_attention_settings_change_the_output(kwargs):
    # 128x128 input: stage maps 32/16/8 and strides 8/4/2 give 4x4 conv landmarks, so a grid of 3 binds too.
    x = torch.randn(1, 3, 128, 128)
    base = make_narrow().eval()
    variant = make_narrow(**kwargs).eval()
    missing, unexpected = variant.load_state_dict(base.state_dict(), strict=False)
    assert not missing
    assert all('landmark_' in k for k in unexpected) and bool(unexpected) == ('landmark_mode' in kwargs)
    for attn in (m for m in variant.modules() if isinstance(m, SoftAttention)):
        for key, value in kwargs.items():
            assert getattr(attn, key) == value
    with torch.no_grad():
        out_base, out_same, out_variant = base(x), make_narrow().eval()(x), variant(x)
    for a, same, b in zip(out_base, out_same, out_variant):
        torch.testing.assert_close(same, a, rtol=0, atol=0)  # so any difference is the setting's
        assert (a - b).abs().max() > 1e-2  # observed 2.8e-2 (ridge) to 6 (avg landmarks)


def test_newton_backward_changes_gradients_not_outputs():
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)
    results = []
    for newton_backward in ('implicit', 'unrolled'):
        model = make_narrow(newton_backward=newton_backward, newton_iters=3, drop_path_rate=0.0).double().eval()
        out = model(x)[0]
        out.pow(2).sum().backward()
        results.append((out.detach(), model.stages[0].blocks[0].attn.qk.weight.grad))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)
    assert (results[0][1] - results[1][1]).abs().max() > 1e-3 * results[1][1].abs().max()


def test_in_channels():
    model = make(in_channels=1).eval()
    assert model.stages[0].downsample[0].conv.weight.shape == (32, 1, 3, 3)
    with torch.no_grad():
        assert model(torch.randn(1, 1, 32, 32))[0].shape == (1, 64, 8, 8)


def test_pretrained_init_cfg_loads_a_classifier_checkpoint(tmp_path):
    torch.manual_seed(1)
    classifier = SoftVisionTransformer('tiny', num_classes=10)
    state_dict = classifier.state_dict()
    path = tmp_path / 'soft_tiny_in1k.pth'
    torch.save({'state_dict': state_dict}, path)  # timm-style dict

    model = make(init_cfg={'type': 'Pretrained', 'checkpoint': str(path)})
    assert not torch.equal(model.stages[0].pos_embed, state_dict['stages.0.pos_embed'])  # not loaded yet
    model.init_weights()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, state_dict[key], rtol=0, atol=0, msg=key)


def test_pretrained_init_cfg_with_prefix_loads_a_detector_checkpoint(tmp_path):
    torch.manual_seed(1)
    source = SOFT('tiny')
    detector = {f'backbone.{k}': v for k, v in source.state_dict().items()}
    detector['neck.lateral_convs.0.conv.weight'] = torch.randn(256, 64, 1, 1)
    detector['bbox_head.retina_cls.weight'] = torch.randn(9, 256, 3, 3)
    path = tmp_path / 'retinanet_soft_tiny.pth'
    torch.save({'meta': {}, 'state_dict': detector}, path)

    model = make(init_cfg={'type': 'Pretrained', 'checkpoint': str(path), 'prefix': 'backbone.'})
    assert not torch.equal(model.stages[1].downsample.conv.weight, source.stages[1].downsample.conv.weight)
    model.init_weights()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, source.state_dict()[key], rtol=0, atol=0, msg=key)


def test_position_embedding_at_224_is_the_stored_one(monkeypatch):
    model = make_narrow().eval()
    for stage, side in zip(model.stages, (56, 28, 14, 7)):
        assert stage.resized_pos_embed((side, side)) is stage.pos_embed

    def no_interpolation(*args, **kwargs):
        raise AssertionError('position embeddings must not be resized at 224x224 input')

    monkeypatch.setattr(pyramid_module.F, 'interpolate', no_interpolation)
    with torch.no_grad():
        model(torch.randn(1, 3, 224, 224))


def test_position_embedding_resizes_to_any_size():
    model = make_narrow().eval()
    stage = model.stages[0]
    grid = stage.pos_embed.detach().reshape(1, 56, 56, 16).permute(0, 3, 1, 2)
    # exact factor 2: bilinear (align_corners=False) is a 2x2 mean; fails if rows and columns are mixed up
    halved = torch.nn.functional.avg_pool2d(grid, 2).flatten(2).transpose(1, 2)
    torch.testing.assert_close(stage.resized_pos_embed((28, 28)), halved, rtol=0, atol=1e-6)
    torch.testing.assert_close(stage.resized_pos_embed((56, 28)).reshape(1, 56, 28, 16).permute(0, 3, 1, 2),
                               torch.nn.functional.avg_pool2d(grid, (1, 2)), rtol=0, atol=1e-6)
    with torch.no_grad():
        stage.pos_embed.fill_(0.25)
        for hw in ((1, 1), (9, 12), (200, 334), (13, 97)):
            resized = stage.resized_pos_embed(hw)
            assert resized.shape == (1, hw[0] * hw[1], 16)
            torch.testing.assert_close(resized, torch.full_like(resized, 0.25))


def test_position_embedding_is_used_at_odd_sizes():
    model = make_narrow().eval()
    x = torch.randn(1, 3, 33, 47)
    with torch.no_grad():
        before = model(x)
        for stage in model.stages:
            stage.pos_embed.add_(0.5)
        after = model(x)
    assert all((a - b).abs().max() > 1e-3 for a, b in zip(before, after))


@pytest.mark.filterwarnings('ignore:Initializing zero-element tensors')
def test_bad_in_channels():
    with pytest.raises(ValueError, match='in_channels'):
        SOFT(arch=NARROW_ARCH, in_channels=0)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match='drop_path_rate'):
        SOFT(drop_path_rate=1.0)
    with pytest.raises(ValueError, match='landmark_mode'):
        SOFT(landmark_mode='max')
    with pytest.raises(ValueError, match='arch'):
        SOFT(arch='tiny-ish')
    with pytest.raises(ValueError, match='input'):
        make_narrow()(torch.randn(3, 32, 32))


def test_soft_block_norm_and_qk_init_std_options():
    """The two from-scratch options (docs/advanced/attention_health.md): pre-norm SOFT blocks and the q/k
    projections' initial std; the same parameters and keys as the authors' layout, and the defaults are the authors'."""
    default = make(soft_norm=True, drop_path_rate=0.0)
    changed = make(soft_norm=True, drop_path_rate=0.0, soft_block_norm='pre', qk_init_std=0.125)
    assert default.state_dict().keys() == changed.state_dict().keys()
    assert all(a.shape == b.shape for a, b in zip(default.state_dict().values(), changed.state_dict().values()))
    soft_blocks = [block for stage in changed.stages[:3] for block in stage.blocks]
    assert all(block.post_norm for stage in default.stages[:3] for block in stage.blocks)
    assert not any(block.post_norm for block in soft_blocks)
    assert not changed.stages[3].blocks[0].post_norm  # the softmax stage is pre-norm either way
    qk = torch.cat([block.attn.qk.weight.flatten() for block in soft_blocks])
    v = torch.cat([block.attn.v.weight.flatten() for block in soft_blocks])
    assert abs(qk.std().item() - 0.125) < 0.005 and abs(v.std().item() - 0.02) < 0.001
    default_qk = torch.cat([b.attn.qk.weight.flatten() for stage in default.stages[:3] for b in stage.blocks])
    assert abs(default_qk.std().item() - 0.02) < 0.001
    x = torch.randn(1, 3, 64, 96)
    assert [m.shape for m in default(x)] == [m.shape for m in changed(x)]
    with pytest.raises(ValueError, match=r"soft_block_norm='sandwich' is not one of \('post', 'pre'\)"):
        SOFT(soft_block_norm='sandwich')
    with pytest.raises(ValueError, match='qk_init_std must be a number in'):
        SOFT(qk_init_std=0.0)


# ---------------------------------------------------------------------------------------------------------------------
# init_weights and the convs' norm_cfg


def conv_norms(model: nn.Module) -> dict[str, nn.Module]:
    """The norm of every conv + norm + ReLU module (the stem's three, the three downsamplings), by its state-dict
    prefix."""
    return {f'{name}.bn': module.bn for name, module in model.named_modules()
            if isinstance(module, pyramid_module.ConvBNAct)}


def test_built_with_the_default_initialisation_and_init_weights_without_init_cfg_keeps_it():
    torch.manual_seed(0)
    model = SOFT('tiny', soft_norm=True)

    def linear_std() -> float:
        return torch.cat([m.weight.flatten() for m in model.modules() if isinstance(m, nn.Linear)]).std().item()

    # built initialised, as the timm classifier: timm's truncated normal for the linears and position embeddings
    for stage in model.stages:
        assert abs(stage.pos_embed.std().item() - 0.02) < 0.002
    assert abs(linear_std() - 0.02) < 0.001
    # exactly the pyramid's default initialisation drawn right after the modules are created (the draws of every
    # earlier release for a seed), the one the timm classifier and the benchmarks run
    torch.manual_seed(0)
    reference = pyramid_module.SoftPyramid('tiny', soft_norm=True)
    reference.init_pyramid_weights()
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value, rtol=0, atol=0, msg=key)
    # init_weights without init_cfg (what mmengine's runner calls before training) leaves them, a second call too
    before = snapshot(model)
    model.init_weights()
    model.init_weights()
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())


def test_init_weights_loads_a_pretrained_checkpoint_over_the_default_initialisation(tmp_path):
    torch.manual_seed(1)
    source = SOFT('tiny')
    # a checkpoint without stage 4 and the final norm (e.g. a pruned classifier's): those keep the default init
    kept = {key: value for key, value in source.state_dict().items()
            if not key.startswith(('stages.3.', 'norm.'))}
    path = tmp_path / 'partial.pth'
    torch.save({'state_dict': kept}, path)
    with pytest.raises(ValueError, match=r'partial.pth holds the backbone of a custom SOFT arch .* 37 missing from '):
        SOFT('tiny', init_cfg=dict(type='Pretrained', checkpoint=str(path))).init_weights()
    torch.manual_seed(0)  # a partial load on purpose (soft_mm/models/checkpoint_fit.py)
    model = SOFT('tiny', init_cfg=dict(type='Pretrained', checkpoint=str(path)), partial_pretrained=True)
    with pytest.warns(UserWarning, match="partial_pretrained=True loaded 141 of the backbone's 178 tensors"):
        model.init_weights()
    torch.manual_seed(0)
    default = SOFT('tiny')  # built with the default initialisation, from the same seed
    for key, value in model.state_dict().items():
        expected = kept.get(key, default.state_dict()[key])
        torch.testing.assert_close(value, expected, rtol=0, atol=0, msg=key)
    assert model.stages[3].pos_embed.any() and not torch.equal(model.stages[3].pos_embed, source.stages[3].pos_embed)


def test_init_weights_keeps_frozen_stages_frozen():
    model = make(frozen_stages=1)
    assert not any(p.requires_grad for p in model.stages[0].parameters())
    assert all(p.requires_grad for p in model.stages[1].parameters())


def test_norm_cfg_bn_is_the_default_batchnorm():
    default, given = make(), make(norm_cfg=dict(type='BN', requires_grad=True))
    assert {type(bn) for bn in conv_norms(default).values()} == {nn.BatchNorm2d}
    assert default.norm_cfg == given.norm_cfg == {'type': 'BN', 'requires_grad': True}
    for key, value in default.state_dict().items():
        torch.testing.assert_close(given.state_dict()[key], value, rtol=0, atol=0, msg=key)


def test_norm_cfg_syncbn_keeps_the_keys_and_trains_a_step_on_cpu_after_mmengine_reverts_it():
    from mmengine.model import revert_sync_batchnorm

    model = make(norm_cfg=dict(type='SyncBN', requires_grad=True), drop_path_rate=0.0)
    norms = conv_norms(model)
    assert len(norms) == 6 and all(isinstance(bn, nn.SyncBatchNorm) for bn in norms.values())
    default = make(drop_path_rate=0.0)
    assert list(model.state_dict()) == list(default.state_dict())  # ...downsample(.k).bn.* as with BatchNorm
    # what mmengine's runner does when not distributed (a CPU run): SyncBN back to BatchNorm, the state kept
    model = revert_sync_batchnorm(model)
    norms = conv_norms(model)
    assert not any(isinstance(bn, nn.SyncBatchNorm) for bn in norms.values())
    assert all(isinstance(bn, nn.modules.batchnorm._BatchNorm) for bn in norms.values())
    assert list(model.state_dict()) == list(default.state_dict())
    # a training step: gradients reach the norms' affine parameters, the running statistics move, the step applies
    before = snapshot(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(0)
    maps = model.train()(torch.randn(2, 3, 64, 96, generator=gen))
    sum((m * torch.randn(m.shape, generator=gen)).sum() for m in maps).backward()
    assert all(bn.weight.grad is not None and bn.weight.grad.abs().sum() > 0 for bn in norms.values())
    optimizer.step()
    after = model.state_dict()
    for key in ('stages.0.downsample.0.bn.running_mean', 'stages.2.downsample.bn.running_var',
                'stages.1.downsample.bn.weight', 'stages.3.downsample.conv.weight'):
        assert not torch.equal(after[key], before[key]), key
    # in eval mode the reverted BatchNorm folds into its conv as BatchNorm2d does: the same maps, exactly
    default.load_state_dict(model.state_dict())
    x = torch.randn(1, 3, 64, 96, generator=gen)
    calls = []
    for bn in norms.values():
        bn.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        for a, b in zip(model.eval()(x), default.eval()(x)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert calls == []  # folded: the norms themselves never ran


def test_syncbn_folds_into_its_conv_in_eval_mode():
    torch.manual_seed(0)
    block = pyramid_module.ConvBNAct(5, 7, stride=2, norm_layer=nn.SyncBatchNorm).double().eval()
    with torch.no_grad():
        block.bn.running_mean.normal_()
        block.bn.running_var.uniform_(0.2, 3.0)
        block.bn.weight.normal_()
    calls = []
    block.bn.register_forward_hook(lambda *_: calls.append(1))
    x = torch.randn(2, 5, 9, 11, dtype=torch.float64)
    with torch.no_grad():
        out = block(x)
        reference = torch.relu(nn.functional.batch_norm(block.conv(x), block.bn.running_mean, block.bn.running_var,
                                                        block.bn.weight, block.bn.bias, eps=block.bn.eps))
    assert calls == []
    torch.testing.assert_close(out, reference, rtol=1e-12, atol=1e-12)


def test_norm_cfg_requires_grad_false_freezes_the_conv_norms_only():
    model = make(norm_cfg=dict(type='BN', requires_grad=False))
    frozen = {id(p) for bn in conv_norms(model).values() for p in bn.parameters()}
    assert len(frozen) == 12
    assert all(p.requires_grad == (id(p) not in frozen) for p in model.parameters())


def test_norm_cfg_group_norm_runs_unfolded():
    model = make(norm_cfg=dict(type='GN', num_groups=8), drop_path_rate=0.0).eval()
    norms = conv_norms(model)
    assert all(isinstance(bn, nn.GroupNorm) and bn.num_groups == 8 for bn in norms.values())
    assert not any(key.endswith('running_mean') for key in model.state_dict())  # GroupNorm keeps no statistics
    calls = []
    for bn in norms.values():
        bn.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        maps = model(torch.randn(1, 3, 64, 96))
    assert len(calls) == 6 and [m.shape[1] for m in maps] == list(TINY_DIMS)


@pytest.mark.parametrize('norm_cfg, message', [
    (None, r"norm_cfg must be a dict with a 'type'"),
    (dict(requires_grad=True), r"norm_cfg must be a dict with a 'type'"),
    (dict(type='NoSuchNorm'), r"norm_cfg: type 'NoSuchNorm' is no norm layer mmcv knows"),
    (dict(type='LN'), r"norm_cfg: type 'LN' normalises the last dim, but the convs' maps are \(B, C, H, W\)"),
])
def test_bad_norm_cfg_is_named(norm_cfg, message):
    with pytest.raises(ValueError, match=message):
        SOFT(arch=NARROW_ARCH, norm_cfg=norm_cfg)


def test_without_mmcv_bn_and_syncbn_are_torchs_and_other_types_need_mmcv(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, 'mmcv.cnn', None)  # `from mmcv.cnn import ...` fails as without mmcv
    model = make(norm_cfg=dict(type='SyncBN', requires_grad=False, momentum=0.3))
    norms = conv_norms(model).values()
    assert all(type(bn) is nn.SyncBatchNorm and bn.momentum == 0.3 and not bn.weight.requires_grad for bn in norms)
    assert list(model.state_dict()) == list(make().state_dict())
    with pytest.raises(ImportError, match=r"norm_cfg type 'GN' needs mmcv .* without it 'BN' and 'SyncBN' only"):
        SOFT(arch=NARROW_ARCH, norm_cfg=dict(type='GN', num_groups=4))
