"""The SOFT authors' ImageNet checkpoints (fudan-zvg/SOFT layout).

* :mod:`.layout` — their key layout: the key map, the arch inferred from the tensors, the migration a model's
  ``load_state_dict`` and timm's ``pretrained=True`` apply to a file in their layout;
* :mod:`.convert` — converting their files to soft_mm's layout
(``tools/model_converters/convert_official_checkpoint.py``)
  and reading converted files.

Nothing is imported here: :mod:`.layout` is imported by the models themselves, :mod:`.convert` imports the models.
"""
