# SOFT ImageNet-1k classification with mmpretrain: its ImageNet data (data/imagenet/{train,val}/<class>/*.JPEG; the
# train pipeline is timm's DeiT recipe: RandomResizedCrop 224 bicubic, flip, RandAugment rand-m9-mstd0.5-inc1, random
# erasing 0.25; test: resize 256, center crop 224; top-1/top-5), its AdamW schedule and runtime, and the authors'
# settings on top (the SOFT paper): 300 epochs, lr 1e-3 per 1024 images scaled by the real batch size, no weight decay
# on norms, biases, position embeddings and the cls token, 10 warm-up epochs from 1e-6, then cosine to 5e-5 (at
# batch 1024), grad clip 1.0, Mixup 0.8 / CutMix 1.0, label smoothing 0.1, drop path 0.1, EMA 0.99996.
# The classifier is soft_mm's timm model (timm.create_model(model_name)) inside mmpretrain's TimmClassifier
# (SoftTimmClassifier: the same, with keys that stay unprefixed inside the EMA wrapper too), so a checkpoint's
# state_dict has the keys of soft_mm.SoftVisionTransformer: timm, the converter and the SOFT backbone read it as it is.
# Each configs/soft[_norm]_<size>_in1k.py sets model_name.
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py',
]
custom_imports = dict(imports=['soft_mm'], allow_failed_imports=False)

model = dict(
    type='SoftTimmClassifier',
    model_name='soft_norm_small',
    num_classes=1000,
    drop_path_rate=0.1,
    loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]),
)

# 8 GPUs x 128 = 1024 images per step, the authors' batch; other sizes rescale the lr (auto_scale_lr).
train_dataloader = dict(batch_size=128)

max_epochs = 300
warmup_epochs = 10
optim_wrapper = dict(
    optimizer=dict(lr=1e-3),
    # norm_decay_mult, bias_decay_mult and flat_decay_mult = 0 come from the base; the base's Swin keys are replaced
    paramwise_cfg=dict(custom_keys={
        '_delete_': True,
        '.pos_embed': dict(decay_mult=0.0),
        '.cls_token': dict(decay_mult=0.0),
        '.cls_pos_embed': dict(decay_mult=0.0)}),
    clip_grad=dict(max_norm=1.0),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=warmup_epochs, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min_ratio=0.05, by_epoch=True, begin=warmup_epochs, end=max_epochs,
         convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=1)
auto_scale_lr = dict(base_batch_size=1024, enable=True)

custom_hooks = [dict(type='EMAHook', momentum=4e-5, priority='ABOVE_NORMAL'), dict(type='InvalidLossHook')]
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook', interval=1, max_keep_ckpts=3))
