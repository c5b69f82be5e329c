"""What the command-line tools share, in one home: the arguments (:mod:`.arguments`), loading a config
(:mod:`.config_loading`), the data, checkpoint and image path checks (:mod:`.config_checks`), the runner and the
checkpoints it loads (:mod:`.runner`), one-sentence errors (:mod:`.errors`), and the adjustments of a config to the
machine, AMP and compilation (:mod:`.runtime`). Imported by ``tools/``, not by ``import soft_mm``."""
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
