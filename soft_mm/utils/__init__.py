"""Runtime helpers for the command-line tools: checkpoint loading on torch >= 2.6, device and path checks.

``import soft_mm`` allow-lists mmengine's checkpoint globals (see :mod:`.checkpoint` and :mod:`soft_mm.registry`).
"""
from .atomic import atomic_save, atomic_write_text
from .checkpoint import allow_mmengine_checkpoint_globals, mmengine_checkpoint_globals
from .checkpoint_files import CheckpointFileError, check_state_dict_fits, read_checkpoint
from .config_checks import MissingPathError, check_checkpoint_paths, check_data_paths
from .launch import adapt_config_to_device, compile_backbone_for_inference, enable_amp, enable_test_amp

__all__ = ['CheckpointFileError', 'MissingPathError', 'adapt_config_to_device', 'allow_mmengine_checkpoint_globals',
           'atomic_save', 'atomic_write_text', 'check_checkpoint_paths', 'check_data_paths', 'check_state_dict_fits',
           'compile_backbone_for_inference', 'enable_amp', 'enable_test_amp', 'mmengine_checkpoint_globals',
           'read_checkpoint']
