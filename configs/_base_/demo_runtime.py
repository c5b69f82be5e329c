# Schedule and runtime of the demo detectors (synthetic shapes, SOFT-Tiny from scratch, a few minutes on 2 CPU cores).
_base_ = 'mmdet::_base_/default_runtime.py'

max_epochs = 8
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=max_epochs)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=5e-4, weight_decay=0.05),
    clip_grad=dict(max_norm=1.0, norm_type=2))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=100),
    dict(type='CosineAnnealingLR', T_max=max_epochs, eta_min_ratio=0.05, by_epoch=True, begin=0, end=max_epochs,
         convert_to_iter_based=True),
]

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20),
    checkpoint=dict(type='CheckpointHook', interval=max_epochs, max_keep_ckpts=1))
log_processor = dict(window_size=20)
randomness = dict(seed=0)
