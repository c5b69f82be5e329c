"""What the command-line tools share, in one home: argument sets, config loading and checks, the runner, checkpoint
checks, one-sentence errors (:mod:`.tools`), the data and checkpoint path checks (:mod:`.config_checks`), and the
adjustments of a config to the machine, AMP and compilation (:mod:`.runtime`). Imported by ``tools/``, not by
``import soft_mm``."""
from .config_checks import DataFileError, MissingPathError, check_checkpoint_paths, check_data_paths
from .runtime import (
    AMP_DTYPES,
    COMPILE_BACKENDS,
    LAUNCHERS,
    adapt_config_to_device,
    compile_backbone_for_inference,
    compiled_graphs_note,
    enable_amp,
    enable_test_amp,
)

__all__ = ['AMP_DTYPES', 'COMPILE_BACKENDS', 'LAUNCHERS', 'DataFileError', 'MissingPathError', 'adapt_config_to_device',
           'check_checkpoint_paths', 'check_data_paths', 'compile_backbone_for_inference', 'compiled_graphs_note',
           'enable_amp', 'enable_test_amp']
