"""benchmarks/seg_full_res.py: slide and whole-image inference of a SOFT UperNet, at a reduced size."""
from __future__ import annotations

import pytest
from helpers.repo import ROOT

pytest.importorskip('mmseg')
DEMO = str(ROOT / 'configs/upernet_soft_tiny_demo.py')


def test_ade20k_configs_test_by_sliding_512_windows() -> None:
    from mmengine.config import Config

    for name in ('upernet_soft_small_ade20k.py', 'upernet_soft_medium_ade20k.py'):
        test_cfg = Config.fromfile(str(ROOT / 'configs' / name)).model.test_cfg
        assert test_cfg == {'mode': 'slide', 'crop_size': (512, 512), 'stride': (341, 341)}, name


def test_slide_and_whole_inference_at_a_reduced_size(load_benchmark) -> None:
    tool = load_benchmark('seg_full_res')
    # 3 x 4 windows of 64 px with stride 43 over 150 x 193 (odd sides: the last window is shifted back inside)
    slide = tool.run_one(DEMO, 'slide', (150, 193), crop=64, stride=43)
    whole = tool.run_one(DEMO, 'whole', (150, 193))
    for row in (slide, whole):
        assert row['logits_shape'] == [1, 4, 150, 193] and row['finite']
        assert row['seconds'] > 0 and row['peak_mib'] >= 0
    assert slide['test_cfg'] == {'mode': 'slide', 'crop_size': [64, 64], 'stride': [43, 43]}


def test_one_window_slide_equals_whole(load_benchmark) -> None:
    import torch

    tool = load_benchmark('seg_full_res')
    # a window as large as the image: slide inference is the whole-image pass (same seed, same random weights)
    slide = tool.run_one(DEMO, 'slide', (96, 128), crop=128, stride=128, return_logits=True)['logits']
    whole = tool.run_one(DEMO, 'whole', (96, 128), return_logits=True)['logits']
    assert slide.shape == (1, 4, 96, 128)
    torch.testing.assert_close(slide, whole, rtol=0, atol=1e-5)
    # and a 64 px window over the same image is not the whole-image pass
    tiled = tool.run_one(DEMO, 'slide', (96, 128), crop=64, stride=43, return_logits=True)['logits']
    assert (tiled - whole).abs().max() > 1e-3


def test_bad_mode_is_named(load_benchmark) -> None:
    tool = load_benchmark('seg_full_res')
    with pytest.raises(ValueError, match="mode must be one of \\('slide', 'whole'\\)"):
        tool.run_one(DEMO, 'tiles', (64, 64))
