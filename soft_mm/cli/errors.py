"""A user's mistake as one sentence: the tools' error types and the context that turns them into an exit.

A bad config, dataset path or checkpoint file, or a bad argument of a class the config builds, stops a tool with exit
status 1 and one sentence on stderr that names the file or argument, what is wrong and what to do
(:func:`one_sentence_errors`); ``--debug``, or ``SOFT_MM_DEBUG=1`` in the environment (for a tool started by a script,
``mim`` or a launcher, whose command line is not at hand), shows the full traceback instead. Errors that are not the
user's (bugs) keep their traceback.
"""
from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from types import TracebackType

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

# the environment variable that turns every tool's one-sentence errors back into tracebacks, as --debug does
DEBUG_ENV = 'SOFT_MM_DEBUG'
_SOFT_MM_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BUILD_FUNCTIONS = os.path.join('mmengine', 'registry', 'build_functions.py')


# the --debug option's help, one text for every tool
DEBUG_HELP = f'show full tracebacks instead of one-sentence errors (or set {DEBUG_ENV}=1 in the environment)'


def debug_requested(flag: bool = False) -> bool:
    """Whether a tool shows tracebacks: its ``--debug`` ``flag``, or ``SOFT_MM_DEBUG`` set to anything but ``0``."""
    return flag or os.environ.get(DEBUG_ENV, '0').strip() not in ('', '0')


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


def _built_classes(tb: TracebackType | None) -> tuple[list[str], bool]:
    """The classes that mmengine's registry was building from the config when the error of traceback ``tb`` was raised
    (outermost first: ``['RetinaNet', 'SOFT']``), and whether the error is an argument error: raised by the call
    of the innermost one itself (Python's unexpected or missing keyword argument) or by soft_mm's validation of its
    arguments (a frame of soft_mm's own code, the constructors' checks that name the argument and what is allowed)."""
    classes: list[str] = []
    innermost_file, innermost_name = '', ''
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == 'build_from_cfg' and code.co_filename.endswith(_BUILD_FUNCTIONS):
            built = tb.tb_frame.f_locals.get('obj_cls')
            if built is not None:
                classes.append(getattr(built, '__name__', str(built)))
        innermost_file, innermost_name = code.co_filename, code.co_name
        tb = tb.tb_next
    by_argument = (innermost_name == 'build_from_cfg' and innermost_file.endswith(_BUILD_FUNCTIONS)) or (
        os.path.abspath(innermost_file).startswith(_SOFT_MM_DIR + os.sep))
    return classes, by_argument


def _argument_error(error: BaseException) -> str | None:
    """The sentence for a bad argument of a class built from the config (``--cfg-options model.backbone.arhc=tiny``):
    the classes being built and the constructor's own message, which names the argument and what is allowed."""
    if not isinstance(error, (TypeError, ValueError)):
        return None
    classes, by_argument = _built_classes(error.__traceback__)
    if not classes or not by_argument:
        return None
    message = str(error).strip()
    return f"the config's {' > '.join(classes)}: {message}{'' if message.endswith('.') else '.'}"


def explain(error: BaseException) -> str | None:
    """The one sentence for a user's mistake behind ``error``, or None for an error that deserves its traceback."""
    if isinstance(error, (ConfigError, CheckpointFileError, InputFileError, InvalidLossError, UnreadableImageError)):
        return str(error)
    argument = _argument_error(error)
    if argument is not None:
        return argument
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

    With ``debug`` (a tool's ``--debug``) or ``SOFT_MM_DEBUG=1`` in the environment everything keeps its traceback.
    """
    debug = debug_requested(debug)
    try:
        yield
    except SystemExit:
        raise
    except Exception as error:
        message = None if debug else explain(error)
        if message is None:
            raise
        raise SystemExit(message) from None

