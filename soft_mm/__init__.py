"""soft_mm: SOFT (softmax-free transformers with linear complexity) for OpenMMLab detection and segmentation.

``import soft_mm`` (or ``custom_imports=dict(imports=['soft_mm'], allow_failed_imports=False)`` in a config) only
registers: the ``SOFT`` backbone for mmdet/mmseg configs, the demo datasets, the ``soft_*`` / ``soft_norm_*`` models in
timm, and the objects mmengine stores in its checkpoints for ``torch.load(weights_only=True)`` (see
:mod:`soft_mm.registry`).

It registers with the frameworks that are installed: without mmengine (a bare GPU machine with torch, triton and
timm, where ``benchmarks/device_check.py`` runs) the mmengine registrations are skipped, and without timm the models
too, so the op layer :mod:`soft_mm.ops` imports with torch alone. A framework that is installed but fails to import
(e.g. mmengine without a dependency of yapf) still raises its own error.
"""
import importlib

from . import moved
from .version import __version__

moved.install()  # the old import paths of moved modules still work, with a FutureWarning


def _installed(name: str) -> bool:
    """Whether ``name`` imports: False only when the package itself is missing (a broken install raises)."""
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name != name:
            raise
        return False
    return True


HAS_TIMM = _installed('timm')
HAS_MMENGINE = _installed('mmengine')

if HAS_TIMM:
    from . import models  # registers the soft_* timm models
    from .models import SoftVisionTransformer
if HAS_MMENGINE:
    from . import engine  # noqa: F401  (registers the checkpoint and invalid-loss hooks)
    from .registry import register_all

    register_all(models=HAS_TIMM)
    if HAS_TIMM:
        from .models import SOFT

__all__ = ['SOFT', 'SoftVisionTransformer', '__version__', 'models']


def __getattr__(name: str):
    missing = {'SOFT': 'mmengine and timm', 'SoftVisionTransformer': 'timm', 'models': 'timm'}
    if name in missing:
        raise ImportError(f'soft_mm.{name} needs {missing[name]} (pip install -r the requirements, or '
                          f'bash tools/install.sh); installed: mmengine={HAS_MMENGINE}, timm={HAS_TIMM}')
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
