"""Runtime helpers below the models: reading checkpoints (:mod:`.checkpoint`: the ``weights_only`` allow-list and the
one reader), atomic writes, the config walker, size arguments (:mod:`.sizes`) and the FLOP counter's handles; all
import with torch alone (``benchmarks/device_check.py`` runs without mmengine). The tools' own helpers live in
:mod:`soft_mm.cli`.

``import soft_mm`` allow-lists mmengine's checkpoint globals (see :mod:`.checkpoint` and :mod:`soft_mm.registry`).
"""
from .atomic import atomic_save, atomic_write_text
from .checkpoint import (
           CheckpointFileError,
           allow_mmengine_checkpoint_globals,
           check_state_dict_fits,
           mmengine_checkpoint_globals,
           read_checkpoint,
)

__all__ = ['CheckpointFileError', 'allow_mmengine_checkpoint_globals', 'atomic_save', 'atomic_write_text',
           'check_state_dict_fits', 'mmengine_checkpoint_globals', 'read_checkpoint']
