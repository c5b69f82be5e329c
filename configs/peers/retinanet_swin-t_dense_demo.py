# mmdet's Swin-T in the dense RetinaNet demo (same neck, head, recipe and data as
# configs/retinanet_soft_tiny_dense_demo.py), trained from scratch: the transformer SOFT is compared with.
#   python tools/train.py configs/peers/retinanet_swin-t_dense_demo.py
_base_ = ['../retinanet_soft_tiny_dense_demo.py']

model = dict(
    backbone=dict(_delete_=True, type='SwinTransformer', embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                  window_size=7, mlp_ratio=4, qkv_bias=True, drop_path_rate=0.0, patch_norm=True,
                  out_indices=(0, 1, 2, 3), convert_weights=False, init_cfg=None),
    neck=dict(in_channels=[96, 192, 384, 768]))
custom_hooks = [dict(type='InvalidLossHook')]
