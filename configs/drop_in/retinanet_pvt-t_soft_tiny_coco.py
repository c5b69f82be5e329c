# Drop-in: an existing mmdet config (here mmdet's own PVT-Tiny RetinaNet, inherited unchanged) with its backbone
# replaced by SOFT-Norm-Tiny. The lines below `_base_` are the README's snippet; paste them into any mmdet config
# whose neck takes the four stride-4/8/16/32 maps (SOFT-Medium: in_channels=[64, 128, 288, 512]).
_base_ = 'mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py'

custom_imports = dict(imports=['soft_mm', 'soft_mm.utils'], allow_failed_imports=False)
model = dict(
    backbone=dict(
        _delete_=True,
        type='SOFT',
        arch='tiny',
        soft_norm=True,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/soft_norm_tiny_in1k.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
