"""``SoftTimmClassifier``: mmpretrain's ``TimmClassifier`` whose checkpoints keep the timm model's keys in any wrapper.

``TimmClassifier`` (which builds ``timm.create_model(model_name, ...)``, here soft_mm's SOFT classifiers) strips its
``model.`` attribute prefix from state-dict keys with a hook that *returns* a new dict. PyTorch uses a returned dict
only for the module whose ``state_dict()`` was called, so as soon as the classifier is a submodule — mmengine's
``EMAHook`` keeps it inside an averaged-model wrapper — its keys keep the prefix, the EMA weights no longer match the
model's keys and saving a checkpoint fails with ``KeyError: 'model.cls_token'``. This subclass renames the keys in
place, which works at any depth; everything else (timm arguments, loss, Mixup/CutMix through ``train_cfg``, the
prefix-adding load hook) is ``TimmClassifier``'s.

Registered in mmpretrain's ``MODELS``; configs import it with
``custom_imports=dict(imports=['soft_mm', 'soft_mm.models.mmpretrain_classifier'])``.
"""
from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from mmpretrain.models import TimmClassifier
from mmpretrain.registry import MODELS

TIMM_MODEL_ATTRIBUTE = 'model'  # where TimmClassifier keeps the timm model


@MODELS.register_module()
class SoftTimmClassifier(TimmClassifier):
    """``TimmClassifier`` (same arguments) with a state-dict hook that renames ``<prefix>model.<key>`` to
    ``<prefix><key>`` in place, so nested copies (EMA) save the timm model's keys too."""

    @staticmethod
    def _remove_state_dict_prefix(module: Any, state_dict: MutableMapping, prefix: str, local_metadata: Any) -> None:
        inner = f'{prefix}{TIMM_MODEL_ATTRIBUTE}.'
        for key in [k for k in state_dict if k.startswith(inner)]:
            state_dict[prefix + key[len(inner):]] = state_dict.pop(key)
