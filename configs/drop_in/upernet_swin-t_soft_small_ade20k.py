# Drop-in: an existing mmseg config (here mmseg's own Swin-T UperNet for ADE20K, inherited unchanged) with its backbone
# replaced by SOFT-Norm-Small. The lines below `_base_` are the README's snippet ("Use SOFT in your own mmdet or mmseg
# config") for a segmenter: UperNet's decode head takes all four maps, its auxiliary FCN head the stage-3 map (320
# channels). tests/test_segmentation_drop_in.py trains it on the demo data.
_base_ = 'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py'

custom_imports = dict(imports=['soft_mm'], allow_failed_imports=False)
model = dict(backbone=dict(_delete_=True, type='SOFT', arch='small', soft_norm=True,
                           init_cfg=dict(type='Pretrained', checkpoint='checkpoints/soft_norm_small_in1k.pth')),
             decode_head=dict(in_channels=[64, 128, 320, 512]), auxiliary_head=dict(in_channels=320))
