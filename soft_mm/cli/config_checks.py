"""Stop before building a Runner when a config points at a dataset or checkpoint that is not there, or when an input
image cannot be read.

Without this check a missing COCO folder or ImageNet checkpoint surfaces as a long traceback from deep inside
mmengine after minutes of setup; here it is one sentence that names the path and what to do.
"""
from __future__ import annotations

import os.path as osp
from collections.abc import Iterator

from mmengine.config import Config

from ..utils.config_tree import is_remote, pretrained_inits
from .errors import InputFileError

DATASET_HINT = ('put the dataset there in the layout the README describes, point the config at it with --cfg-options, '
                'or train a demo config (configs/*_demo.py), which generates its own data')
DEMO_DATA_HINT = 'tools/misc/make_demo_data.py writes the demo data ahead'
ANNOTATION_HINT = 'download or generate it again (a COCO annotation file is one JSON object)'

PRETRAINED_HINT = ('create it with tools/model_converters/convert_official_checkpoint.py from the authors\' ImageNet '
                   'weights (see the README), or train from scratch with --cfg-options model.backbone.init_cfg=None')
LOAD_FROM_HINT = 'pass the path of an existing checkpoint (or remove load_from)'


class DataFileError(SystemExit):
    """A ``SystemExit`` whose message is the one sentence printed to the user (exit status 1): the path, what is wrong
    with it and what to do."""

    def __init__(self, path: str, problem: str, hint: str) -> None:
        super().__init__(f'{path} {problem}: {hint}.')
        self.path = path


class MissingPathError(DataFileError):
    """A path the config names that is not there."""

    def __init__(self, path: str, hint: str) -> None:
        super().__init__(path, 'not found', hint)


def _dataset_hint(option: str) -> str:
    """:data:`DATASET_HINT` with the ``--cfg-options`` entry that points the config elsewhere."""
    return DATASET_HINT.replace('--cfg-options', f'--cfg-options {option}', 1) + f' ({DEMO_DATA_HINT})'


def _json_problem(path: str) -> str | None:
    """What is wrong with a JSON annotation file that cannot be whole, judged from its two ends (a COCO file of
    hundreds of MB is not parsed twice), or None."""
    size = osp.getsize(path)
    if size == 0:
        return 'is empty'
    with open(path, 'rb') as file:
        head = file.read(64).lstrip()
        file.seek(max(0, size - 64))
        tail = file.read().rstrip()
    if head[:1] not in (b'{', b'[') or tail[-1:] not in (b'}', b']'):
        return 'is not a complete JSON file (truncated, or not JSON)'
    return None


def _leaf_datasets(dataset_cfg, key: str) -> Iterator[tuple[str, dict]]:
    """``(config key, dataset config)`` of the datasets inside wrappers such as ConcatDataset / RepeatDataset /
    ClassBalancedDataset (``key`` is the wrapper's, e.g. ``train_dataloader.dataset``)."""
    if not isinstance(dataset_cfg, dict):
        return
    if 'datasets' in dataset_cfg:
        inner = dataset_cfg['datasets']
        children = [(f'{key}.datasets.{i}', child) for i, child in enumerate(inner)] if isinstance(
            inner, (list, tuple)) else [(f'{key}.datasets', inner)]
    elif 'dataset' in dataset_cfg:
        children = [(f'{key}.dataset', dataset_cfg['dataset'])]
    else:
        yield key, dataset_cfg
        return
    for child_key, child in children:
        yield from _leaf_datasets(child, child_key)


def _prefix_folders(data_prefix) -> Iterator[tuple[str, str]]:
    """``(key under data_prefix, folder)`` of a dataset's ``data_prefix`` (a folder or a dict of folders)."""
    if isinstance(data_prefix, str):
        yield '', data_prefix
    elif isinstance(data_prefix, dict):
        for name, folder in data_prefix.items():
            if isinstance(folder, str):
                yield f'.{name}', folder


def _generates_missing_data(dataset_cfg: dict, scope: str | None) -> bool:
    from mmengine.registry import DATASETS

    dataset_type = dataset_cfg.get('type')
    if not isinstance(dataset_type, str):
        return bool(getattr(dataset_type, 'generates_missing_data', False))
    with DATASETS.switch_scope_and_registry(scope) as registry:
        dataset_cls = registry.get(dataset_type)
    return bool(getattr(dataset_cls, 'generates_missing_data', False))


def _check_annotation_file(path: str, option: str) -> None:
    if not osp.isfile(path):
        raise (DataFileError(path, 'is a folder, not an annotation file', _dataset_hint(option))
               if osp.isdir(path) else MissingPathError(path, _dataset_hint(option)))
    problem = _json_problem(path) if path.endswith('.json') else None
    if problem:
        raise DataFileError(path, problem, ANNOTATION_HINT)


def check_data_paths(cfg: Config, phases: tuple[str, ...]) -> None:
    """Raise :class:`DataFileError` (:class:`MissingPathError` for a missing path) for the first bad ``data_root``,
    ``data_prefix`` folder, ``ann_file`` or evaluator ``ann_file``; the sentence names the path, what is wrong and the
    ``--cfg-options`` entry that points the config elsewhere.

    ``phases`` are loop names ('train', 'val', 'test'); datasets whose class sets ``generates_missing_data`` (the
    synthetic demo data) are skipped together with their phase's evaluator. A JSON annotation file is checked at both
    ends (empty, truncated, not JSON), not parsed.
    """
    scope = cfg.get('default_scope')
    for phase in phases:
        loader = cfg.get(f'{phase}_dataloader')
        if not loader:
            continue
        datasets = list(_leaf_datasets(loader.get('dataset'), f'{phase}_dataloader.dataset'))
        if any(_generates_missing_data(d, scope) for _, d in datasets):
            continue
        for key, dataset in datasets:
            data_root = dataset.get('data_root') or ''
            if data_root and not is_remote(data_root) and not osp.isdir(data_root):
                raise MissingPathError(data_root, _dataset_hint(f'{key}.data_root=DIR'))
            ann_file = dataset.get('ann_file') or ''
            if ann_file and not is_remote(ann_file):
                _check_annotation_file(ann_file if osp.isabs(ann_file) else osp.join(data_root, ann_file),
                                       f'{key}.ann_file=FILE')
            for name, folder in _prefix_folders(dataset.get('data_prefix')):
                path = folder if osp.isabs(folder) else osp.join(data_root, folder)
                if folder and not is_remote(path) and not osp.isdir(path):
                    raise MissingPathError(path, _dataset_hint(f'{key}.data_prefix{name}=DIR'))
        evaluators = cfg.get(f'{phase}_evaluator') or []
        listed = isinstance(evaluators, (list, tuple))
        for i, evaluator in enumerate(evaluators if listed else [evaluators]):
            ann_file = evaluator.get('ann_file') if isinstance(evaluator, dict) else None
            if ann_file and not is_remote(ann_file):
                _check_annotation_file(ann_file, f'{phase}_evaluator{f".{i}" if listed else ""}.ann_file=FILE')


def check_checkpoint_paths(cfg: Config, pretrained: bool = True) -> None:
    """Raise :class:`MissingPathError` for a missing local ``load_from`` or ``Pretrained`` checkpoint of the model
    (:class:`DataFileError` for a folder given as one).

    ``pretrained=False`` skips the model's ``init_cfg`` checkpoints (testing loads trained weights and does not
    initialise the model).
    """
    for _, init_cfg in pretrained_inits(cfg.get('model')) if pretrained else ():
        checkpoint = init_cfg['checkpoint']
        if isinstance(checkpoint, str) and not is_remote(checkpoint):
            _check_checkpoint_file(checkpoint, PRETRAINED_HINT)
    load_from = cfg.get('load_from')
    if load_from and not is_remote(load_from):
        _check_checkpoint_file(load_from, LOAD_FROM_HINT)


def _check_checkpoint_file(path: str, hint: str) -> None:
    if osp.isdir(path):
        raise DataFileError(path, 'is a folder, not a checkpoint file', hint)
    if not osp.isfile(path):
        raise MissingPathError(path, hint)


IMAGE_HINT = 'pass an image file that OpenCV reads (PNG, JPEG, BMP, ...), e.g. data/shapes/val/000001.png'


def check_image_files(paths: list[str]) -> None:
    """Raise :class:`InputFileError` for the first path that is missing, a folder, or no image OpenCV can decode
    (each image is decoded once here, before a model is built)."""
    import mmcv

    for path in paths:
        if osp.isdir(path):
            raise InputFileError(path, 'is a folder, not an image', IMAGE_HINT)
        if not osp.isfile(path):
            raise InputFileError(path, 'not found', IMAGE_HINT)
        try:
            image = mmcv.imread(path)
        except Exception as error:  # OpenCV raises for an empty file
            raise InputFileError(path, f'cannot be decoded as an image ({type(error).__name__})', IMAGE_HINT
                                 ) from error
        if image is None:
            raise InputFileError(path, 'cannot be decoded as an image (empty, truncated or not an image format)',
                                 IMAGE_HINT)
