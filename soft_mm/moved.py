"""Import paths that moved, and where to: an old path still imports, with a FutureWarning that names the new one.

``import soft_mm`` installs :class:`MovedModuleFinder` first in ``sys.meta_path``; it answers only for the old paths
below, so every other import is untouched. An old path gives the new module object itself (``soft_mm.ops.layers.gelu``
is ``soft_mm.ops.functional.gelu``: one module, one set of globals); a moved package moves its submodules with it. A
module whose names went to several modules (:data:`SPLIT`) gives a module that holds all of their public names.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

__all__ = ['MOVED', 'SPLIT', 'MovedModuleFinder', 'install', 'new_path']

# old module path -> new module path (a package moves its submodules too)
MOVED = {
    'soft_mm.ops.layers': 'soft_mm.ops.functional',
    'soft_mm.ops.functional.add_norm_config': 'soft_mm.ops.functional.add_norm.add_norm_config',
    'soft_mm.ops.functional.add_norm_kernels': 'soft_mm.ops.functional.add_norm.add_norm_kernels',
    'soft_mm.ops.soft.backends.triton.config': 'soft_mm.ops.soft.backends.triton.nystrom_config',
    'soft_mm.ops.soft.backends.triton.kernels': 'soft_mm.ops.soft.backends.triton.nystrom_kernels',
    'soft_mm.ops.soft.backends.triton.shared_memory': 'soft_mm.ops.soft.backends.triton.nystrom_shared_memory',
    'soft_mm.ops.soft.backends.triton.targets': 'soft_mm.ops.soft.backends.triton.nystrom_limits',
    'soft_mm.ops.soft.policy': 'soft_mm.ops.precision.soft_policy',
    'soft_mm.ops.soft.backends.products_op': 'soft_mm.ops.soft.products_op',
    'soft_mm.ops.soft.health': 'soft_mm.models.attention_health',
    'soft_mm.models.health': 'soft_mm.models.attention_health',
    'soft_mm.models.official_checkpoint': 'soft_mm.models.official.convert',
    'soft_mm.models.official_layout': 'soft_mm.models.official.layout',
    'soft_mm.utils.checkpoint_files': 'soft_mm.utils.checkpoint.reader',
    'soft_mm.utils.cpu_bf16': 'soft_mm.engine.amp',
    'soft_mm.utils.precision_rule': 'soft_mm.ops.precision.error_rule',
}
# old module path -> the modules its names went to
SPLIT = {
    'soft_mm.cli.tools': ('soft_mm.cli.arguments', 'soft_mm.cli.config_checks', 'soft_mm.cli.config_loading',
                          'soft_mm.cli.errors', 'soft_mm.cli.runner'),
}


def new_path(name: str) -> str | None:
    """The new path of module ``name`` (a moved module, or a submodule of a moved package), None if it did not move."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + '.'):
            return new + name[len(old):]
    return None


def _warn(old: str, new: str) -> None:
    warnings.warn(f'{old} moved to {new}: import it from there (the old path will be removed in a later release)',
                  FutureWarning, stacklevel=3)


class _MovedLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        old = spec.name
        if old in SPLIT:
            _warn(old, ' and '.join(SPLIT[old]))
            module = types.ModuleType(old, f'Moved: the names of {old} are in {", ".join(SPLIT[old])}.')
            for source in SPLIT[old]:
                names = vars(importlib.import_module(source))
                module.__dict__.update({key: value for key, value in names.items() if not key.startswith('__')})
            return module
        new = new_path(old)
        _warn(old, new)
        return importlib.import_module(new)  # the new module itself: its attributes are kept as they are

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of :data:`MOVED` and :data:`SPLIT` (nothing else)."""

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in SPLIT and new_path(fullname) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader())


def install() -> None:
    """Put the finder first in ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
