# Schedule and runtime of the demo detectors (synthetic shapes, SOFT-Tiny from scratch, a few minutes on 2 CPU cores).
_base_ = ['mmdet::_base_/default_runtime.py', './demo_optimizer.py']

# 4 epochs at lr 1e-3 (demo_optimizer.py) after a 50-iteration warm-up: RetinaNet reached bbox mAP 0.512 in 5.6
# minutes on 2 cores (at lr 5e-4 with 100 warm-up iterations the same 4 epochs gave 0.377; 8 epochs gave 0.77 in twice
# the time)
max_epochs = 4
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=max_epochs)

param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', T_max=max_epochs, eta_min_ratio=0.05, by_epoch=True, begin=0, end=max_epochs,
         convert_to_iter_based=True),
]

# crash-safe checkpoints and a stop at the first NaN/Inf loss (soft_mm/engine/hooks.py)
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20),
    checkpoint=dict(type='AtomicCheckpointHook', interval=max_epochs, max_keep_ckpts=1))
custom_hooks = [dict(type='InvalidLossHook')]
log_processor = dict(window_size=20)
randomness = dict(seed=0)
