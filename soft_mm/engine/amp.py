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

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS
from torch import nn

from ..utils.cpu_bf16 import enable_cpu_bf16_ops

__all__ = ['CPUAmpOptimWrapper', 'enable_cpu_bf16_ops']


@OPTIM_WRAPPERS.register_module()
class CPUAmpOptimWrapper(OptimWrapper):
    """``OptimWrapper`` whose training forward runs under CPU bfloat16 autocast (no loss scale).

    Use it where ``AmpOptimWrapper`` cannot run (a CPU-only machine): ``optim_wrapper = dict(type='CPUAmpOptimWrapper',
    optimizer=...)``, or ``tools/train.py --amp`` on a machine without a GPU. Parameters, gradients and optimizer
    state stay float32; autocast runs linears, convs and matmuls in bfloat16, and soft_mm's SOFT op takes its
    bfloat16-products policy (:mod:`soft_mm.ops.soft.policy`).
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        enable_cpu_bf16_ops()

    @contextmanager
    def optim_context(self, model: nn.Module) -> Iterator[None]:
        with super().optim_context(model), torch.autocast('cpu', dtype=torch.bfloat16):
            yield
