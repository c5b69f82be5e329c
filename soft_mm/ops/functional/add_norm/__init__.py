"""The residual add + LayerNorm in one Triton kernel, laid out as every Triton op of the package: the PyTorch form it
is checked against and runs elsewhere (``add_norm_reference.py``), the kernels (``add_norm_kernels.py``), their launch
configuration (``add_norm_config.py``, plain Python) and the launches with the ``autograd.Function`` and the public
functions (``add_norm_launch.py``)."""
from .add_norm_config import MAX_ADD_NORM_WIDTH
from .add_norm_launch import add_layer_norm, fuses_add_norm, layer_norm_gelu

__all__ = ['MAX_ADD_NORM_WIDTH', 'add_layer_norm', 'fuses_add_norm', 'layer_norm_gelu']
