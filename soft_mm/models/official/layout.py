"""The SOFT authors' layout (fudan-zvg/SOFT) beside the model: their key map, the arch read off their tensors, the
migration a model runs on load and timm's pretrained filter (as timm keeps ``checkpoint_filter_fn`` in its model files).

Key mapping (``s`` = 1..3 are the SOFT stages, ``j`` the block index)::

    official                                        soft_mm
    pos_embed{1,2,3}                                stages.{0,1,2}.pos_embed
    pos_embed4            (1, 1 + 49, C4)           cls_pos_embed = [:, :1], stages.3.pos_embed = [:, 1:]
    patch_embed1.proj.{0,1,3,4,6,7}.*               stages.0.downsample.{0,1,2}.{conv,bn}.*   (3-conv stem)
    patch_embed{2,3,4}.proj.{0,1}.*                 stages.{1,2,3}.downsample.{conv,bn}.*
    block{s}.{j}.att.mha.W_q / W_v / ff             stages.{s-1}.blocks.{j}.attn.qk / v / proj      (SOFT stages)
    block{s}.{j}.att.mha.attn.Qlandmark_op          stages.{s-1}.blocks.{j}.attn.landmark_conv
    block{s}.{j}.att.mha.attn.Qnorm_act.0           stages.{s-1}.blocks.{j}.attn.landmark_norm
    block{s}.{j}.att.mha.attn.conv                  stages.{s-1}.blocks.{j}.attn.v_conv
    block{s}.{j}.att.{norm1,norm2,ff1,ff2}          stages.{s-1}.blocks.{j}.{norm1,norm2,mlp.fc1,mlp.fc2}
    block{s}.{j}.{norm1,attn.q,attn.kv,attn.proj,norm2,mlp.fc1,mlp.fc2}   stages.{s-1}.blocks.{j}.(same)  (softmax)
    norm.*, cls_token, head.*                       unchanged

``s`` runs over all four stages: the keys of a block say its attention kind (``att.mha.*`` SOFT, ``attn.q`` softmax;
the authors' variants have SOFT in stages 1-3, softmax in stage 4, the arch's ``stage_attention``). The architecture
is read off the shapes: depths from the block indices, dims from ``W_q`` / ``attn.q``, SOFT heads from the value conv
``(heads, 1, k, k)``, v-conv kernels from the same, landmark strides from ``Qlandmark_op (d, d, r, r)``, the MLP ratio
from ``ff1`` / ``mlp.fc1``. A softmax stage has no tensor that tells its head count: it comes from the ``arch`` the
caller gives, else from the table entry that agrees with everything else, else from the SOFT stages' common head dim.
Whether a checkpoint is SOFT-Norm cannot be read from it (same tensors): the caller says so.

A model loads the authors' layout directly (``load_state_dict``, timm's ``pretrained=True`` with a file, mmengine's
``init_cfg=dict(type='Pretrained', ...)``): :func:`migrate_official_keys` renames it with the model's own arch. Reading
and writing checkpoint files is :mod:`soft_mm.models.checkpoint_conversion`'s part.
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..arch import ARCH_KEYS, ARCH_SETTINGS, DEFAULT_STAGE_ATTENTION, NUM_STAGES, resolve_arch

_PARAM = r'(weight|bias|running_mean|running_var|num_batches_tracked)'
_STEM_LAYERS = {'0': '0.conv', '1': '0.bn', '3': '1.conv', '4': '1.bn', '6': '2.conv', '7': '2.bn'}
_DOWNSAMPLE_LAYERS = {'0': 'conv', '1': 'bn'}
_SOFT_BLOCK_LAYERS = {
    'att.mha.W_q': 'attn.qk', 'att.mha.W_v': 'attn.v', 'att.mha.ff': 'attn.proj',
    'att.mha.attn.Qlandmark_op': 'attn.landmark_conv', 'att.mha.attn.Qnorm_act.0': 'attn.landmark_norm',
    'att.mha.attn.conv': 'attn.v_conv', 'att.norm1': 'norm1', 'att.norm2': 'norm2', 'att.ff1': 'mlp.fc1',
    'att.ff2': 'mlp.fc2'}
_SOFTMAX_BLOCK_LAYERS = ('norm1', 'attn.q', 'attn.kv', 'attn.proj', 'norm2', 'mlp.fc1', 'mlp.fc2')


def _alternatives(names: Any) -> str:
    return '|'.join(re.escape(name) for name in names)


# (pattern, rename) pairs, each pattern matched against the whole key.
_RULES: list[tuple[re.Pattern, Any]] = [
    (re.compile(r'pos_embed([1-3])'), lambda m: f'stages.{int(m[1]) - 1}.pos_embed'),
    (re.compile(rf'patch_embed1\.proj\.({_alternatives(_STEM_LAYERS)})\.{_PARAM}'),
     lambda m: f'stages.0.downsample.{_STEM_LAYERS[m[1]]}.{m[2]}'),
    (re.compile(rf'patch_embed([2-4])\.proj\.([01])\.{_PARAM}'),
     lambda m: f'stages.{int(m[1]) - 1}.downsample.{_DOWNSAMPLE_LAYERS[m[2]]}.{m[3]}'),
    (re.compile(rf'block([1-{NUM_STAGES}])\.(\d+)\.({_alternatives(_SOFT_BLOCK_LAYERS)})\.(weight|bias)'),
     lambda m: f'stages.{int(m[1]) - 1}.blocks.{m[2]}.{_SOFT_BLOCK_LAYERS[m[3]]}.{m[4]}'),
    (re.compile(rf'block([1-{NUM_STAGES}])\.(\d+)\.({_alternatives(_SOFTMAX_BLOCK_LAYERS)})\.(weight|bias)'),
     lambda m: f'stages.{int(m[1]) - 1}.blocks.{m[2]}.{m[3]}.{m[4]}'),
    (re.compile(r'cls_token|(norm|head)\.(weight|bias)'), lambda m: m[0]),
]


def map_official_key(key: str) -> str | None:
    """soft_mm name of an official key, or None if no rule maps it (``pos_embed4`` is split, not renamed)."""
    for pattern, rename in _RULES:
        match = pattern.fullmatch(key)
        if match:
            return rename(match)
    return None

# ---------------------------------------------------------------------------------------------------------------------
# The architecture


def _tensor(state_dict: Mapping[str, torch.Tensor], key: str, ndim: int) -> torch.Tensor:
    if key not in state_dict:
        raise ValueError(f'{key!r} is missing: the state dict does not have the official SOFT layout')
    tensor = state_dict[key]
    if tensor.ndim != ndim:
        raise ValueError(f'{key!r} has shape {tuple(tensor.shape)}, expected {ndim} dims')
    return tensor


def _block_depths(state_dict: Mapping[str, torch.Tensor]) -> list[int]:
    indices: list[set[int]] = [set() for _ in range(4)]
    for key in state_dict:
        match = re.match(r'block([1-4])\.(\d+)\.', key)
        if match:
            indices[int(match[1]) - 1].add(int(match[2]))
    depths = []
    for stage, found in enumerate(indices, start=1):
        if not found:
            tops = sorted({k.split('.')[0] for k in state_dict})[:12]
            raise ValueError(f'no block{stage}.* keys: this is not an official SOFT state dict (it needs block1..4; '
                             f'top-level names found: {tops})')
        if found != set(range(len(found))):
            raise ValueError(f'block{stage} indices are not 0..{len(found) - 1}: {sorted(found)}')
        depths.append(len(found))
    return depths


# The key of a block's first tensor that tells its attention kind in the authors' layout.
_KIND_PROBES = {'soft': 'att.mha.W_q.weight', 'softmax': 'attn.q.weight'}


def _stage_kinds(state_dict: Mapping[str, torch.Tensor]) -> list[str]:
    kinds = []
    for stage in range(1, NUM_STAGES + 1):
        found = [kind for kind, key in _KIND_PROBES.items() if f'block{stage}.0.{key}' in state_dict]
        if len(found) != 1:
            probes = ' or '.join(f'block{stage}.0.{key} ({kind})' for kind, key in _KIND_PROBES.items())
            raise ValueError(f"block{stage}.0 has {'both' if found else 'neither'} of {probes}: its attention kind "
                             "cannot be told, so this is not the authors' SOFT layout")
        kinds.append(found[0])
    return kinds


def _softmax_stage_heads(inferred: dict[str, Any], arch: str | Mapping[str, Any] | None) -> list[int]:
    """The head counts of all stages, the softmax ones (None in ``inferred``) filled in (see the module docstring)."""
    heads = inferred['num_heads']
    if arch is not None:
        return list(resolve_arch(arch if isinstance(arch, str) else dict(arch))['num_heads'])
    known = {k: v for k, v in inferred.items() if k != 'num_heads'}
    for name in ARCH_SETTINGS:
        table = resolve_arch(name)
        if (all(table[k] == tuple(v) if isinstance(v, list) else table[k] == v for k, v in known.items())
                and all(h is None or h == t for h, t in zip(heads, table['num_heads']))):
            return list(table['num_heads'])
    head_dims = {d // h for d, h in zip(inferred['embed_dims'], heads) if h is not None}
    if len(head_dims) != 1:
        raise ValueError(f'the head count of the softmax stages cannot be read off the tensors, and the SOFT stages '
                         f'have no common head dim to take (dims {inferred["embed_dims"]}, heads {heads}): pass arch= '
                         '(a table name or a dict with num_heads)')
    head_dim = head_dims.pop()
    for dim, h in zip(inferred['embed_dims'], heads):
        if h is None and dim % head_dim:
            raise ValueError(f'softmax stage dim {dim} is not a multiple of the SOFT stages\' head dim {head_dim}: '
                             'pass arch= (a table name or a dict with num_heads)')
    return [dim // head_dim if h is None else h for dim, h in zip(inferred['embed_dims'], heads)]


def _check_against_arch(inferred: dict[str, Any], arch: str | Mapping[str, Any]) -> None:
    settings = resolve_arch(arch if isinstance(arch, str) else dict(arch))
    found = {k: tuple(v) if isinstance(v, list) else v
             for k, v in {'stage_attention': DEFAULT_STAGE_ATTENTION, **inferred}.items()}
    differ = [f'{k} {found[k]} (arch: {settings[k]})' for k in ARCH_KEYS if found[k] != settings[k]]
    if differ:
        named = f'arch={arch!r}' if isinstance(arch, str) else 'the arch'
        raise ValueError(f"the state dict does not have the layout of {named}: {'; '.join(differ)}")


def infer_arch(state_dict: Mapping[str, torch.Tensor], arch: str | Mapping[str, Any] | None = None,
               ) -> dict[str, Any]:
    """Architecture settings (keys of :data:`~soft_mm.models.arch.ARCH_KEYS`) read off an official state dict.

    ``stage_attention`` is read off the block keys (present in the result only when it is not the default); the head
    count of a softmax stage, which no tensor tells, comes from ``arch`` (a table name or a dict) when given — then
    every inferred setting must agree with it — else from the table entry that agrees with everything else, else
    from the SOFT stages' common head dim. Raises a ValueError naming the key when the layout is not the authors'
    conv-landmark SOFT (e.g. the ``nn.Linear`` landmark op their code uses for a SOFT stage with ratio 1, which
    soft_mm does not implement).
    """
    depths = _block_depths(state_dict)
    kinds = _stage_kinds(state_dict)
    dims, heads, strides, kernels, hidden = [], [], [], [], []
    for stage in (i + 1 for i, kind in enumerate(kinds) if kind == 'softmax'):
        dims.append((stage, _tensor(state_dict, f'block{stage}.0.attn.q.weight', 2).shape[0]))
        hidden.append((stage, _tensor(state_dict, f'block{stage}.0.mlp.fc1.weight', 2).shape[0]))
        heads.append((stage, None))
    for stage in (i + 1 for i, kind in enumerate(kinds) if kind == 'soft'):
        prefix = f'block{stage}.0.att.'
        w_q = _tensor(state_dict, prefix + 'mha.W_q.weight', 2)
        landmark_key = prefix + 'mha.attn.Qlandmark_op.weight'
        landmark_op = state_dict.get(landmark_key)
        if landmark_op is not None and landmark_op.ndim == 2:
            raise ValueError(f'{landmark_key!r} has shape {tuple(landmark_op.shape)}: a Linear landmark op (the '
                             "authors' layout for a SOFT stage with ratio 1); soft_mm supports only the strided-conv "
                             'landmarks (ratio > 1), so this checkpoint cannot be converted')
        landmark_op = _tensor(state_dict, landmark_key, 4)
        v_conv = _tensor(state_dict, prefix + 'mha.attn.conv.weight', 4)
        head_dim, num_heads = landmark_op.shape[1], v_conv.shape[0]
        if (landmark_op.shape[0] != head_dim or landmark_op.shape[2] != landmark_op.shape[3]
                or v_conv.shape[1] != 1 or v_conv.shape[2] != v_conv.shape[3]
                or w_q.shape[0] != w_q.shape[1] or num_heads * head_dim != w_q.shape[0]):
            raise ValueError(f'block{stage}.0 has inconsistent shapes: W_q {tuple(w_q.shape)}, Qlandmark_op '
                             f'{tuple(landmark_op.shape)} (expected (d, d, r, r)), conv {tuple(v_conv.shape)} '
                             '(expected (heads, 1, k, k) with heads * d = dim)')
        dims.append((stage, w_q.shape[0]))
        heads.append((stage, num_heads))
        strides.append(landmark_op.shape[-1])
        kernels.append(v_conv.shape[-1])
        hidden.append((stage, _tensor(state_dict, prefix + 'ff1.weight', 2).shape[0]))
    dims, heads, hidden = ([value for _, value in sorted(pairs)] for pairs in (dims, heads, hidden))
    ratios = {h / d for h, d in zip(hidden, dims)}
    if len(ratios) != 1:
        raise ValueError(f'the MLP hidden sizes {hidden} for dims {dims} do not share one ratio; soft_mm uses one '
                         'mlp_ratio for all stages')
    ratio = ratios.pop()
    inferred = {'embed_dims': dims, 'num_heads': heads, 'depths': depths, 'landmark_strides': strides,
                'v_conv_kernels': kernels, 'mlp_ratio': int(ratio) if ratio.is_integer() else ratio}
    if tuple(kinds) != DEFAULT_STAGE_ATTENTION:
        inferred['stage_attention'] = kinds
    inferred['num_heads'] = _softmax_stage_heads(inferred, arch)
    if arch is not None:
        _check_against_arch(inferred, arch)
    return inferred


def match_arch(arch: Mapping[str, Any]) -> str | None:
    """Name of the :data:`ARCH_SETTINGS` entry with exactly these settings, or None."""
    settings = resolve_arch(dict(arch))
    return next((name for name in ARCH_SETTINGS if resolve_arch(name) == settings), None)


# Conversion


def convert_official_state_dict(state_dict: Mapping[str, torch.Tensor], arch: str | Mapping[str, Any] | None = None,
                                ) -> tuple[dict[str, torch.Tensor], str | dict[str, Any], list[str]]:
    """Official state dict -> ``(soft_mm state dict, arch, unmapped keys)``.

    The returned ``arch`` is the table name when the inferred settings equal an entry of :data:`ARCH_SETTINGS`, else
    a plain dict (lists and ints), e.g. for the authors' own 38.9M "small" with depths 1,3,20,4 (the table's small is
    the published 24M model, depths 1,3,7,4). The ``arch`` argument, when given, says the head counts of the softmax
    stages and must agree with everything the tensors tell (see :func:`infer_arch`). ``unmapped`` lists the keys no
    rule maps (dropped from the result). The result loads strictly into
    ``SoftVisionTransformer(arch, num_classes=head rows)`` (see
    :func:`~soft_mm.models.checkpoint_conversion.verify_converted`); it holds fresh contiguous tensors (no views of the
    input).
    """
    arch_settings = infer_arch(state_dict, arch)
    converted: dict[str, torch.Tensor] = {}
    unmapped = []
    for key, tensor in state_dict.items():
        if key == 'pos_embed4':
            if tensor.ndim != 3 or tensor.shape[1] < 2:
                raise ValueError(f"'pos_embed4' has shape {tuple(tensor.shape)}, expected (1, 1 + H*W, C)")
            converted['cls_pos_embed'] = tensor[:, :1]
            converted['stages.3.pos_embed'] = tensor[:, 1:]
            continue
        new_key = map_official_key(key)
        if new_key is None:
            unmapped.append(key)
        else:
            converted[new_key] = tensor
    converted = {k: v.detach().clone(memory_format=torch.contiguous_format) for k, v in converted.items()}
    name = match_arch(arch_settings)
    return converted, (name if name is not None else arch_settings), unmapped


# Top-level names that only the authors' layout has (soft_mm's are stages, norm, cls_token, cls_pos_embed, head).
_OFFICIAL_NAME = re.compile(r'(block|patch_embed|pos_embed)\d')


def is_official_layout(state_dict: Mapping[str, Any], prefix: str = '') -> bool:
    """Whether the keys under ``prefix`` are in the authors' layout (``block1.0.*``, ``patch_embed1.*``, ...)."""
    return any(key.startswith(prefix) and _OFFICIAL_NAME.match(key, len(prefix)) for key in state_dict)


def migrate_official_keys(state_dict: dict[str, Any], arch: str | Mapping[str, Any], prefix: str = '') -> list[str]:
    """Rename, in place, the authors'-layout keys under ``prefix`` to soft_mm's for a model of ``arch``.

    What a model's ``_load_from_state_dict`` runs, so that ``load_state_dict``, timm's pretrained loading and
    mmengine's ``Pretrained`` init read the authors' files directly. Other keys are left alone; the authors' keys
    that no rule maps are removed and returned. Raises a ValueError when the tensors do not fit ``arch``.
    """
    official = {k[len(prefix):]: state_dict.pop(k) for k in list(state_dict) if k.startswith(prefix)}
    converted, _, unmapped = convert_official_state_dict(official, arch)
    state_dict.update({prefix + k: v for k, v in converted.items()})
    return [prefix + k for k in unmapped]


def checkpoint_filter_fn(state_dict: Mapping[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """timm's ``pretrained_filter_fn`` of the SOFT classifiers: the authors' layout converted for ``model``'s arch
    (their unmapped keys dropped with a warning), a soft_mm state dict passed through."""
    state_dict = dict(state_dict)
    if is_official_layout(state_dict):
        unmapped = migrate_official_keys(state_dict, model.arch_settings)
        if unmapped:
            warnings.warn(f"the authors' checkpoint has keys that soft_mm does not map, dropped: {unmapped[:8]}",
                          stacklevel=2)
    return state_dict

