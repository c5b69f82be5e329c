"""A user's mistake as one sentence: the tools' error types and the context that turns them into an exit.

A bad config, dataset path or checkpoint file stops a tool with exit status 1 and one sentence on stderr that names
the file, what is wrong and what to do (:func:`one_sentence_errors`); ``--debug`` shows the full traceback instead.
Errors that are not the user's (bugs) keep their traceback.
"""
from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from ..engine.hooks import AtomicCheckpointHook, AttentionHealthHook, InvalidLossError, InvalidLossHook
from ..utils.checkpoint import (
    CheckpointFileError,
    checkpoint_path_of_traceback,
    describe_load_error,
)
from ..utils.image_files import UnreadableImageError

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

