# Mask R-CNN + SOFT-Norm-Large, COCO 1x. Published: 47.0 box AP / 42.2 mask AP, 84M parameters.
_base_ = './mask_rcnn_soft_tiny_coco.py'

model = dict(backbone=dict(arch='large', init_cfg=dict(checkpoint='checkpoints/soft_norm_large_in1k.pth')))
