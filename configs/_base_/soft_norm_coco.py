# The SOFT-Norm backbone and optimizer of the COCO detectors (RetinaNet, Mask R-CNN), kept as variables that the
# configs insert with {{_base_.soft_backbone}} / {{_base_.soft_optimizer}}: a base that defined `model` or
# `optim_wrapper` itself could not be combined with mmdet's model and schedule bases (mmengine refuses duplicate keys).
custom_imports = dict(imports=['soft_mm'], allow_failed_imports=False)

# SOFT-Norm-Tiny from the converted ImageNet checkpoint (tools/model_converters/convert_official_checkpoint.py, see
# the README); the bigger variants override `arch` and the checkpoint. FPN in_channels: SOFT(...).out_channels.
soft_backbone = dict(
    _delete_=True,
    type='SOFT',
    arch='tiny',
    soft_norm=True,
    init_cfg=dict(type='Pretrained', checkpoint='checkpoints/soft_norm_tiny_in1k.pth'))
soft_out_channels = [64, 128, 320, 512]
soft_optimizer = dict(_delete_=True, type='AdamW', lr=1e-4, weight_decay=1e-4)
