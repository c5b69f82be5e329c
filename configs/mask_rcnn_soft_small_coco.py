# Mask R-CNN + SOFT-Norm-Small, COCO 1x. Published: 43.8 box AP / 40.1 mask AP, 44M parameters.
_base_ = './mask_rcnn_soft_tiny_coco.py'

model = dict(backbone=dict(arch='small', init_cfg=dict(checkpoint='checkpoints/soft_norm_small_in1k.pth')))
