"""The SOFT authors' ImageNet checkpoints' key layout (fudan-zvg/SOFT): the key map, the arch inferred from the
tensors, the migration a model's ``load_state_dict`` and timm's ``pretrained=True`` apply to a file in their layout
(:mod:`.layout`, imported by the models themselves). Converting their files to soft_mm's layout and reading converted
files, which builds the models, is a layer above them: :mod:`soft_mm.models.checkpoint_conversion`
(``tools/model_converters/convert_official_checkpoint.py``).
"""
