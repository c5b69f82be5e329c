# mmdet's ResNet-18 in the dense RetinaNet demo (same neck, head, recipe and data as
# configs/retinanet_soft_tiny_dense_demo.py), trained from scratch: the convolutional baseline.
#   python tools/train.py configs/peers/retinanet_r18_dense_demo.py
_base_ = ['../retinanet_soft_tiny_dense_demo.py']

model = dict(
    backbone=dict(_delete_=True, type='ResNet', depth=18, num_stages=4, out_indices=(0, 1, 2, 3), frozen_stages=-1,
                  norm_cfg=dict(type='BN', requires_grad=True), norm_eval=False, style='pytorch', init_cfg=None),
    neck=dict(in_channels=[64, 128, 256, 512]))
custom_hooks = [dict(type='InvalidLossHook')]
