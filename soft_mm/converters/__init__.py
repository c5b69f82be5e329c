"""Checkpoint converters: the SOFT authors' ImageNet weights -> soft_mm's classifier/backbone layout."""
from .official import (
                       AUTHORS_SETTINGS,
                       backbone_state_dict,
                       build_classifier_from_checkpoint,
                       convert_official_state_dict,
                       describe_arch,
                       infer_arch,
                       load_converted_checkpoint,
                       load_official_checkpoint,
                       make_meta,
                       map_official_key,
                       match_arch,
                       model_kwargs_from_meta,
                       num_classes_of,
                       save_converted_checkpoint,
                       select_state_dict,
                       verify_converted,
)

__all__ = ['AUTHORS_SETTINGS', 'backbone_state_dict', 'build_classifier_from_checkpoint', 'convert_official_state_dict',
           'describe_arch', 'infer_arch', 'load_converted_checkpoint', 'load_official_checkpoint', 'make_meta',
           'map_official_key', 'match_arch', 'model_kwargs_from_meta', 'num_classes_of', 'save_converted_checkpoint',
           'select_state_dict', 'verify_converted']
