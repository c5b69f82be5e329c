# RetinaNet + SOFT-Norm-Large, COCO 1x. Published: 45.3 box AP, 74M parameters.
_base_ = './retinanet_soft_tiny_coco.py'

model = dict(backbone=dict(arch='large', init_cfg=dict(checkpoint='checkpoints/soft_norm_large_in1k.pth')))
