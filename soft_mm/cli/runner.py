"""The runner of ``tools/train.py`` and ``tools/test.py``: building it, the checkpoints it will load checked before it
runs, and training that saves its progress when an unreadable image stops it."""
from __future__ import annotations

import os.path as osp

from mmengine.config import Config
from mmengine.dist import is_main_process
from mmengine.registry import RUNNERS
from mmengine.runner import Runner, find_latest_checkpoint
from torch import nn

from ..utils.atomic import atomic_write_text, partial_path, publish
from ..utils.checkpoint import (
    CheckpointFileError,
    allow_mmengine_checkpoint_globals,
    check_state_dict_fits,
    read_checkpoint,
    state_dict_of,
)
from ..utils.config_tree import is_remote, pretrained_inits
from ..utils.image_files import UNREADABLE_IMAGES_KEY, UnreadableImageError
from .runtime import adapt_config_to_device


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
    every ``Pretrained`` ``init_cfg`` (the weights of that module, after its ``prefix``; a SOFT backbone's must be
    exactly its own, as its ``init_weights`` checks: :mod:`soft_mm.models.checkpoint_fit`). Testing: ``load_from``.
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
        tensors = state_dict_of(read_checkpoint(checkpoint), checkpoint)
        if callable(getattr(module, 'check_pretrained', None)):  # SOFT: its backbone tensors must all fit
            module.check_pretrained(tensors, checkpoint, init_cfg.get('prefix'), where=where)
            continue
        check_state_dict_fits(module, tensors, checkpoint, where,
                              f'pass a checkpoint of {where} (for SOFT: an ImageNet checkpoint converted with '
                              'tools/model_converters/convert_official_checkpoint.py)', prefix=init_cfg.get('prefix'))

