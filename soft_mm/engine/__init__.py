"""mmengine extensions: crash-safe checkpoints and a stop at invalid losses (hooks registered in mmengine's HOOKS).

The command-line tools' shared pieces live in :mod:`soft_mm.engine.cli` (imported by the tools, not here).
"""
from .hooks import AtomicCheckpointHook, InvalidLossError, InvalidLossHook

__all__ = ['AtomicCheckpointHook', 'InvalidLossError', 'InvalidLossHook']
