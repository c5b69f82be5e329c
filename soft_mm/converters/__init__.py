"""Checkpoint converters: the SOFT authors' ImageNet weights -> soft_mm's classifier/backbone layout."""
from .official import (
    CHECKPOINT_KEYS,
    ConvertedCheckpoint,
    build_classifier_from_checkpoint,
    convert_official_checkpoint,
    convert_official_state_dict,
    load_converted_checkpoint,
    load_official_checkpoint,
    save_converted_checkpoint,
)

__all__ = ['CHECKPOINT_KEYS', 'ConvertedCheckpoint', 'build_classifier_from_checkpoint', 'convert_official_checkpoint',
           'convert_official_state_dict', 'load_converted_checkpoint', 'load_official_checkpoint',
           'save_converted_checkpoint']
