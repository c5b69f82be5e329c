"""mmengine extensions: crash-safe checkpoints, a stop at invalid losses and the attention-health log (hooks
registered in mmengine's HOOKS).

The command-line tools' shared pieces live in :mod:`soft_mm.engine.cli` (imported by the tools, not here).
"""
from .hooks import AtomicCheckpointHook, AttentionHealthHook, InvalidLossError, InvalidLossHook

__all__ = ['AtomicCheckpointHook', 'AttentionHealthHook', 'InvalidLossError', 'InvalidLossHook']
