# RetinaNet + SOFT-Norm-Small, COCO 1x. Published: 42.8 box AP, 34M parameters.
_base_ = './retinanet_soft_tiny_coco.py'

model = dict(backbone=dict(arch='small', init_cfg=dict(checkpoint='checkpoints/soft_norm_small_in1k.pth')))
