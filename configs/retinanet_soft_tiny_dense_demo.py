# The RetinaNet demo (configs/retinanet_soft_tiny_demo.py: same model, recipe and schedule) on the dense shapes data:
# 8-16 small shapes (boxes of about 8-18 px) per 128x128 image on a cluttered texture with unlabelled distractor blobs
# and low contrast, like aerial tiles of tree crowns (data/dense, written on first use). Evaluated every epoch, with
# the SOFT layers' attention health logged every 25 iterations (docs/advanced/attention_health.md, which has the
# runs: 4 epochs gave bbox mAP 0.342 with these conv landmarks at the RetinaNet demo's lr 2e-3; at the earlier lr 1e-3
# 0.267, 0.295 with model.backbone.landmark_mode=avg, 0.199 with ResNet-18 and 0.042 with Swin-T from configs/peers/):
#   python tools/train.py configs/retinanet_soft_tiny_dense_demo.py
_base_ = ['./retinanet_soft_tiny_demo.py']

data_root = 'data/dense/'
generator = dict(num_train=800, num_val=100, image_size=128, min_objects=8, max_objects=16, radius_range=(4.0, 9.0),
                 background='texture', min_contrast=60, seed=0)
train_dataloader = dict(dataset=dict(data_root=data_root, generator=generator))
val_dataloader = dict(dataset=dict(data_root=data_root, generator=generator))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator

train_cfg = dict(val_interval=1)
custom_hooks = [dict(type='InvalidLossHook'), dict(type='AttentionHealthHook', interval=25)]
