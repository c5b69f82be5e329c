# UperNet + SOFT-Norm-Small on ADE20K, 512x512 crops, 160k iterations, batch 16 (8 GPUs x 2): the published setup
# (46.2 mIoU, 54M parameters). Data: data/ade/ADEChallengeData2016 (mmseg's standard layout).
_base_ = [
    'mmseg::_base_/models/upernet_swin.py', 'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py', 'mmseg::_base_/schedules/schedule_160k.py'
]
custom_imports = dict(imports=['soft_mm'], allow_failed_imports=False)

crop_size = (512, 512)
# ImageNet weights converted by tools/model_converters/convert_official_checkpoint.py (see README).
pretrained = 'checkpoints/soft_norm_small_in1k.pth'
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(_delete_=True, type='SOFT', arch='small', soft_norm=True,
                  init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[64, 128, 320, 512], num_classes=150),
    auxiliary_head=dict(in_channels=320, num_classes=150),
    # sliding 512x512 windows with stride 341 over the 2048x512 test images, as mmseg's own ADE20K configs do
    test_cfg=dict(mode='slide', crop_size=crop_size, stride=(341, 341)))

optim_wrapper = dict(
    _delete_=True, type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(custom_keys={'pos_embed': dict(decay_mult=0.), 'norm': dict(decay_mult=0.)}))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=160000, by_epoch=False),
]
train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
# crash-safe checkpoints and a stop at the first NaN/Inf loss (soft_mm/engine/hooks.py; keep the schedule's interval)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))
custom_hooks = [dict(type='InvalidLossHook')]
