"""What ``tools/train.py`` and ``tools/test.py`` share: arguments, config loading, work dir, runner, checkpoint checks
and turning a user's mistake into one sentence.

A bad config, dataset path or checkpoint file stops the tool with exit status 1 and one sentence on stderr that names
the file, what is wrong and what to do; ``--debug`` shows the full traceback instead. Errors that are not the user's
(bugs) keep their traceback.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import os.path as osp
import re
from collections.abc import Iterator
from typing import Any

from mmengine.config import Config, DictAction
from mmengine.dist import is_main_process
from mmengine.registry import RUNNERS
from mmengine.runner import Runner, find_latest_checkpoint
from torch import nn

from ..engine.hooks import AtomicCheckpointHook, AttentionHealthHook, InvalidLossError, InvalidLossHook
from ..utils.atomic import atomic_write_text, partial_path, publish
from ..utils.checkpoint import allow_mmengine_checkpoint_globals
from ..utils.checkpoint_files import (
    CheckpointFileError,
    check_state_dict_fits,
    checkpoint_path_of_traceback,
    describe_load_error,
    read_checkpoint,
    state_dict_of,
)
from ..utils.config_tree import config_dicts, is_remote, pretrained_inits
from ..utils.image_files import UNREADABLE_IMAGES_CHOICES, UNREADABLE_IMAGES_KEY, UnreadableImageError
from .runtime import AMP_DTYPES, COMPILE_BACKENDS, LAUNCHERS, adapt_config_to_device

# type names that only resolve once soft_mm is imported
SOFT_MM_TYPES = frozenset({'SOFT', 'soft_mm.SOFT', AtomicCheckpointHook.__name__, InvalidLossHook.__name__,
                           AttentionHealthHook.__name__})
CUSTOM_IMPORTS_LINE = "custom_imports = dict(imports=['soft_mm'], allow_failed_imports=False)"
_NOT_REGISTERED = re.compile(r'^(\S+) is not in the (\S+) registry')


class ConfigError(ValueError):
    """A config that cannot be used; ``str(error)`` is one sentence naming the file, the problem and the fix."""

    def __init__(self, message: str) -> None:
        super().__init__(message if message.endswith('.') else f'{message}.')


class InputFileError(ValueError):
    """An input file (an image) that cannot be used; ``str(error)`` is one sentence: the file, what is wrong, the
    fix."""

    def __init__(self, path: str, problem: str, advice: str) -> None:
        super().__init__(f'{path} {problem}: {advice}.')
        self.path = path


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


def save_progress(runner: Runner) -> str | None:
    """Write a checkpoint of the training so far to ``<work_dir>/iter_<N>.pth`` (N iterations done; written to a
    temporary file and renamed, as :class:`~soft_mm.engine.hooks.AtomicCheckpointHook` does) and point
    ``last_checkpoint`` at it. Returns its path, or None when no iteration has finished. Resuming from it restarts the
    interrupted epoch with the iteration count (and so the learning-rate schedule) where it was."""
    if runner.iter == 0:
        return None
    path = osp.join(runner.work_dir, f'iter_{runner.iter}.pth')
    temp = partial_path(path) if is_main_process() else None
    runner.save_checkpoint(runner.work_dir, osp.basename(temp) if temp else osp.basename(path),
                           meta={'epoch': runner.epoch, 'iter': runner.iter}, by_epoch=False)
    if temp:
        publish(temp, path)
        atomic_write_text(osp.join(runner.work_dir, 'last_checkpoint'), path)
    return path


def train_keeping_progress(runner: Runner) -> None:
    """``runner.train()``; an unreadable training or validation image stops it with one sentence that names the
    file, says how to skip such images and where the training so far was saved (:func:`save_progress`)."""
    try:
        runner.train()
    except UnreadableImageError as error:
        saved = save_progress(runner)
        done = f'{runner.iter} iteration{"s" if runner.iter != 1 else ""}'
        resume = (f'then resume with --resume {saved}, which holds the {done} trained so far' if saved else
                  'then train again (no iteration had finished)')
        raise UnreadableImageError(
            f"{str(error).rstrip('.')}, {resume}; or set {UNREADABLE_IMAGES_KEY} = 'skip' in the config to skip "
            'unreadable training images with a warning.') from error


def read_model_checkpoint(path: str) -> dict:
    """The tensors of a checkpoint a tool will load into a model, read by soft_mm's one checkpoint reader: raises
    :class:`CheckpointFileError` for a missing, empty, truncated, corrupt or non-checkpoint file, a refused pickle
    and a file without a state dict, before anything is built. Check the result with :func:`check_state_dict_fits`."""
    return state_dict_of(read_checkpoint(path), path)


def check_model_checkpoint(model: nn.Module, state_dict: dict, path: str) -> None:
    """Stop when the checkpoint given to a tool is another model's: mmengine would load it with a logged warning and
    the tool would go on with random weights (:func:`check_state_dict_fits`)."""
    check_state_dict_fits(model, state_dict, path, 'the model of this config',
                          'pass a checkpoint trained with this config')


def base_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every runner tool takes: config, --work-dir, --cfg-options, --launcher, --local-rank, --debug."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('config', help='config file')
    parser.add_argument('--work-dir', help='where logs and checkpoints go (default: work_dirs/<config name>)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. train_cfg.max_epochs=2 model.backbone.init_cfg=None')
    parser.add_argument('--launcher', choices=LAUNCHERS, default='none', help='job launcher')
    parser.add_argument('--local-rank', '--local_rank', type=int, default=0)  # set by torch.distributed.launch
    parser.add_argument('--debug', action='store_true', help='show full tracebacks instead of one-sentence errors')
    return parser


def add_precision_args(parser: argparse.ArgumentParser, amp_help: str, compile: bool = True) -> None:
    """``--amp`` (its help ``amp_help``), ``--amp-dtype`` and, with ``compile``, ``--compile [BACKEND]``: the
    precision and compilation arguments of train.py (no ``--compile``), test.py and infer.py."""
    parser.add_argument('--amp', action='store_true', help=amp_help)
    parser.add_argument('--amp-dtype', choices=AMP_DTYPES, default=None,
                        help='with --amp on a GPU: float16 (default) or bfloat16; on CPU only bfloat16')
    if compile:
        parser.add_argument('--compile', nargs='?', const='inductor', default=None, choices=COMPILE_BACKENDS,
                            metavar='BACKEND',
                            help='compile the backbone with torch.compile for inference (default backend inductor, '
                                 'weights frozen into the graph; pays under --amp on CPU, see README); the first '
                                 'forward compiles')


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, exporting ``LOCAL_RANK`` for mmengine as torch.distributed.launch expects."""
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


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


def load_config(path: str, cfg_options: dict | None = None) -> Config:
    """``Config.fromfile(path)`` (which runs the config's ``custom_imports``) plus ``--cfg-options``.

    A missing file, a syntax error or an error while the config (or one of its bases) runs is a :class:`ConfigError`.
    """
    if not osp.isfile(path):
        raise ConfigError(f'{path} not found: pass the path of a config file (e.g. configs/retinanet_soft_tiny_demo.py)'
                          if not osp.isdir(path) else f'{path} is a folder: pass the path of a config file (*.py)')
    try:
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


def build_runner(cfg: Config, launcher: str) -> Runner:
    """Adapt ``cfg`` to the device (CPU: gloo, no SyncBN) and build its runner (``runner_type`` if the config has one).

    Allow-lists the objects of mmengine's checkpoints for ``torch.load(weights_only=True)`` first.
    """
    allow_mmengine_checkpoint_globals()
    adapt_config_to_device(cfg, launcher)
    return Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)


def _module_at(model: nn.Module, keys: tuple[str, ...]) -> nn.Module | None:
    module = getattr(model, 'module', model)  # (Distributed)DataParallel
    for key in keys:
        module = getattr(module, key, None)
        if not isinstance(module, nn.Module):
            return None
    return module


def resume_checkpoint(cfg: Config) -> str | None:
    """The file ``runner.train()`` resumes from: ``load_from`` when given, else the work dir's ``last_checkpoint``."""
    if not cfg.get('resume'):
        return None
    return cfg.get('load_from') or find_latest_checkpoint(cfg.work_dir)


def check_checkpoint_files(runner: Runner, cfg: Config, train: bool) -> None:
    """Read every local checkpoint the run will load and check that it fits: raise :class:`CheckpointFileError`.

    Training: the resumed checkpoint (a full training state of this model), ``load_from`` (this model's weights) and
    every ``Pretrained`` ``init_cfg`` (the weights of that module, after its ``prefix``). Testing: ``load_from``.
    Tensors are memory-mapped, so a large checkpoint is not read twice.
    """
    resumed = resume_checkpoint(cfg) if train else None
    if resumed and not is_remote(resumed):
        checkpoint = read_checkpoint(resumed)
        if not (isinstance(checkpoint, dict) and isinstance(checkpoint.get('meta'), dict)
                and 'state_dict' in checkpoint):
            raise CheckpointFileError(resumed, 'is not a training checkpoint (it has no meta and state_dict entries '
                                      'to resume from)', 'pass a checkpoint written by tools/train.py, or start from '
                                      'its weights with --cfg-options load_from=FILE instead of --resume')
        check_state_dict_fits(runner.model, state_dict_of(checkpoint, resumed), resumed, 'the model of this config',
                              'resume from a checkpoint of a run of this config')
    load_from = cfg.get('load_from')
    if load_from and not is_remote(load_from) and load_from != resumed:
        check_state_dict_fits(runner.model, state_dict_of(read_checkpoint(load_from), load_from), load_from,
                              'the model of this config', 'pass a checkpoint trained with this config (ImageNet '
                              'weights of the backbone go in model.backbone.init_cfg)')
    if not train or resumed:
        return  # testing and resuming replace the initial weights
    for keys, init_cfg in pretrained_inits(cfg.get('model')):
        checkpoint = init_cfg['checkpoint']
        module = _module_at(runner.model, keys) if all(isinstance(key, str) for key in keys) else None
        if module is None or not isinstance(checkpoint, str) or is_remote(checkpoint):
            continue
        where = f"model.{'.'.join(keys)}" if keys else 'the model'
        check_state_dict_fits(module, state_dict_of(read_checkpoint(checkpoint), checkpoint), checkpoint, where,
                              f'pass a checkpoint of {where} (for SOFT: an ImageNet checkpoint converted with '
                              'tools/model_converters/convert_official_checkpoint.py)', prefix=init_cfg.get('prefix'))


def explain(error: BaseException) -> str | None:
    """The one sentence for a user's mistake behind ``error``, or None for an error that deserves its traceback."""
    if isinstance(error, (ConfigError, CheckpointFileError, InputFileError, InvalidLossError, UnreadableImageError)):
        return str(error)
    path = checkpoint_path_of_traceback(error.__traceback__)
    if path is not None:  # torch.load failed deep inside mmengine (resume, load_from, init_cfg)
        return str(CheckpointFileError(path, *describe_load_error(error)))
    if isinstance(error, KeyError) and error.args and isinstance(error.args[0], str):
        match = _NOT_REGISTERED.match(error.args[0])
        if match:
            name, registry = match.groups()
            hint = f'add {CUSTOM_IMPORTS_LINE} to the config' if name in SOFT_MM_TYPES else (
                'fix the name, or add the package that defines it to custom_imports in the config')
            return f"type='{name}' is not registered in {registry}: {hint}."
    return None


@contextlib.contextmanager
def one_sentence_errors(debug: bool = False) -> Iterator[None]:
    """Re-raise a user's mistake (see :func:`explain`) as ``SystemExit(sentence)``: exit status 1, no traceback.

    With ``debug`` everything keeps its traceback.
    """
    try:
        yield
    except SystemExit:
        raise
    except Exception as error:
        message = None if debug else explain(error)
        if message is None:
            raise
        raise SystemExit(message) from None
