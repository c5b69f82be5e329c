# UperNet + SOFT-Norm-Medium on ADE20K (published: 48.0 mIoU, 76M parameters).
_base_ = './upernet_soft_small_ade20k.py'
pretrained = 'checkpoints/soft_norm_medium_in1k.pth'
model = dict(
    backbone=dict(arch='medium', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[64, 128, 288, 512]),
    auxiliary_head=dict(in_channels=288))
