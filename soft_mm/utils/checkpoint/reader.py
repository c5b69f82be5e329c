"""Read checkpoint files safely and say in one sentence what is wrong with one that cannot be used.

:func:`read_checkpoint` is soft_mm's one checkpoint reader: the tools, the converter and the ONNX exporter read every
file through it. It runs ``torch.load(weights_only=True)`` with mmengine's objects allow-listed
(:func:`.checkpoint.safe_load`), tensors memory-mapped; full unpickling only when the caller passes
``allow_pickle=True``.

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
import warnings
import zipfile
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import torch
from torch import nn

from .allow_list import safe_load

TRUNCATED_HINT = ('copy it again or use an earlier checkpoint (a run killed while saving with mmengine\'s own '
                  'CheckpointHook leaves such files; soft_mm\'s AtomicCheckpointHook does not)')
NOT_A_CHECKPOINT_HINT = 'pass a .pth file written by torch.save (a trained model, or a converted ImageNet checkpoint)'
MISSING_HINT = 'pass the path of an existing checkpoint'
UNSAFE_HINT = ('only if you trust the file, load it once with torch.load(weights_only=False) and save its tensors '
               'again (see Security in docs/advanced/robustness.md)')
# a checkpoint whose tensors cover less than this share of a module's weights is the checkpoint of another model
MIN_MATCHED_FRACTION = 0.5


class CheckpointFileError(ValueError):
    """A checkpoint that cannot be used; ``str(error)`` is one sentence: the file, what is wrong, what to do.

    ``path``, ``problem`` and ``advice`` are the three parts, so a caller can give other advice for the same problem.
    """

    def __init__(self, path: str | os.PathLike, problem: str, advice: str) -> None:
        super().__init__(f'{os.fspath(path)} {problem}: {advice}.')
        self.path, self.problem, self.advice = os.fspath(path), problem, advice


class UnsafeCheckpointError(CheckpointFileError):
    """A checkpoint holding pickled objects that the safe loader refuses (readable only with ``allow_pickle=True``)."""


def describe_load_error(error: BaseException) -> tuple[str, str]:
    """``(problem, advice)`` for an exception raised by ``torch.load`` on a file."""
    message = str(error)
    if isinstance(error, IsADirectoryError):
        return 'is a folder, not a checkpoint file', NOT_A_CHECKPOINT_HINT
    if isinstance(error, FileNotFoundError):
        return 'not found', MISSING_HINT
    if isinstance(error, PermissionError):
        return 'cannot be read (permission denied)', 'make it readable (chmod u+r) or copy it somewhere you can read'
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


ZIP_MAGIC = b'PK\x03\x04'


def _describe_file_error(path: str, error: BaseException) -> tuple[str, str]:
    """:func:`describe_load_error`, told by the file itself when it is a truncated zip archive: it starts like one but
    has no end record (torch reports that as a miniz error, ``OSError: Invalid argument`` or others, by size)."""
    if os.path.isfile(path) and not zipfile.is_zipfile(path):
        with open(path, 'rb') as file:
            if file.read(len(ZIP_MAGIC)) == ZIP_MAGIC:
                return 'is truncated (the file ends before the checkpoint does)', TRUNCATED_HINT
    return describe_load_error(error)


def _refused_global(error: BaseException) -> bool:
    """Whether ``torch.load(weights_only=True)`` failed only because the file holds a global outside the allow-list."""
    return isinstance(error, pickle.UnpicklingError) and re.search(r'GLOBAL ([\w.]+)', str(error)) is not None


def read_checkpoint(path: str | os.PathLike, allow_pickle: bool = False, unsafe_advice: str = UNSAFE_HINT) -> Any:
    """soft_mm's one checkpoint reader: ``torch.load(path, weights_only=True)`` on the CPU, with mmengine's objects
    allow-listed and the tensors of a zip-format file memory-mapped (a large file is not copied into memory).

    A file holding other pickled objects is refused (:class:`UnsafeCheckpointError`, whose advice is
    ``unsafe_advice``) unless ``allow_pickle=True``: then a warning says so and the file is unpickled fully, which can
    run code stored in it (only for files you trust). Every other unreadable file (missing, a folder, empty,
    truncated, corrupt, not a checkpoint) is a :class:`CheckpointFileError` naming the file, the problem and the fix.
    """
    path = os.fspath(path)
    if os.path.isfile(path) and os.path.getsize(path) == 0:
        raise CheckpointFileError(path, 'is empty', TRUNCATED_HINT)
    try:
        # mmap needs the zip format (torch >= 1.6); files of the legacy format are read plainly
        return safe_load(path, map_location='cpu', mmap=zipfile.is_zipfile(path))
    except Exception as error:  # the safe unpickler runs no code of the file: whatever it raises is the file's
        problem, advice = _describe_file_error(path, error)
        refused = _refused_global(error)
        if not (refused and allow_pickle):
            error_type = UnsafeCheckpointError if refused else CheckpointFileError
            raise error_type(path, problem, unsafe_advice if refused else advice) from error
    warnings.warn(f'{path} {problem}; reading it with weights_only=False, which unpickles arbitrary objects: only do '
                  'this for a trusted file', stacklevel=2)
    try:
        return torch.load(path, map_location='cpu', weights_only=False)
    except Exception as error:  # full unpickling runs the file's own code, which can raise anything
        raise CheckpointFileError(path, f'cannot be unpickled ({type(error).__name__}: {error})',
                                  'install the package that defines its objects, or save its tensors with '
                                  'torch.save where it was written') from error


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
