"""Import paths that moved, and where to: an old path still imports, with a FutureWarning that names the new one.

``import soft_mm`` installs :class:`MovedModuleFinder` first in ``sys.meta_path``; it answers only for the old paths
below and the modules still there of :data:`LEFT` (loaded by their own loader), so every other import is untouched. An
old path gives the new module object itself (``soft_mm.ops.layers.gelu`` is ``soft_mm.ops.functional.gelu``: one module,
one set of globals); a moved package moves its submodules with it. A module whose names went to several modules
(:data:`SPLIT`) gives a module that holds all of their public names.

A name that left a module (:data:`LEFT`: an old path above whose module no longer holds it, or a module still there)
still imports from it, with a FutureWarning that names its new home: the module it resolves to answers the name
through a module ``__getattr__`` (asked only for names the module does not hold), set when the old path or the module
is imported. ``tests/moved_names.txt`` lists the public names every old path had, and ``tests/test_moved.py`` imports
each of them from its old path.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

__all__ = ['LEFT', 'MOVED', 'REMOVED_IN', 'SPLIT', 'MovedModuleFinder', 'install', 'new_path']

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

# module path (old, or still there) -> {name that left it: the module that holds it now}
_TRITON_TARGETS = dict.fromkeys(('BFLOAT16_MIN_TARGET', 'SHARED_MEMORY_PER_BLOCK', 'TARGETS', 'TARGET_GPUS',
                                 'TARGET_MIN_TRITON'), 'soft_mm.ops.triton_targets')
LEFT = {
    'soft_mm.ops.attention': {'AUTO_TILING_MIN_TOKENS': 'soft_mm.ops.soft.backends.tiled'},
    'soft_mm.ops.dispatch': {'AUTO_TILING_MIN_TOKENS': 'soft_mm.ops.soft.backends.tiled'},
    'soft_mm.ops.library': {'products_op': 'soft_mm.ops.soft.products_op'},
    'soft_mm.ops.triton_config': {'SHARED_MEMORY_PER_BLOCK': 'soft_mm.ops.triton_targets'},
    'soft_mm.ops.triton_nystrom': {'BLOCK_N': 'soft_mm.ops.soft.backends.triton.nystrom_config',
                                   'TRITON_VERSION': 'soft_mm.ops.triton_route',
                                   'triton_available': 'soft_mm.ops.triton_route'},
    'soft_mm.ops.soft.backends.triton.config': _TRITON_TARGETS,
    'soft_mm.ops.soft.backends.triton.targets': {'device_limits': 'soft_mm.ops.triton_route'},
    # modules still there
    'soft_mm.models.pyramid': dict.fromkeys(('STEM_CHANNELS', 'like_input'), 'soft_mm.models.conv'),
    'soft_mm.ops.compat': dict.fromkeys(('FunctionOp', 'custom_op', 'recorded_calls'), 'soft_mm.ops.custom_ops'),
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


def _answer_left_names(module: types.ModuleType, old: str) -> None:
    """Let ``module`` (what ``old`` gives) answer the names that left ``old`` (:data:`LEFT`), each with a
    FutureWarning, through a module ``__getattr__`` that hands other names to the module's own one."""
    left = module.__dict__.setdefault('__moved_names__', {})  # name -> (its home, the old paths it left)
    for name, home in LEFT.get(old, {}).items():
        left[name] = (home, tuple(dict.fromkeys((*left.get(name, (home, ()))[1], old))))
    own = module.__dict__.get('__getattr__')
    if getattr(own, '__moved_names__', None) is left:
        return

    def __getattr__(name: str):
        if name in left:
            home, olds = left[name]
            warnings.warn(f'{" and ".join(f"{path}.{name}" for path in olds)} moved to {home}.{name}: import it from '
                          f'there (the old path will be removed in soft_mm {REMOVED_IN})', FutureWarning, stacklevel=2)
            return getattr(importlib.import_module(home), name)
        if own is not None:
            return own(name)
        raise AttributeError(f'module {module.__name__!r} has no attribute {name!r}')

    __getattr__.__moved_names__ = left
    module.__getattr__ = __getattr__


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
            _answer_left_names(module, old)
            return module
        new = new_path(old)
        _warn(old, new)
        module = importlib.import_module(new)  # the new module itself: one module, one set of globals
        self.kept = {name: getattr(module, name) for name in _IMPORT_ATTRIBUTES if hasattr(module, name)}
        if old in LEFT:
            _answer_left_names(module, old)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        for name, value in self.kept.items():
            setattr(module, name, value)


# what importlib sets on a module it loads from a spec (module_from_spec)
_IMPORT_ATTRIBUTES = ('__spec__', '__loader__', '__package__', '__path__', '__file__', '__cached__', '__name__')


class _LeftNamesLoader(importlib.abc.Loader):
    """Loads a module still there that names left (:data:`LEFT`) with its own loader, which it puts back on the module
    and its spec before it runs it, then lets it answer those names."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__.loader = module.__loader__ = self.loader
        self.loader.exec_module(module)
        _answer_left_names(module, module.__name__)


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of :data:`MOVED` and :data:`SPLIT`, and the modules still there of :data:`LEFT` (nothing
    else): the latter found by the finders after it, loaded by their own loader."""

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if fullname in SPLIT or new_path(fullname) is not None:
            return importlib.machinery.ModuleSpec(fullname, _MovedLoader())
        if fullname not in LEFT:
            return None
        for finder in sys.meta_path:
            if isinstance(finder, MovedModuleFinder) or not hasattr(finder, 'find_spec'):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _LeftNamesLoader(spec.loader)
                return spec
        return None


def install() -> None:
    """Put the finder first in ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
