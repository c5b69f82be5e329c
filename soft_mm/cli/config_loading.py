"""Loading a tool's config: the file and its ``--cfg-options``, the ``custom_imports`` check, the work dir, the
TensorBoard backend and the checked image loading of every data loader."""
from __future__ import annotations

import contextlib
import os.path as osp
import warnings
from collections.abc import Iterator
from typing import Any

from mmengine.config import Config

from ..utils.config_tree import config_dicts
from ..utils.image_files import UNREADABLE_IMAGES_CHOICES, UNREADABLE_IMAGES_KEY
from .errors import CUSTOM_IMPORTS_LINE, SOFT_MM_TYPES, ConfigError

CHECKED_IMAGE_LOADING = 'CheckedLoadImageFromFile'

_IMAGE_LOADING_TYPES = ('LoadImageFromFile', 'mmcv.LoadImageFromFile')


def _check_pipelines(node: Any, on_unreadable: str) -> None:
    """Replace every ``LoadImageFromFile`` of the ``pipeline`` lists under ``node`` (each list by a new one: data
    sets may share a pipeline object)."""
    for _, owner in config_dicts(node):
        pipeline = owner.get('pipeline')
        if isinstance(pipeline, list):
            owner['pipeline'] = [
                {**step, 'type': CHECKED_IMAGE_LOADING, 'on_unreadable': on_unreadable}
                if isinstance(step, dict) and step.get('type') in _IMAGE_LOADING_TYPES else step for step in pipeline]


def use_checked_image_loading(cfg: Config) -> None:
    """Load the images of every data loader with soft_mm's ``CheckedLoadImageFromFile``, which names an image it
    cannot load (:mod:`soft_mm.utils.image_files`): the training set skips such images with a warning when the config
    says ``unreadable_images = 'skip'``, and stops otherwise (the default ``'stop'``); validation and test sets always
    stop (a score over fewer images is not the set's score)."""
    mode = cfg.get(UNREADABLE_IMAGES_KEY, 'stop')
    if mode not in UNREADABLE_IMAGES_CHOICES:
        raise ConfigError(f'{UNREADABLE_IMAGES_KEY}={mode!r} in the config is not one of {UNREADABLE_IMAGES_CHOICES}: '
                          f"use 'stop' (the default) or 'skip' (skip unreadable training images with a warning)")
    for phase in ('train', 'val', 'test'):
        _check_pipelines(cfg.get(f'{phase}_dataloader'), mode if phase == 'train' else 'stop')


def check_custom_imports(cfg: Config, path: str) -> None:
    """Raise :class:`ConfigError` when the config names a soft_mm type without importing soft_mm.

    The tools import soft_mm themselves, so such a config would run here and fail in every other OpenMMLab tool
    (``mmdet``'s ``tools/train.py``, ``mim train``) with ``KeyError: 'SOFT is not in the mmdet::model registry'``.
    """
    # the backbone first: it is what users add to a config
    names = (node['type'] for _, node in config_dicts(cfg.to_dict()) if isinstance(node.get('type'), str))
    used = sorted(SOFT_MM_TYPES.intersection(names), key=lambda name: ('SOFT' not in name, name))
    imports = (cfg.get('custom_imports') or {}).get('imports', [])
    imports = [imports] if isinstance(imports, str) else list(imports)
    if used and not any(name == 'soft_mm' or name.startswith('soft_mm.') for name in imports):
        raise ConfigError(f"{path} uses type='{used[0]}' but does not import soft_mm: add {CUSTOM_IMPORTS_LINE} "
                          'to it (mmdet, mmseg and mim find SOFT only then)')


# setuptools >= 81 warns at every import of pkg_resources, and mmengine 0.10.7 imports it, then reloads it twice, to
# find the package of a base config's scope (_base_ = 'mmdet::...'): three warnings per tool run that say nothing the
# user can act on (setuptools is pinned below 82, where pkg_resources still exists: docs/get_started.md)
PKG_RESOURCES_WARNING = 'pkg_resources is deprecated as an API'


@contextlib.contextmanager
def without_pkg_resources_warning() -> Iterator[None]:
    """Leave out setuptools' deprecation warning for pkg_resources while mmengine loads a config."""
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', message=PKG_RESOURCES_WARNING, category=UserWarning)
        yield


def load_config(path: str, cfg_options: dict | None = None) -> Config:
    """``Config.fromfile(path)`` (which runs the config's ``custom_imports``) plus ``--cfg-options``.

    A missing file, a syntax error or an error while the config (or one of its bases) runs is a :class:`ConfigError`.
    """
    if not osp.isfile(path):
        raise ConfigError(f'{path} not found: pass the path of a config file (e.g. configs/retinanet_soft_tiny_demo.py)'
                          if not osp.isdir(path) else f'{path} is a folder: pass the path of a config file (*.py)')
    try:
        with without_pkg_resources_warning():
            cfg = Config.fromfile(path)
    except SyntaxError as error:
        detail = error.msg if error.lineno is None else f'{error.msg} at line {error.lineno}'
        raise ConfigError(f'{path} cannot be parsed ({detail}): fix the Python syntax of the config') from error
    except Exception as error:  # the config is a Python program: any error while it or a base runs is the config's
        cause = error
        while isinstance(cause, ImportError) and (cause.__cause__ or cause.__context__):  # mmengine re-raises
            cause = cause.__cause__ or cause.__context__
        first_line = (str(cause).strip().splitlines() or [''])[0]
        raise ConfigError(f'{path} cannot be loaded ({type(cause).__name__}: {first_line}): fix the config or the '
                          '_base_ files and custom_imports it names') from error
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    check_custom_imports(cfg, path)
    return cfg


TENSORBOARD_BACKEND = 'TensorboardVisBackend'


def enable_tensorboard(cfg: Config) -> None:
    """Add mmengine's ``TensorboardVisBackend`` to the config's visualizer (next to its other backends, so
    ``vis_data/scalars.json`` is still written); events go to ``<work_dir>/<timestamp>/vis_data``."""
    if 'visualizer' not in cfg:
        raise ConfigError('the config has no visualizer: --tensorboard adds a backend to it')
    backends = list(cfg.visualizer.get('vis_backends') or [])
    if not any(str(backend.get('type', '')).split('.')[-1] == TENSORBOARD_BACKEND for backend in backends):
        backends.append({'type': TENSORBOARD_BACKEND})
    cfg.visualizer.vis_backends = backends


def default_work_dir(config_path: str) -> str:
    """``work_dirs/<config file name without .py>``."""
    return osp.join('work_dirs', osp.splitext(osp.basename(config_path))[0])


def set_work_dir(cfg: Config, config_path: str, work_dir: str | None) -> None:
    """``--work-dir`` if given, else the config's ``work_dir``, else :func:`default_work_dir`."""
    cfg.work_dir = work_dir or cfg.get('work_dir') or default_work_dir(config_path)

