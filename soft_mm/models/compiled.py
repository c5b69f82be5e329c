"""The pyramid's stages compiled one by one (``compile_stages=``), the way a detection user compiles a backbone:
each stage its own ``torch.compile`` graph, forward and backward, the neck, the heads and the losses eager.

mmengine's ``cfg.compile`` compiles the whole ``train_step``, where mmdet's varying image sizes, its Python-side
target assignment and its losses break or recompile the graph; a stage takes one tensor in and gives one out, so
``dynamic=True`` makes one graph for every input size (mmdet pads each batch to a multiple of 32: the sizes vary from
batch to batch). ``mode='reduce-overhead'`` records a CUDA graph per size on top, for a GPU step that waits for
Python: with ``pad_size_divisor=`` (e.g. ``dict(mode='reduce-overhead', pad_size_divisor=256)``) the input is padded
with zeros at the bottom and the right to the next multiple of it for the stages, so a COCO schedule's many sizes fall
into a few buckets (one graph each, as fixed-size detection recipes pad to a few sizes), and each map handed back is
cropped to the size the unpadded input gives. The padding joins the attention of the border tokens (as mmdet's own
padding to a multiple of 32 does), so the maps differ a little from the unpadded input's near the padded borders.

The compiled stages are built on a stage's first eager forward and belong to that model object: a copy of the model
(``copy.deepcopy``, as mmengine's EMA hook makes one; pickling) starts without them and compiles its own on its first
forward. Where a graph is already being traced, compiled or exported around the model, the stages run as they are. A
stage whose compiled forward fails (a compile or a CUDA graph capture that raises) runs that call again eagerly, and
eagerly from then on, with one :class:`CompileStagesFallbackWarning`; where the eager forward fails too, its error is
raised (the model's own). A failure in a compiled backward is raised as it is.
"""
from __future__ import annotations

import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.graph_mode import graph_mode

__all__ = ['BUCKET_KEYWORD', 'COMPILE_KEYWORDS', 'CompileStagesFallbackWarning', 'CompiledStages',
           'check_compile_stages', 'padded_input']

# the torch.compile keywords compile_stages takes, and its own key of the input's size buckets
COMPILE_KEYWORDS = ('dynamic', 'mode', 'backend', 'fullgraph', 'options')
BUCKET_KEYWORD = 'pad_size_divisor'


def check_compile_stages(value: bool | dict | None) -> dict[str, Any] | None:
    """``compile_stages`` as the keywords of ``torch.compile`` and :data:`BUCKET_KEYWORD` (None: off).

    Raises:
        ValueError: ``value`` is not None, a bool or a dict of :data:`COMPILE_KEYWORDS` and :data:`BUCKET_KEYWORD`,
            or its ``pad_size_divisor`` is not an int >= 1.
    """
    if value is None or value is False:
        return None
    if value is True:
        return dict(dynamic=True)
    if not (isinstance(value, dict) and set(value) <= {*COMPILE_KEYWORDS, BUCKET_KEYWORD}):
        raise ValueError(f'compile_stages must be None, True (dict(dynamic=True)) or a dict of torch.compile keywords '
                         f'{COMPILE_KEYWORDS} and {BUCKET_KEYWORD!r}, got {value!r}')
    divisor = value.get(BUCKET_KEYWORD, 1)
    if isinstance(divisor, bool) or not isinstance(divisor, int) or divisor < 1:
        raise ValueError(f'compile_stages[{BUCKET_KEYWORD!r}] must be an int >= 1 (the input padded to a multiple of '
                         f'it), got {divisor!r}')
    return dict(value)


def padded_input(x: torch.Tensor, divisor: int) -> tuple[torch.Tensor, Callable[[torch.Tensor, int], torch.Tensor]]:
    """``(x padded, crop)``: ``x (B, C, H, W)`` zero-padded at the bottom and the right to the next multiple of
    ``divisor`` (compile_stages' ``pad_size_divisor``), and ``crop(map, i)``, stage ``i``'s map cut to the size the
    unpadded input gives it (``ceil(H / 2^(i + 2))``, as the stride-2 convs round)."""
    height, width = x.shape[-2:]
    pad_h, pad_w = -height % divisor, -width % divisor

    def crop(stage_map: torch.Tensor, stage: int) -> torch.Tensor:
        stride = 2 ** (stage + 2)
        return stage_map[..., :-(-height // stride), :-(-width // stride)]

    return F.pad(x, (0, pad_w, 0, pad_h)), crop


def _log(message: str) -> None:
    """``message`` in mmengine's log where mmengine is installed (the pyramid itself needs torch alone)."""
    try:
        from mmengine.logging import print_log
    except ImportError:
        return
    print_log(message, logger='current')


class CompileStagesFallbackWarning(UserWarning):
    """A stage of ``compile_stages`` runs eagerly: its compiled forward failed (the message names the stage and the
    error)."""


class _Runner:
    """A stage's compiled forward that falls back to the eager one (see the module docstring)."""

    def __init__(self, stage: nn.Module, compiled: Callable, label: str) -> None:
        self.stage, self.compiled, self.label = stage, compiled, label
        self.eager = False

    def __call__(self, *args: Any) -> Any:
        if self.eager:
            return self.stage(*args)
        try:
            return self.compiled(*args)
        except Exception as error:  # a compile or a capture that failed: the eager forward tells the model's own errors
            out = self.stage(*args)
            self.eager = True
            warnings.warn(f'compile_stages: {self.label} runs eagerly from now on: its compiled forward failed '
                          f'({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ""})',
                          CompileStagesFallbackWarning, stacklevel=3)
            return out


def _own_forward(stage: nn.Module) -> Callable:
    """``stage.forward`` bound to ``stage`` with a code object of its own: dynamo keeps its graphs, and its limit of
    recompilations, per code object, and the four stages share one class (each would otherwise count against the
    others' eight graphs: two modes, train and eval, and a size or two are enough to reach it). Forward hooks on the
    stage module itself are not called (those on its blocks are)."""
    forward = type(stage).forward
    own = types.FunctionType(forward.__code__.replace(), forward.__globals__, forward.__name__, forward.__defaults__,
                             forward.__closure__)
    return types.MethodType(own, stage)


class CompiledStages:
    """The compiled callables of one pyramid's stages, built on first use (:meth:`runner`); copies and pickles of the
    pyramid start empty (a compiled callable holds the stage it was built for)."""

    def __init__(self) -> None:
        self.runners: dict[int, Callable] = {}

    def runner(self, stage: nn.Module, options: dict[str, Any], name: str = 'a stage') -> Callable:
        """``stage`` compiled with ``options`` (built on the first call), or ``stage`` itself while a graph is being
        traced, compiled or exported around it."""
        if graph_mode() != 'eager':
            return stage
        compiled = self.runners.get(id(stage))
        if compiled is None:
            options = {key: value for key, value in options.items() if key != BUCKET_KEYWORD}
            compiled = self.runners[id(stage)] = _Runner(stage, torch.compile(_own_forward(stage), **options), name)
            _log(f'soft_mm: a backbone stage ({type(stage).__name__} of {sum(1 for _ in stage.parameters())} '
                 f'parameter tensors) runs under torch.compile({", ".join(f"{k}={v!r}" for k, v in options.items())})')
        return compiled

    def __deepcopy__(self, memo: dict) -> CompiledStages:
        return CompiledStages()

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.runners = {}
