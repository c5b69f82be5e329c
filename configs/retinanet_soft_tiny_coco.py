# RetinaNet + FPN with a SOFT-Norm-Tiny backbone on COCO, 1x schedule (12 epochs), 1333x800, batch 2 x 8 GPUs.
# Published: 40.0 box AP, 23M parameters. Data in data/coco (annotations/instances_{train,val}2017.json,
# train2017/, val2017/). The ImageNet weights come from tools/model_converters/convert_official_checkpoint.py (see
# the README).
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    'mmdet::_base_/datasets/coco_detection.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
    './_base_/soft_norm_coco.py',
]

model = dict(backbone={{_base_.soft_backbone}}, neck=dict(in_channels={{_base_.soft_out_channels}}))
optim_wrapper = dict(optimizer={{_base_.soft_optimizer}})
# crash-safe checkpoints and a stop at the first NaN/Inf loss (soft_mm/engine/hooks.py; keep the schedule's interval)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))
custom_hooks = [dict(type='InvalidLossHook')]
