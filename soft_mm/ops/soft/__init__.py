"""The SOFT op: Gaussian-kernel attention through m landmarks (Nyström), its naive reference, the Newton–Schulz
inverse, the precision policy, the dispatcher and its backends (``backends/``), and the landmark kernel's health."""
from .attention import soft_attention
from .kernel import gaussian_kernel
from .naive import naive_soft_attention
from .newton import NEWTON_OP, exact_inverse, newton_inverse, newton_inverse_macs

__all__ = ['NEWTON_OP', 'exact_inverse', 'gaussian_kernel', 'naive_soft_attention', 'newton_inverse',
           'newton_inverse_macs', 'soft_attention']
