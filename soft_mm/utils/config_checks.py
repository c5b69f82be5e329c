"""Stop before building a Runner when a config points at a dataset or checkpoint that is not there.

Without this check a missing COCO folder or ImageNet checkpoint surfaces as a long traceback from deep inside
mmengine after minutes of setup; here it is one sentence that names the path and what to do.
"""
from __future__ import annotations

import os.path as osp
from collections.abc import Iterator

from mmengine.config import Config

DATASET_HINT = ('put the dataset there in the layout the README describes, point the config at it with --cfg-options, '
                'or train a demo config (configs/*_demo.py), which generates its own data')
PRETRAINED_HINT = ('create it with tools/convert_official_checkpoint.py from the authors\' ImageNet weights (see the '
                   'README), or train from scratch with --cfg-options model.backbone.init_cfg=None')
LOAD_FROM_HINT = 'pass the path of an existing checkpoint (or remove load_from)'


class MissingPathError(SystemExit):
    """A ``SystemExit`` whose message is the one sentence printed to the user (exit status 1)."""

    def __init__(self, path: str, hint: str) -> None:
        super().__init__(f'{path} not found: {hint}.')
        self.path = path


def _is_remote(path: str) -> bool:
    return '://' in path  # http(s)://, s3://, torchvision://, open-mmlab://, ...


def _leaf_datasets(dataset_cfg) -> Iterator[dict]:
    """The dataset configs inside wrappers such as ConcatDataset / RepeatDataset / ClassBalancedDataset."""
    if not isinstance(dataset_cfg, dict):
        return
    inner = dataset_cfg.get('datasets', dataset_cfg.get('dataset'))
    if inner is None:
        yield dataset_cfg
    else:
        for child in inner if isinstance(inner, (list, tuple)) else [inner]:
            yield from _leaf_datasets(child)


def _generates_missing_data(dataset_cfg: dict, scope: str | None) -> bool:
    from mmengine.registry import DATASETS

    dataset_type = dataset_cfg.get('type')
    if not isinstance(dataset_type, str):
        return bool(getattr(dataset_type, 'generates_missing_data', False))
    with DATASETS.switch_scope_and_registry(scope) as registry:
        dataset_cls = registry.get(dataset_type)
    return bool(getattr(dataset_cls, 'generates_missing_data', False))


def _pretrained_checkpoints(node) -> Iterator[str]:
    """Every ``init_cfg=dict(type='Pretrained', checkpoint=...)`` path in a model config."""
    if isinstance(node, dict):
        if node.get('type') == 'Pretrained' and isinstance(node.get('checkpoint'), str):
            yield node['checkpoint']
        for value in node.values():
            yield from _pretrained_checkpoints(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            yield from _pretrained_checkpoints(value)


def check_data_paths(cfg: Config, phases: tuple[str, ...]) -> None:
    """Raise :class:`MissingPathError` for the first missing ``data_root`` / ``ann_file`` / evaluator ``ann_file``.

    ``phases`` are loop names ('train', 'val', 'test'); datasets whose class sets ``generates_missing_data`` (the
    synthetic demo data) are skipped together with their phase's evaluator.
    """
    scope = cfg.get('default_scope')
    for phase in phases:
        loader = cfg.get(f'{phase}_dataloader')
        if not loader:
            continue
        datasets = list(_leaf_datasets(loader.get('dataset')))
        if any(_generates_missing_data(d, scope) for d in datasets):
            continue
        for dataset in datasets:
            data_root = dataset.get('data_root') or ''
            if data_root and not _is_remote(data_root) and not osp.isdir(data_root):
                raise MissingPathError(data_root, DATASET_HINT)
            ann_file = dataset.get('ann_file') or ''
            if ann_file and not _is_remote(ann_file):
                ann_path = ann_file if osp.isabs(ann_file) else osp.join(data_root, ann_file)
                if not osp.isfile(ann_path):
                    raise MissingPathError(ann_path, DATASET_HINT)
        evaluators = cfg.get(f'{phase}_evaluator') or []
        for evaluator in evaluators if isinstance(evaluators, (list, tuple)) else [evaluators]:
            ann_file = evaluator.get('ann_file') if isinstance(evaluator, dict) else None
            if ann_file and not _is_remote(ann_file) and not osp.isfile(ann_file):
                raise MissingPathError(ann_file, DATASET_HINT)


def check_checkpoint_paths(cfg: Config, pretrained: bool = True) -> None:
    """Raise :class:`MissingPathError` for a missing local ``load_from`` or ``Pretrained`` checkpoint of the model.

    ``pretrained=False`` skips the model's ``init_cfg`` checkpoints (testing loads trained weights and does not
    initialise the model).
    """
    for checkpoint in _pretrained_checkpoints(cfg.get('model')) if pretrained else ():
        if not _is_remote(checkpoint) and not osp.isfile(checkpoint):
            raise MissingPathError(checkpoint, PRETRAINED_HINT)
    load_from = cfg.get('load_from')
    if load_from and not _is_remote(load_from) and not osp.isfile(load_from):
        raise MissingPathError(load_from, LOAD_FROM_HINT)
