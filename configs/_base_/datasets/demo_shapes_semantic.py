# The synthetic shapes data (soft_mm/datasets/synthetic_shapes.py) as semantic segmentation: 128x128 images with 1-4
# circles, squares and triangles, 800 train / 100 val images, label maps under data/shapes/semantic rendered from the
# COCO polygons (0 background, 1-3 the shapes). The dataset writes whatever is missing to data_root on first use.
custom_imports = dict(imports=['soft_mm'], allow_failed_imports=False)

dataset_type = 'SyntheticShapesSegDataset'
data_root = 'data/shapes/'
generator = dict(num_train=800, num_val=100, image_size=128, max_objects=4, radius_range=(10.0, 30.0), seed=0)
image_scale = (128, 128)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='Resize', scale=image_scale, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_scale, keep_ratio=True),
    dict(type='LoadAnnotations'),  # after Resize: the metric compares with the label map at its own size
    dict(type='PackSegInputs'),
]
train_dataloader = dict(
    batch_size=4,  # for the same time, more steps on smaller batches train the demo faster
    num_workers=1,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        generator=generator,
        data_prefix=dict(img_path='train/', seg_map_path='semantic/train/'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=8,
    num_workers=1,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        generator=generator,
        data_prefix=dict(img_path='val/', seg_map_path='semantic/val/'),
        test_mode=True,
        pipeline=test_pipeline))
test_dataloader = val_dataloader

val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator
