# Mask R-CNN + SOFT-Norm-Tiny trained from scratch on the synthetic shapes data (written to data/shapes on first use)
# in a few minutes on 2 CPU cores; evaluated with CocoMetric (bbox and segm).
#   python tools/train.py configs/mask_rcnn_soft_tiny_demo.py
# Demo-sized model: average-pooled landmarks, no stochastic depth, a 64-wide FPN and RoI heads (RoIAlign's CPU
# backward dominates the step time otherwise), 64 sampled RoIs per image, fewer proposals, anchors from 16 px for
# the 17-60 px shapes. The average-pooled landmarks collapse (docs/advanced/attention_health.md), but measured here
# they still did better: the first 2 epochs gave bbox / segm mAP 0.395 / 0.430 with the authors' conv landmarks
# against 0.421-0.429 / 0.458-0.465 with 'avg'.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    './_base_/datasets/demo_shapes_instance.py',
    './_base_/demo_runtime.py',
]

model = dict(
    backbone=dict(_delete_=True, type='SOFT', arch='tiny', soft_norm=True, landmark_mode='avg', drop_path_rate=0.0),
    neck=dict(in_channels=[64, 128, 320, 512], out_channels=64),
    rpn_head=dict(in_channels=64, feat_channels=64, anchor_generator=dict(scales=[4])),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=64),
        bbox_head=dict(in_channels=64, fc_out_channels=256, num_classes=3),
        mask_roi_extractor=dict(out_channels=64),
        mask_head=dict(in_channels=64, conv_out_channels=64, num_convs=2, num_classes=3)),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=500, max_per_img=200),
        rcnn=dict(sampler=dict(num=64))),
    test_cfg=dict(
        rpn=dict(nms_pre=500, max_per_img=200)))
