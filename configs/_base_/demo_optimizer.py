# Optimizer and evaluation loops shared by the demos (detection and segmentation; SOFT-Tiny from scratch on the
# synthetic shapes). Nothing scope-specific, so mmdet and mmseg demo configs can both inherit it.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05),
    clip_grad=dict(max_norm=1.0, norm_type=2))
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
