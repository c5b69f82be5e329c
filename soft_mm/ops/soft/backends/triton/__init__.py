"""The SOFT op's Triton backend, laid out as every Triton op of the package: the PyTorch math it is checked against
(``nystrom_reference.py``), the kernels (``nystrom_kernels.py``), their launch configuration (``nystrom_config.py``,
plain Python) and the launches with their custom ops and backward (``nystrom_launch.py``); beside them what is the
backend's own: its declaration to the dispatcher (``backend.py``), which calls fit a GPU (``nystrom_limits.py``) and
the shared memory each kernel asks for there (``nystrom_shared_memory.py``, generated)."""
from .backend import TRITON, unsupported_reason
from .nystrom_config import MAX_HEAD_DIM, MAX_LANDMARKS
from .nystrom_launch import triton_nystrom_middle, triton_nystrom_products

__all__ = ['MAX_HEAD_DIM', 'MAX_LANDMARKS', 'TRITON', 'triton_nystrom_middle', 'triton_nystrom_products',
           'unsupported_reason']
