"""mmengine extensions: crash-safe checkpoints, a stop at invalid losses and the attention-health log (hooks
registered in mmengine's HOOKS), and bfloat16 mixed precision on CPU (``CPUAmpOptimWrapper`` in OPTIM_WRAPPERS).

The command-line tools' shared pieces live in :mod:`soft_mm.cli` (imported by the tools, not by ``import soft_mm``).
"""
from .amp import CPUAmpOptimWrapper, enable_cpu_bf16_ops
from .hooks import AtomicCheckpointHook, AttentionHealthHook, InvalidLossError, InvalidLossHook

__all__ = ['AtomicCheckpointHook', 'AttentionHealthHook', 'CPUAmpOptimWrapper', 'InvalidLossError', 'InvalidLossHook',
           'enable_cpu_bf16_ops']
