"""Reading checkpoint files safely: the one home of soft_mm's checkpoint loading (imports with torch alone).

* :mod:`.allow_list` — ``torch.load(weights_only=True)`` reads mmengine's own checkpoints: exactly the objects they
  hold are allow-listed (:func:`allow_mmengine_checkpoint_globals`, done by ``import soft_mm``), and :func:`safe_load`
  gives every torch the same safe loader;
* :mod:`.reader` — :func:`read_checkpoint`, the reader the tools, the converter and the exporters use, and the
  one-sentence :class:`CheckpointFileError` for a file that cannot be used.

Writing checkpoints so that a kill never leaves a partial file is :mod:`soft_mm.utils.atomic`; the SOFT authors'
checkpoints are converted by :mod:`soft_mm.models.official`.
"""
from .allow_list import (
    allow_mmengine_checkpoint_globals,
    history_buffer_getattr,
    mmengine_checkpoint_globals,
    safe_load,
)
from .reader import (
    MIN_MATCHED_FRACTION,
    MISSING_HINT,
    NOT_A_CHECKPOINT_HINT,
    TRUNCATED_HINT,
    UNSAFE_HINT,
    CheckpointFileError,
    UnsafeCheckpointError,
    check_state_dict_fits,
    checkpoint_path_of_traceback,
    describe_load_error,
    read_checkpoint,
    state_dict_of,
)

__all__ = ['MIN_MATCHED_FRACTION', 'MISSING_HINT', 'NOT_A_CHECKPOINT_HINT', 'TRUNCATED_HINT', 'UNSAFE_HINT',
           'CheckpointFileError', 'UnsafeCheckpointError', 'allow_mmengine_checkpoint_globals',
           'check_state_dict_fits', 'checkpoint_path_of_traceback', 'describe_load_error', 'history_buffer_getattr',
           'mmengine_checkpoint_globals', 'read_checkpoint', 'safe_load', 'state_dict_of']
