"""The one walker of a config tree (nested dicts, lists and tuples, as ``Config.to_dict()`` or a ``ConfigDict`` holds
them), for the tools' checks and adjustments."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ['config_dicts', 'is_remote', 'pipeline_steps', 'pretrained_inits']

ConfigKeys = tuple[Any, ...]  # dict keys (str) and list positions (int) from the root


def config_dicts(node: Any, keys: ConfigKeys = ()) -> Iterator[tuple[ConfigKeys, dict]]:
    """Every dict of the tree under ``node``, with the keys that lead to it, each parent before its children. A
    caller may change a dict's values as it gets it (the walk then descends into the new ones)."""
    if isinstance(node, dict):
        yield keys, node
        for key, value in node.items():
            yield from config_dicts(value, (*keys, key))
    elif isinstance(node, (list, tuple)):
        for position, value in enumerate(node):
            yield from config_dicts(value, (*keys, position))


def pipeline_steps(node: Any, types: tuple[str, ...]) -> Iterator[dict]:
    """Every step of the ``pipeline`` lists under ``node`` (a data loader, a dataset, a config) whose ``type`` is one
    of ``types``, in the order of the walk: the step dicts themselves, for a caller to read or change."""
    for _, owner in config_dicts(node):
        pipeline = owner.get('pipeline')
        if isinstance(pipeline, (list, tuple)):
            yield from (step for step in pipeline if isinstance(step, dict) and step.get('type') in types)


def pretrained_inits(model_cfg: Any) -> Iterator[tuple[ConfigKeys, dict]]:
    """``(keys of the module it initialises, init_cfg)`` for every ``dict(type='Pretrained', checkpoint=...)`` with a
    checkpoint in a model config: the keys up to the ``init_cfg`` that holds it (``('backbone',)`` for
    ``model.backbone.init_cfg``; ``()`` for the model's own)."""
    for keys, node in config_dicts(model_cfg):
        if node.get('type') == 'Pretrained' and node.get('checkpoint'):
            yield (keys[:keys.index('init_cfg')] if 'init_cfg' in keys else keys), node


def is_remote(path: str) -> bool:
    """Whether a checkpoint or data path is a URL (http(s)://, s3://, torchvision://, open-mmlab://, ...)."""
    return '://' in path
