"""Runtime helpers for the command-line tools: checkpoint loading on torch >= 2.6, device and path checks.

``import soft_mm`` allow-lists mmengine's checkpoint globals (see :mod:`.checkpoint` and :mod:`soft_mm.registry`).
"""
from .checkpoint import allow_mmengine_checkpoint_globals, mmengine_checkpoint_globals
from .config_checks import MissingPathError, check_checkpoint_paths, check_data_paths
from .launch import adapt_config_to_device, enable_amp

__all__ = ['MissingPathError', 'adapt_config_to_device', 'allow_mmengine_checkpoint_globals',
           'check_checkpoint_paths', 'check_data_paths', 'enable_amp', 'mmengine_checkpoint_globals']
