# SOFT-Norm-Tiny pretrained from scratch on the synthetic classes data (10 classes told apart by texture and shape, not
# colour; 2000 train / 500 val 32x32 images written to data/synthetic_classes on first use) with the ImageNet recipe's
# components scaled to the data: RandAugment (magnitude 6 of 10 for 32 px images), random erasing, Mixup/CutMix (on
# 40% of the batches), label smoothing, AdamW with warm-up and cosine decay, grad clipping and EMA (evaluated and
# saved, as in the ImageNet configs). 16 epochs of 32 steps; top-1 on the val split. The backbone settings are the
# demo detectors' (tiny, SOFT-Norm, conv landmarks: top-1 0.912 against 0.902 with average-pooled ones), so the
# checkpoint initialises configs/retinanet_soft_tiny_demo.py with no missing key (and configs/upernet_soft_tiny_demo.py
# with model.backbone.landmark_mode=conv).
#   python tools/train.py configs/soft_tiny_in1k_demo.py
_base_ = ['./_base_/soft_in1k.py']
custom_imports = dict(imports=['soft_mm'], allow_failed_imports=False)

image_size = 32
num_classes = 10
batch_size = 64
data_root = 'data/synthetic_classes'
generator = dict(num_train_per_class=200, num_val_per_class=50, image_size=image_size, seed=0)

# Mixup/CutMix on 40% of the batches: with the full recipe's every-batch mixing, a few hundred steps are not enough
data_preprocessor = dict(num_classes=num_classes)
model = dict(
    model_name='soft_norm_tiny',
    num_classes=num_classes,
    landmark_mode='conv',
    drop_path_rate=0.0,
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)], probs=[0.2, 0.2]),
)

bgr_mean = [103.53, 116.28, 123.675]  # the ImageNet mean of mmpretrain's data_preprocessor, BGR order
bgr_std = [57.375, 57.12, 58.395]
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=image_size, crop_ratio_range=(0.5, 1.0), backend='pillow',
         interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='RandAugment', policies='timm_increasing', num_policies=2, total_level=10, magnitude_level=6,
         magnitude_std=0.5, hparams=dict(pad_val=[round(x) for x in bgr_mean], interpolation='bicubic')),
    dict(type='RandomErasing', erase_prob=0.25, mode='rand', min_area_ratio=0.02, max_area_ratio=1 / 3,
         fill_color=bgr_mean, fill_std=bgr_std),
    dict(type='PackInputs'),
]
test_pipeline = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]  # the images are already image_size

dataset = dict(type='SyntheticClassesDataset', data_root=data_root, generator=generator)
train_dataloader = dict(batch_size=batch_size, num_workers=1, persistent_workers=True,
                        dataset=dict(dataset, split='train', pipeline=train_pipeline))
val_dataloader = dict(batch_size=100, num_workers=1, persistent_workers=True,
                      dataset=dict(dataset, split='val', pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='Accuracy', topk=(1, 5))
test_evaluator = val_evaluator

max_epochs = 16
warmup_epochs = 1
optim_wrapper = dict(optimizer=dict(lr=1e-3))
auto_scale_lr = dict(base_batch_size=batch_size)  # lr 1e-3 per 64 images here
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-2, by_epoch=True, begin=0, end=warmup_epochs, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min_ratio=0.01, by_epoch=True, begin=warmup_epochs, end=max_epochs,
         convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)

# EMA over the last ~33 of the 512 steps (~7%), as 4e-5 is over the last ~25k of the 375k ImageNet steps
custom_hooks = [dict(type='EMAHook', momentum=0.03, priority='ABOVE_NORMAL'), dict(type='InvalidLossHook')]
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=10),
    checkpoint=dict(type='AtomicCheckpointHook', interval=max_epochs, max_keep_ckpts=1))
log_processor = dict(window_size=10)
randomness = dict(seed=0)
