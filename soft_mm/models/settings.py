"""The one home of SOFT's attention settings: defaults, allowed values and bounds, validated once.

Every layer, shell (mm backbone, timm classifier), tool and the checkpoint converter takes these settings from
:class:`AttentionSettings`; the defaults are the settings of the authors' released checkpoints (strided-conv landmarks,
20 Newton–Schulz iterations with a 0.01 ridge), so a converted checkpoint reproduces the authors' outputs as built.
"""
from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..ops.soft.newton import BACKWARD_MODES
from ..utils.checks import is_int

__all__ = ['AUTHORS_SETTINGS', 'LANDMARK_MODES', 'AttentionSettings', 'UnknownArgumentError', 'attention_settings',
           'model_attention_settings']

LANDMARK_MODES = ('conv', 'avg')


@dataclasses.dataclass(frozen=True)
class AttentionSettings:
    """Settings of every SOFT attention layer of a model.

    Attributes:
        landmark_mode: ``'conv'`` (the authors' strided conv + LayerNorm + GELU sampler, whose weights their
            checkpoints carry) or ``'avg'`` (parameter-free adaptive average pooling).
        landmark_grid: side of the landmark grid; at most ``landmark_grid ** 2`` landmarks at any input size, so the
            cost stays linear in the number of tokens.
        newton_iters: Newton–Schulz iterations for the pseudo-inverse of the landmark kernel (>= 1; the op itself
            also accepts 0, which returns the initial guess).
        newton_ridge: ridge added to the landmark kernel before the inversion (finite, >= 0).
        newton_backward: ``'implicit'`` (gradient of the exact inverse at the converged iterate, no stored
            iterations) or ``'unrolled'`` (autograd through the iterations).
    """

    landmark_mode: str = 'conv'
    landmark_grid: int = 7
    newton_iters: int = 20
    newton_ridge: float = 0.01
    newton_backward: str = 'implicit'

    def __post_init__(self) -> None:
        if self.landmark_mode not in LANDMARK_MODES:
            raise ValueError(f'landmark_mode={self.landmark_mode!r} is not one of {LANDMARK_MODES}')
        if not is_int(self.landmark_grid, 1):
            raise ValueError(f'landmark_grid must be an int >= 1, got {self.landmark_grid!r}')
        if not is_int(self.newton_iters, 1):
            raise ValueError(f'newton_iters must be an int >= 1, got {self.newton_iters!r}')
        ridge = self.newton_ridge
        if isinstance(ridge, bool) or not isinstance(ridge, (int, float)) or not 0 <= ridge < math.inf:
            raise ValueError(f'newton_ridge must be a finite number >= 0, got {ridge!r}')
        object.__setattr__(self, 'newton_ridge', float(ridge))
        if self.newton_backward not in BACKWARD_MODES:
            raise ValueError(f'newton_backward={self.newton_backward!r} is not one of {BACKWARD_MODES}')

    def as_dict(self) -> dict[str, Any]:
        """The settings as constructor keywords (``SOFT(**settings.as_dict())``)."""
        return dataclasses.asdict(self)


FIELDS = tuple(field.name for field in dataclasses.fields(AttentionSettings))
# The settings of the authors' released checkpoints: the defaults.
AUTHORS_SETTINGS = AttentionSettings()


class UnknownArgumentError(TypeError):
    """A keyword argument that a SOFT model or layer does not take. ``str(error)`` is one sentence: the argument, the
    closest known name ("did you mean"), and the allowed names (a model's own arguments apart from the attention
    settings). A TypeError, as Python's own for an unexpected keyword argument."""


def _named(names: Sequence[str]) -> str:
    return ', '.join(names)


def _unknown_names(unknown: Sequence[str], known: Sequence[str]) -> str:
    """``'arhc' (did you mean 'arch'?) and 'foo'``: each unknown name with the closest known one, if any is close."""
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        parts.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


def attention_settings(settings: AttentionSettings | Mapping[str, Any] | None = None,
                       **overrides: Any) -> AttentionSettings:
    """Build (and validate) :class:`AttentionSettings` from keywords, a dict or an instance plus overrides.

    An unknown keyword raises :class:`UnknownArgumentError` naming it, the closest setting and the allowed ones.
    """
    base = dataclasses.asdict(settings) if isinstance(settings, AttentionSettings) else dict(settings or {})
    merged = {**base, **overrides}
    unknown = sorted(set(merged) - set(FIELDS))
    if unknown:
        plural = 's' if len(unknown) > 1 else ''
        raise UnknownArgumentError(f'unknown SOFT attention setting{plural} {_unknown_names(unknown, FIELDS)}; '
                                   f'allowed: {_named(FIELDS)}')
    return AttentionSettings(**merged)


def constructor_arguments(owner: type) -> tuple[str, ...]:
    """The named keyword arguments of ``owner``'s constructor (not ``self``, ``*args`` or ``**kwargs``)."""
    parameters = inspect.signature(owner.__init__).parameters.values()
    return tuple(p.name for p in parameters if p.name != 'self' and p.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY))


def model_attention_settings(owner: type, keywords: Mapping[str, Any]) -> AttentionSettings:
    """The attention settings among the extra keywords of a model's constructor (its ``**attention``), validated.

    A keyword that is no attention setting is a misspelled argument of the model or of the attention: it raises
    :class:`UnknownArgumentError`, one sentence that names it, the closest name among both (first), the model's own
    arguments and, apart, the attention settings. ``owner`` is the model's class, whose signature gives its arguments.
    """
    unknown = sorted(set(keywords) - set(FIELDS))
    if unknown:
        own = constructor_arguments(owner)
        what = 'unexpected keyword arguments' if len(unknown) > 1 else 'an unexpected keyword argument'
        raise UnknownArgumentError(
            f'{owner.__name__}() got {what} {_unknown_names(unknown, own + FIELDS)}: '
            f'its arguments are {_named(own)}, and its attention settings {_named(FIELDS)}')
    return attention_settings(**keywords)
