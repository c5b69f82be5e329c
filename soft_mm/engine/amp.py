"""bfloat16 mixed precision on CPU through mmengine: an optim wrapper, and float32 fallbacks for mmcv's CPU ops and
mmdet's post-processing.

mmengine 0.10.7's ``AmpOptimWrapper`` refuses a CPU-only machine (it asserts a CUDA/NPU/MLU/MUSA device and builds a
float16 ``GradScaler``); :class:`CPUAmpOptimWrapper` runs each training step's forward under
``torch.autocast('cpu', dtype=torch.bfloat16)`` instead, with no loss scale (bfloat16 has float32's range). Under
CPU autocast the heads hand mmcv's compiled ops bfloat16 tensors, which their CPU kernels reject ("expected scalar
type Float but found BFloat16"), and mmdet would decode boxes in bfloat16: :func:`enable_cpu_bf16_ops` runs those
steps in float32. mmengine's ``ValLoop(fp16=True)`` and ``TestLoop(fp16=True)`` then evaluate under CPU bfloat16
autocast.
"""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS
from torch import nn

__all__ = ['CPUAmpOptimWrapper', 'enable_cpu_bf16_ops']


def _map_tensors(obj, fn: Callable):
    """``fn`` applied to every tensor in ``obj`` and its lists, tuples and dicts; a container none of whose items
    changed is returned as it is (configs and other dict subclasses keep their type)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        items = [_map_tensors(item, fn) for item in obj]
        if all(a is b for a, b in zip(items, obj)):
            return obj
        return type(obj)(items) if type(obj) in (list, tuple) else items
    if isinstance(obj, dict):
        items = {key: _map_tensors(value, fn) for key, value in obj.items()}
        if all(items[key] is value for key, value in obj.items()):
            return obj
        return type(obj)(items) if type(obj) is dict else items
    return obj


def _has_bfloat16(obj) -> bool:
    found = []
    _map_tensors(obj, lambda t: found.append(t.dtype == torch.bfloat16))
    return any(found)


def _float32_fallback(fn: Callable, restore: bool) -> Callable:
    """``fn`` with the bfloat16 tensors among its arguments (also inside lists, tuples and dicts) cast to float32 and
    autocast off; its floating-point outputs are cast back to bfloat16 if ``restore`` (where the callers' buffers
    expect the input dtype), else left in float32. Calls without bfloat16 tensors pass through."""
    if getattr(fn, '_soft_mm_float32_fallback', False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not _has_bfloat16((args, kwargs)):
            return fn(*args, **kwargs)
        args, kwargs = _map_tensors((args, kwargs), lambda t: t.float() if t.dtype == torch.bfloat16 else t)
        with torch.autocast('cpu', enabled=False):
            out = fn(*args, **kwargs)
        if restore:
            out = _map_tensors(out, lambda t: t.bfloat16() if t.is_floating_point() else t)
        return out

    wrapper._soft_mm_float32_fallback = True
    return wrapper


def enable_cpu_bf16_ops() -> None:
    """Make bfloat16 autocast on CPU work with mmcv's ops and mmdet's post-processing (idempotent; calls without
    bfloat16 tensors are unchanged).

    mmcv's ``nms`` (also through ``batched_nms``) and ``roi_align`` (also through ``RoIAlign``) run in float32;
    mmdet's ``predict_by_feat`` of the dense heads (RetinaNet, RPN), the RoI box head and the mask head decode boxes
    and masks in float32 from the bfloat16 head outputs, so box coordinates are not rounded to bfloat16 (8 px steps
    at 1333 px).
    """
    import mmcv.ops  # noqa: F401  (imports the submodules; mmcv.ops.nms itself names the function there)
    nms_mod, roi_mod = sys.modules['mmcv.ops.nms'], sys.modules['mmcv.ops.roi_align']
    # batched_nms looks nms up by name in its module; float32 results keep the kept boxes' coordinates exact
    nms_mod.nms = _float32_fallback(nms_mod.nms, restore=False)
    # RoIAlign.forward calls this module global; the RoI heads write its result into buffers of the features' dtype
    roi_mod.roi_align = _float32_fallback(roi_mod.roi_align, restore=True)
    try:
        from mmdet.models.dense_heads.base_dense_head import BaseDenseHead
        from mmdet.models.roi_heads.bbox_heads.bbox_head import BBoxHead
        from mmdet.models.roi_heads.mask_heads.fcn_mask_head import FCNMaskHead
    except ImportError:  # no mmdet: segmentation and classification need nothing more
        return
    for head in (BaseDenseHead, BBoxHead, FCNMaskHead):
        head.predict_by_feat = _float32_fallback(head.predict_by_feat, restore=False)


@OPTIM_WRAPPERS.register_module()
class CPUAmpOptimWrapper(OptimWrapper):
    """``OptimWrapper`` whose training forward runs under CPU bfloat16 autocast (no loss scale).

    Use it where ``AmpOptimWrapper`` cannot run (a CPU-only machine): ``optim_wrapper = dict(type='CPUAmpOptimWrapper',
    optimizer=...)``, or ``tools/train.py --amp`` on a machine without a GPU. Parameters, gradients and optimizer
    state stay float32; autocast runs linears, convs and matmuls in bfloat16, and soft_mm's SOFT op takes its
    bfloat16-products policy (:mod:`soft_mm.ops.precision.soft_policy`).
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        enable_cpu_bf16_ops()

    @contextmanager
    def optim_context(self, model: nn.Module) -> Iterator[None]:
        with super().optim_context(model), torch.autocast('cpu', dtype=torch.bfloat16):
            yield
