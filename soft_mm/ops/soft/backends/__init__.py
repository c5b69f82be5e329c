"""The backends of the SOFT op's N×m products, one module each, every one declaring its devices, dtypes, limits and
run functions beside its code and registering itself with :mod:`soft_mm.ops.soft.dispatch`.

``BACKEND_MODULES`` is the one list that names them; importing this package registers them all.
"""
from . import reference, tiled, triton

BACKEND_MODULES = (reference, tiled, triton)

__all__ = ['BACKEND_MODULES']
