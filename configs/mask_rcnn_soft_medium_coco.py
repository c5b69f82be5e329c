# Mask R-CNN + SOFT-Norm-Medium, COCO 1x. Published: 46.6 box AP / 42.0 mask AP, 65M parameters.
# Medium's stage 3 has 288 channels (9 heads of 32), so the FPN takes [64, 128, 288, 512].
_base_ = './mask_rcnn_soft_tiny_coco.py'

model = dict(
    backbone=dict(arch='medium', init_cfg=dict(checkpoint='checkpoints/soft_norm_medium_in1k.pth')),
    neck=dict(in_channels=[64, 128, 288, 512]))
