# RetinaNet + FPN with a SOFT-Norm-Tiny backbone on COCO, 1x schedule (12 epochs), 1333x800, batch 2 x 8 GPUs.
# Published: 40.0 box AP, 23M parameters. Data in data/coco (annotations/instances_{train,val}2017.json,
# train2017/, val2017/). The ImageNet weights come from tools/convert_official_checkpoint.py (see the README).
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    'mmdet::_base_/datasets/coco_detection.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
]
custom_imports = dict(imports=['soft_mm', 'soft_mm.utils'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='SOFT',
        arch='tiny',
        soft_norm=True,
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/soft_norm_tiny_in1k.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))

optim_wrapper = dict(optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, weight_decay=1e-4))
# crash-safe checkpoints and a stop at the first NaN/Inf loss (soft_mm/engine/hooks.py; keep the schedule's interval)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))
custom_hooks = [dict(type='InvalidLossHook')]
