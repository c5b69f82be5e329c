"""The one home of SOFT's attention settings: defaults, allowed values and bounds, validated once.

Every layer, shell (mm backbone, timm classifier), tool and the checkpoint converter takes these settings from
:class:`AttentionSettings`; the defaults are the settings of the authors' released checkpoints (strided-conv landmarks,
20 Newton–Schulz iterations with a 0.01 ridge), so a converted checkpoint reproduces the authors' outputs as built.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from ..ops.soft.newton import BACKWARD_MODES

__all__ = ['AUTHORS_SETTINGS', 'LANDMARK_MODES', 'AttentionSettings', 'attention_settings']

LANDMARK_MODES = ('conv', 'avg')


def is_int(value: object, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


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


def attention_settings(settings: AttentionSettings | Mapping[str, Any] | None = None,
                       **overrides: Any) -> AttentionSettings:
    """Build (and validate) :class:`AttentionSettings` from keywords, a dict or an instance plus overrides.

    An unknown keyword raises a ``TypeError`` naming it and the allowed ones.
    """
    base = dataclasses.asdict(settings) if isinstance(settings, AttentionSettings) else dict(settings or {})
    merged = {**base, **overrides}
    unknown = sorted(set(merged) - set(FIELDS))
    if unknown:
        raise TypeError(f'unknown SOFT attention setting(s) {unknown}; allowed: {", ".join(FIELDS)}')
    return AttentionSettings(**merged)
