"""The SOFT op: Gaussian-kernel attention through m landmarks (Nyström), its naive reference, the Newton–Schulz
inverse, the dispatcher, the custom-op pair of the products and the backends (``backends/``). Its precision policy is
:mod:`soft_mm.ops.precision.soft_policy`; the landmark kernel's health, :mod:`soft_mm.models.attention_health`."""
from .attention import soft_attention
from .kernel import gaussian_kernel
from .naive import naive_soft_attention
from .newton import NEWTON_OP, exact_inverse, newton_inverse, newton_inverse_macs

__all__ = ['NEWTON_OP', 'exact_inverse', 'gaussian_kernel', 'naive_soft_attention', 'newton_inverse',
           'newton_inverse_macs', 'soft_attention']
