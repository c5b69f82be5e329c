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

__all__ = ['MOVED', 'REMOVED_IN', 'SPLIT', 'MovedModuleFinder', 'install', 'new_path']

REMOVED_IN = '0.3.0'  # the release that removes every old path below (moved in 0.2.0 or before)

# old module path -> new module path (a package moves its submodules too; a new path that moved again is followed)
MOVED = {
    # step 2 of the house (ee742ee): ops/ grouped by concept, the tools' helpers in cli/
    'soft_mm.ops.capture': 'soft_mm.ops.graph_mode',
    'soft_mm.ops.fused': 'soft_mm.ops.functional.gelu',
    'soft_mm.ops.head_conv': 'soft_mm.ops.functional.head_conv',
    'soft_mm.ops.pooling': 'soft_mm.ops.functional.pooling',
    'soft_mm.ops.attention': 'soft_mm.ops.soft.attention',
    'soft_mm.ops.dispatch': 'soft_mm.ops.soft.dispatch',
    'soft_mm.ops.kernel': 'soft_mm.ops.soft.kernel',
    'soft_mm.ops.naive': 'soft_mm.ops.soft.naive',
    'soft_mm.ops.newton': 'soft_mm.ops.soft.newton',
    'soft_mm.ops.health': 'soft_mm.ops.soft.kernel_health',
    'soft_mm.ops.tiled': 'soft_mm.ops.soft.backends.tiled',
    'soft_mm.ops.library': 'soft_mm.ops.custom_ops',
    'soft_mm.ops.triton_config': 'soft_mm.ops.soft.backends.triton.config',
    'soft_mm.ops._triton_kernels': 'soft_mm.ops.soft.backends.triton.kernels',
    'soft_mm.utils.config_checks': 'soft_mm.cli.config_checks',
    'soft_mm.utils.launch': 'soft_mm.cli.runtime',
    # step 3 (e8eb865): names that say what a file holds
    'soft_mm.ops.layers': 'soft_mm.ops.functional',
    'soft_mm.ops.soft.policy': 'soft_mm.ops.precision.soft_policy',
    'soft_mm.ops.soft.backends.products_op': 'soft_mm.ops.soft.products_op',
    'soft_mm.ops.soft.health': 'soft_mm.ops.soft.kernel_health',
    'soft_mm.models.health': 'soft_mm.models.attention_health',
    'soft_mm.models.official_checkpoint': 'soft_mm.models.checkpoint_conversion',
    'soft_mm.models.official_layout': 'soft_mm.models.official.layout',
    'soft_mm.utils.checkpoint_files': 'soft_mm.utils.checkpoint.reader',
    'soft_mm.utils.cpu_bf16': 'soft_mm.engine.amp',
    'soft_mm.utils.precision_rule': 'soft_mm.ops.precision.error_rule',
    # step 4: the FlashAttention rule is the tests' (soft_mm.testing, above the library), not the op layer's
    'soft_mm.ops.precision.error_rule': 'soft_mm.testing.error_rule',
    # step 4: no arrow up inside models/ (the conversion builds the classifier, a layer above the authors' key map)
    'soft_mm.models.official.convert': 'soft_mm.models.checkpoint_conversion',
    # step 4: one folder per Triton op
    'soft_mm.ops.functional.add_norm_config': 'soft_mm.ops.functional.add_norm.add_norm_config',
    'soft_mm.ops.functional.add_norm_kernels': 'soft_mm.ops.functional.add_norm.add_norm_kernels',
    'soft_mm.ops.soft.backends.triton.config': 'soft_mm.ops.soft.backends.triton.nystrom_config',
    'soft_mm.ops.soft.backends.triton.kernels': 'soft_mm.ops.soft.backends.triton.nystrom_kernels',
    'soft_mm.ops.soft.backends.triton.shared_memory': 'soft_mm.ops.soft.backends.triton.nystrom_shared_memory',
    'soft_mm.ops.soft.backends.triton.targets': 'soft_mm.ops.soft.backends.triton.nystrom_limits',
}
# old module path -> the modules its names went to
_CLI_PARTS = ('soft_mm.cli.arguments', 'soft_mm.cli.config_checks', 'soft_mm.cli.config_loading', 'soft_mm.cli.errors',
              'soft_mm.cli.runner')
_CONVERTER_PARTS = ('soft_mm.models.checkpoint_conversion', 'soft_mm.models.official.layout')
SPLIT = {
    'soft_mm.cli.tools': _CLI_PARTS,
    'soft_mm.engine.cli': _CLI_PARTS,
    'soft_mm.converters': _CONVERTER_PARTS,
    'soft_mm.converters.official': _CONVERTER_PARTS,
    'soft_mm.ops.triton_nystrom': ('soft_mm.ops.soft.backends.triton.backend',
                                   'soft_mm.ops.soft.backends.triton.nystrom_launch'),
}


def new_path(name: str) -> str | None:
    """The new path of module ``name`` (a moved module, or a submodule of a moved package, followed through every later
    move), None if it did not move."""
    moved = None
    for _ in range(len(MOVED)):
        for old, new in MOVED.items():
            if name == old or name.startswith(old + '.'):
                name = moved = new + name[len(old):]
                break
        else:
            return moved
    return moved


def _warn(old: str, new: str) -> None:
    warnings.warn(f'{old} moved to {new}: import it from there (the old path will be removed in soft_mm {REMOVED_IN})',
                  FutureWarning, stacklevel=3)


class _MovedLoader(importlib.abc.Loader):
    """Loads an old path: the new module itself, whose own import attributes (``__spec__``, ``__loader__``) importlib
    overwrites with the old path's while it loads it and :meth:`exec_module` puts back, so that the module stays what
    it is (``importlib.reload`` of it reloads its own file under its own name)."""

    def __init__(self) -> None:
        self.kept: dict[str, object] = {}

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        old = spec.name
        if old in SPLIT:
            _warn(old, ' and '.join(SPLIT[old]))
            module = types.ModuleType(old, f'Moved: the names of {old} are in {", ".join(SPLIT[old])}.')
            if any(name.startswith(old + '.') for name in SPLIT):  # an old package whose old submodules split too
                module.__path__ = []
            for source in SPLIT[old]:
                names = vars(importlib.import_module(source))
                module.__dict__.update({key: value for key, value in names.items() if not key.startswith('__')})
            return module
        new = new_path(old)
        _warn(old, new)
        module = importlib.import_module(new)  # the new module itself: one module, one set of globals
        self.kept = {name: getattr(module, name) for name in _IMPORT_ATTRIBUTES if hasattr(module, name)}
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        for name, value in self.kept.items():
            setattr(module, name, value)


# what importlib sets on a module it loads from a spec (module_from_spec)
_IMPORT_ATTRIBUTES = ('__spec__', '__loader__', '__package__', '__path__', '__file__', '__cached__', '__name__')


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
