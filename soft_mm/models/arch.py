"""The one table of SOFT architectures, the variant record derived from it, and the validation of custom archs.

Every variant uses head dim 32, a stride-4 conv stem, SOFT attention in stages 1-3 with landmark strides 8/4/2 and
value-conv kernels 9/5/3, and softmax attention in stage 4 (``stage_attention``). ``small`` uses depths 1,3,7,4: the
published 24M model (the authors' code defines 1,3,20,4, a 38.9M model; a checkpoint of that layout converts to a
custom arch).

:data:`VARIANTS` holds one :class:`Variant` per timm model (``soft_tiny`` ... ``soft_norm_huge``): its arch, plain or
Norm attention, the published figures and the output channels. The timm entrypoints are generated from it and the
tests read their tables from it; adding a variant is one line of :data:`_TABLE`.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any

ARCH_KEYS = ('embed_dims', 'num_heads', 'depths', 'landmark_strides', 'v_conv_kernels', 'mlp_ratio', 'stage_attention')
# The token mixer of each stage: 'soft' (SOFT attention, post-norm blocks) or 'softmax' (pre-norm blocks).
STAGE_ATTENTION_KINDS = ('soft', 'softmax')
NUM_STAGES = 4

DEFAULT_STAGE_ATTENTION = ('soft', 'soft', 'soft', 'softmax')

_COMMON = dict(landmark_strides=(8, 4, 2), v_conv_kernels=(9, 5, 3), mlp_ratio=4,
               stage_attention=DEFAULT_STAGE_ATTENTION)

# name: (embed_dims, num_heads, depths), then the figures: exact parameters of the 1000-class classifier (conv
# landmarks, cls token, position embeddings; soft-spec §3), published parameters (millions, as the paper truncates
# them), GFLOPs at 224x224, ImageNet top-1 plain / Norm.
_TABLE: dict[str, tuple] = {
    'tiny': ((64, 128, 320, 512), (2, 4, 10, 16), (1, 2, 3, 2), 13_069_056, 13, 1.9, 79.3, 79.4),
    'small': ((64, 128, 320, 512), (2, 4, 10, 16), (1, 3, 7, 4), 24_110_092, 24, 3.3, 82.2, 82.4),
    'medium': ((64, 128, 288, 512), (2, 4, 9, 16), (1, 3, 29, 5), 45_812_707, 45, 7.2, 82.9, 83.1),
    'large': ((64, 128, 320, 512), (2, 4, 10, 16), (1, 3, 40, 5), 64_700_646, 64, 11.0, 83.1, 83.3),
    'huge': ((64, 128, 352, 512), (2, 4, 11, 16), (1, 5, 49, 5), 87_108_273, 87, 16.3, 83.3, 83.4),
}

ARCH_SETTINGS: dict[str, dict[str, Any]] = {
    name: dict(embed_dims=dims, num_heads=heads, depths=depths, **_COMMON)
    for name, (dims, heads, depths, *_) in _TABLE.items()}

# Published figures (soft-spec §3): parameters of the 1000-class classifier, GFLOPs at 224x224, top-1 plain / Norm.
PUBLISHED = {name: dict(params_m=params_m, gflops=gflops, top1=(plain, norm))
             for name, (*_, params_m, gflops, plain, norm) in _TABLE.items()}


@dataclasses.dataclass(frozen=True)
class Variant:
    """One timm model of the table: ``soft_<arch>`` (plain SOFT) or ``soft_norm_<arch>`` (SOFT-Norm).

    ``num_params`` is the exact parameter count of its 1000-class classifier, ``params_m``, ``gflops`` and ``top1``
    the published figures (ImageNet-1k, 224x224), ``out_channels`` the channels of its four stage maps (a neck's
    ``in_channels``).
    """

    name: str
    arch: str
    soft_norm: bool
    num_params: int
    params_m: int
    gflops: float
    top1: float
    out_channels: tuple[int, ...]

    @property
    def title(self) -> str:
        """``'SOFT-Tiny'``, ``'SOFT-Norm-Tiny'``, ..."""
        return f"SOFT-{'Norm-' if self.soft_norm else ''}{self.arch.capitalize()}"


def variant_name(arch: str, soft_norm: bool) -> str:
    """The timm model name of a table arch: ``soft_tiny``, ``soft_norm_tiny``, ..."""
    return f"soft_{'norm_' if soft_norm else ''}{arch}"


def _variant(arch: str, soft_norm: bool) -> Variant:
    dims, _, _, num_params, params_m, gflops, plain, norm = _TABLE[arch]
    return Variant(name=variant_name(arch, soft_norm), arch=arch, soft_norm=soft_norm, num_params=num_params,
                   params_m=params_m, gflops=gflops, top1=norm if soft_norm else plain, out_channels=dims)


# The ten timm models, plain ones first, in table order.
VARIANTS: dict[str, Variant] = {v.name: v for v in (_variant(arch, soft_norm)
                                                    for soft_norm in (False, True) for arch in _TABLE)}


def get_variant(name: str) -> Variant:
    """The :class:`Variant` of a timm model name (``'soft_norm_small'``)."""
    if name not in VARIANTS:
        raise ValueError(f"name={name!r} is not a SOFT variant; valid names: {', '.join(VARIANTS)}")
    return VARIANTS[name]


def out_channels(arch: str | dict[str, Any]) -> list[int]:
    """Channels of the four stage maps of ``arch`` (a table name or a dict): what a neck's ``in_channels`` takes."""
    return list(resolve_arch(arch)['embed_dims'])


def resolve_arch(arch: str | dict[str, Any]) -> dict[str, Any]:
    """Return a validated copy of the settings of ``arch`` (a name of :data:`ARCH_SETTINGS` or a dict).

    A dict must give ``embed_dims``, ``num_heads`` and ``depths`` (4 entries each; every dim divisible by its head
    count); ``stage_attention`` (4 of ``'soft'``/``'softmax'``), ``landmark_strides`` and ``v_conv_kernels`` (one
    entry per SOFT stage) and ``mlp_ratio`` default to the values every published variant uses.
    """
    if isinstance(arch, str):
        if arch not in ARCH_SETTINGS:
            raise ValueError(f"arch={arch!r} is not a SOFT architecture; valid names: {', '.join(ARCH_SETTINGS)} "
                             f"(or a dict with keys {', '.join(ARCH_KEYS)})")
        return copy.deepcopy(ARCH_SETTINGS[arch])
    if not isinstance(arch, dict):
        raise TypeError(f'arch must be a name ({", ".join(ARCH_SETTINGS)}) or a dict, got {type(arch).__name__}')
    unknown = sorted(set(arch) - set(ARCH_KEYS))
    if unknown:
        raise ValueError(f'arch dict has unknown keys {unknown}; allowed keys: {", ".join(ARCH_KEYS)}')
    missing = [k for k in ('embed_dims', 'num_heads', 'depths') if k not in arch]
    if missing:
        raise ValueError(f'arch dict is missing the keys {missing}; it needs embed_dims, num_heads and depths '
                         '(4 entries each)')
    settings = {**_COMMON, **arch}
    kinds = settings['stage_attention']
    if not isinstance(kinds, (list, tuple)) or len(kinds) != NUM_STAGES or any(
            k not in STAGE_ATTENTION_KINDS for k in kinds):
        raise ValueError(f"arch['stage_attention'] must be a sequence of {NUM_STAGES} of {STAGE_ATTENTION_KINDS}, "
                         f'got {kinds!r}')
    settings['stage_attention'] = tuple(kinds)
    num_soft = kinds.count('soft')
    lengths = {'embed_dims': NUM_STAGES, 'num_heads': NUM_STAGES, 'depths': NUM_STAGES, 'landmark_strides': num_soft,
               'v_conv_kernels': num_soft}
    for key, length in lengths.items():
        value = settings[key]
        if not isinstance(value, (list, tuple)) or len(value) != length:
            per = ' (one per SOFT stage)' if key in ('landmark_strides', 'v_conv_kernels') else ''
            raise ValueError(f'arch[{key!r}] must be a sequence of {length} ints{per}, got {value!r}')
        if not all(isinstance(v, int) and v > 0 for v in value):
            raise ValueError(f'arch[{key!r}] must hold positive ints, got {value!r}')
        settings[key] = tuple(value)
    bad = [(d, h) for d, h in zip(settings['embed_dims'], settings['num_heads']) if d % h]
    if bad:
        raise ValueError(f'arch embed_dims and num_heads are inconsistent: each dim must be divisible by its head '
                         f'count, but (dim, heads) = {bad}')
    if not all(k % 2 == 1 for k in settings['v_conv_kernels']):
        raise ValueError(f"arch['v_conv_kernels'] must be odd (same padding), got {settings['v_conv_kernels']}")
    if not (isinstance(settings['mlp_ratio'], (int, float)) and settings['mlp_ratio'] > 0):
        raise ValueError(f"arch['mlp_ratio'] must be a positive number, got {settings['mlp_ratio']!r}")
    return settings
