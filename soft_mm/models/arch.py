"""The arch zoo of SOFT (the published variants tiny ... huge, by name) and the validation of custom archs.

Every variant uses head dim 32, a stride-4 conv stem, SOFT attention in stages 1-3 with landmark strides 8/4/2 and
value-conv kernels 9/5/3, and softmax attention in stage 4 (``stage_attention``). ``small`` uses depths 1,3,7,4: the
published 24M model (the authors' code defines 1,3,20,4, a 38.9M model; a checkpoint of that layout converts to a
custom arch).

:data:`ARCH_SETTINGS` holds the architecture only. The published figures of each variant (exact parameters of the
1000-class classifier, parameters in millions, GFLOPs, top-1) live in the metafiles, ``configs/metafiles/*.yml``.
Each arch is two timm models, ``soft_<arch>`` and ``soft_norm_<arch>`` (:func:`variant_name`), whose entrypoints are
written out in :mod:`soft_mm.models.classifier`. Adding a variant: docs/advanced/adding_a_variant.md.
"""
from __future__ import annotations

import copy
from typing import Any

ARCH_KEYS = ('embed_dims', 'num_heads', 'depths', 'landmark_strides', 'v_conv_kernels', 'mlp_ratio', 'stage_attention')
# The token mixer of each stage: 'soft' (SOFT attention, post-norm blocks) or 'softmax' (pre-norm blocks).
STAGE_ATTENTION_KINDS = ('soft', 'softmax')
NUM_STAGES = 4

DEFAULT_STAGE_ATTENTION = ('soft', 'soft', 'soft', 'softmax')

# What every published variant shares (and what a custom arch dict defaults to).
_COMMON = dict(landmark_strides=(8, 4, 2), v_conv_kernels=(9, 5, 3), mlp_ratio=4,
               stage_attention=DEFAULT_STAGE_ATTENTION)

# The arch zoo: the published variants of the SOFT paper, architecture only.
ARCH_SETTINGS: dict[str, dict[str, Any]] = {
    'tiny': dict(embed_dims=(64, 128, 320, 512), num_heads=(2, 4, 10, 16), depths=(1, 2, 3, 2), **_COMMON),
    'small': dict(embed_dims=(64, 128, 320, 512), num_heads=(2, 4, 10, 16), depths=(1, 3, 7, 4), **_COMMON),
    'medium': dict(embed_dims=(64, 128, 288, 512), num_heads=(2, 4, 9, 16), depths=(1, 3, 29, 5), **_COMMON),
    'large': dict(embed_dims=(64, 128, 320, 512), num_heads=(2, 4, 10, 16), depths=(1, 3, 40, 5), **_COMMON),
    'huge': dict(embed_dims=(64, 128, 352, 512), num_heads=(2, 4, 11, 16), depths=(1, 5, 49, 5), **_COMMON),
}


def variant_name(arch: str, soft_norm: bool) -> str:
    """The timm model name of a zoo arch: ``soft_tiny``, ``soft_norm_tiny``, ..."""
    return f"soft_{'norm_' if soft_norm else ''}{arch}"


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
