"""Runtime helpers for the command-line tools: checkpoint loading on torch >= 2.6, device and path checks.

``import soft_mm`` allow-lists mmengine's checkpoint globals (see :mod:`.checkpoint` and :mod:`soft_mm.registry`).
The helpers that read mmengine configs (:mod:`.config_checks`, :mod:`.launch`) are imported on first access, so the
size arguments (:mod:`.sizes`) and the FlashAttention rule (:mod:`.precision_rule`), which the GPU check
``benchmarks/device_check.py`` uses, import with torch alone.
"""
import importlib

from .atomic import atomic_save, atomic_write_text
from .checkpoint import allow_mmengine_checkpoint_globals, mmengine_checkpoint_globals
from .checkpoint_files import CheckpointFileError, check_state_dict_fits, read_checkpoint

# name -> the submodule that defines it, imported on first access (it imports mmengine)
_NEEDS_MMENGINE = {
    'MissingPathError': 'config_checks', 'check_checkpoint_paths': 'config_checks', 'check_data_paths': 'config_checks',
    'adapt_config_to_device': 'launch', 'compile_backbone_for_inference': 'launch', 'enable_amp': 'launch',
    'enable_test_amp': 'launch',
}

__all__ = ['CheckpointFileError', 'MissingPathError', 'adapt_config_to_device', 'allow_mmengine_checkpoint_globals',
           'atomic_save', 'atomic_write_text', 'check_checkpoint_paths', 'check_data_paths', 'check_state_dict_fits',
           'compile_backbone_for_inference', 'enable_amp', 'enable_test_amp', 'mmengine_checkpoint_globals',
           'read_checkpoint']


def __getattr__(name: str):
    if name in _NEEDS_MMENGINE:
        return getattr(importlib.import_module(f'.{_NEEDS_MMENGINE[name]}', __name__), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
