"""Read checkpoint files safely and say in one sentence what is wrong with one that cannot be used.

``torch.load`` reports a truncated file as a miniz error, a text file as ``KeyError: 101`` and a file with pickled
objects as a page of advice; mmengine loads a state dict of another model with a logged warning and goes on with
random weights. :func:`read_checkpoint` and :func:`check_state_dict_fits` turn each case into a
:class:`CheckpointFileError` whose message names the file, the problem and what to do;
:func:`checkpoint_path_of_traceback` finds the file behind an error raised deep inside mmengine.
"""
from __future__ import annotations

import os
import pickle
import re
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import torch
from torch import nn

from .checkpoint import allow_mmengine_checkpoint_globals

TRUNCATED_HINT = ('copy it again or use an earlier checkpoint (a run killed while saving with mmengine\'s own '
                  'CheckpointHook leaves such files; soft_mm\'s AtomicCheckpointHook does not)')
NOT_A_CHECKPOINT_HINT = 'pass a .pth file written by torch.save (a trained model, or a converted ImageNet checkpoint)'
UNSAFE_HINT = ('only if you trust the file, load it once with torch.load(weights_only=False) and save its tensors '
               'again (see Security in docs/robustness.md)')
# a checkpoint whose tensors cover less than this share of a module's weights is the checkpoint of another model
MIN_MATCHED_FRACTION = 0.5


class CheckpointFileError(ValueError):
    """A checkpoint that cannot be used; ``str(error)`` is one sentence: the file, what is wrong, what to do."""

    def __init__(self, path: str | os.PathLike, problem: str, advice: str) -> None:
        super().__init__(f'{os.fspath(path)} {problem}: {advice}.')
        self.path = os.fspath(path)


def describe_load_error(error: BaseException) -> tuple[str, str]:
    """``(problem, advice)`` for an exception raised by ``torch.load`` on a file."""
    message = str(error)
    if isinstance(error, IsADirectoryError):
        return 'is a folder, not a checkpoint file', NOT_A_CHECKPOINT_HINT
    if isinstance(error, FileNotFoundError):
        return 'not found', 'pass the path of an existing checkpoint'
    if isinstance(error, EOFError) or 'failed finding central directory' in message:
        return 'is truncated (the file ends before the checkpoint does)', TRUNCATED_HINT
    if 'PytorchStreamReader' in message or 'zip archive' in message:
        return 'is corrupt (its zip archive cannot be read)', TRUNCATED_HINT
    if isinstance(error, pickle.UnpicklingError):
        unsupported = re.search(r'GLOBAL ([\w.]+)', message)
        if unsupported:
            return (f'holds a pickled {unsupported[1]}, which torch.load(weights_only=True) refuses to run',
                    UNSAFE_HINT)
    return 'is not a PyTorch checkpoint (torch.load cannot read it)', NOT_A_CHECKPOINT_HINT


def read_checkpoint(path: str | os.PathLike) -> Any:
    """``torch.load(path, weights_only=True)`` with mmengine's objects allow-listed, tensors memory-mapped.

    Raises :class:`CheckpointFileError` for a missing, truncated, corrupt or non-checkpoint file.
    """
    allow_mmengine_checkpoint_globals()
    path = os.fspath(path)
    if os.path.isfile(path) and os.path.getsize(path) == 0:
        raise CheckpointFileError(path, 'is empty', TRUNCATED_HINT)
    try:
        try:
            return torch.load(path, map_location='cpu', weights_only=True, mmap=True)
        except RuntimeError as error:  # mmap needs the zip format: read files of the legacy format plainly
            if 'mmap can only be used' not in str(error):
                raise
            return torch.load(path, map_location='cpu', weights_only=True)
    except (OSError, EOFError, RuntimeError, KeyError, ValueError, pickle.UnpicklingError) as error:
        raise CheckpointFileError(path, *describe_load_error(error)) from error


def state_dict_of(checkpoint: Any, path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint dict (``state_dict`` or ``model`` entry) or of a bare state dict, without the
    ``module.`` prefix that (Distributed)DataParallel adds."""
    if not isinstance(checkpoint, Mapping):
        raise CheckpointFileError(path, f'holds a {type(checkpoint).__name__}, not a checkpoint dict',
                                  NOT_A_CHECKPOINT_HINT)
    for key in ('state_dict', 'model'):
        if isinstance(checkpoint.get(key), Mapping):
            checkpoint = checkpoint[key]
            break
    tensors = {k: v for k, v in checkpoint.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
    if not tensors:
        raise CheckpointFileError(path, 'holds no tensors (neither a state_dict nor a bare state dict)',
                                  NOT_A_CHECKPOINT_HINT)
    return {k.removeprefix('module.'): v for k, v in tensors.items()}


def _top_prefixes(keys: list[str], limit: int = 3) -> str:
    prefixes = sorted({key.split('.')[0] for key in keys})
    shown = ', '.join(f"'{p}.'" for p in prefixes[:limit])
    return shown + (', ...' if len(prefixes) > limit else '')


def check_state_dict_fits(module: nn.Module, state_dict: Mapping[str, torch.Tensor], path: str | os.PathLike,
                          where: str, advice: str, prefix: str | None = None) -> int:
    """Raise :class:`CheckpointFileError` unless ``state_dict`` holds most of ``module``'s weights.

    A weight counts when the file has its name (after dropping ``prefix`` from the file's keys, as mmengine's
    ``Pretrained`` init does) with the same shape; less than ``MIN_MATCHED_FRACTION`` of them means the file belongs
    to another model (mmengine would load it with ``strict=False``, log a warning and go on with random weights).
    Returns the number of matched weights.
    """
    if prefix:
        state_dict = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    expected = module.state_dict()
    if not expected:
        return 0
    matched = sum(1 for k, v in expected.items() if k in state_dict and tuple(state_dict[k].shape) == tuple(v.shape))
    if matched >= MIN_MATCHED_FRACTION * len(expected):
        return matched
    found = (f"its keys start with {_top_prefixes(list(state_dict))}" if state_dict else
             f"none of its keys starts with '{prefix}'")
    hint = advice
    for candidate in ('backbone.', 'module.backbone.'):  # a detector/segmentor file given as a backbone init
        if not prefix and any(k.startswith(candidate) for k in state_dict) and not any(
                k.startswith(candidate) for k in expected):
            hint = (f"it looks like the checkpoint of a whole detector or segmentor: add prefix='{candidate}' to the "
                    f'init_cfg to take its backbone, or {advice}')
            break
    raise CheckpointFileError(path, f'does not fit {where}: only {matched} of its {len(expected)} weights are in '
                              f'the file ({found})', hint)


def checkpoint_path_of_traceback(tb: TracebackType | None) -> str | None:
    """The file that the innermost ``torch.load`` in a traceback was reading, if it was given by name."""
    path = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == 'load' and code.co_filename.endswith(os.path.join('torch', 'serialization.py')):
            candidate = tb.tb_frame.f_locals.get('f')
            if isinstance(candidate, (str, os.PathLike)):
                path = os.fspath(candidate)
        tb = tb.tb_next
    return path
