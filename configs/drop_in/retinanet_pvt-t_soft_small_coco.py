# Drop-in: an existing mmdet config (here mmdet's own PVT-Tiny RetinaNet, inherited unchanged) with its backbone
# replaced by SOFT-Norm-Small. The lines below `_base_` are the README's snippet ("Use SOFT in your own mmdet or mmseg
# config"); tests/test_detection_drop_in.py trains it on the demo data.
_base_ = 'mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py'

custom_imports = dict(imports=['soft_mm'], allow_failed_imports=False)
model = dict(backbone=dict(_delete_=True, type='SOFT', arch='small', soft_norm=True,
                           init_cfg=dict(type='Pretrained', checkpoint='checkpoints/soft_norm_small_in1k.pth')),
             neck=dict(in_channels=[64, 128, 320, 512]))
