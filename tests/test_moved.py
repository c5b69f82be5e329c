"""soft_mm.moved: every old import path of a moved module still imports, warns once with the new path, and gives the
new module object itself (or, for a split module, all of its names); nothing else is intercepted."""
from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import soft_mm
from soft_mm.moved import MOVED, SPLIT, MovedModuleFinder, new_path


def fresh_import(name: str):
    """Import ``name`` again, the old path forgotten (the new module stays loaded)."""
    sys.modules.pop(name, None)
    return importlib.import_module(name)


@pytest.mark.parametrize('old', sorted(MOVED))
def test_an_old_path_is_the_new_module_with_a_future_warning(old):
    new = MOVED[old]
    with pytest.warns(FutureWarning, match=rf'{old} moved to {new}: import it from there'):
        module = fresh_import(old)
    assert module is importlib.import_module(new)
    parent, _, leaf = old.rpartition('.')
    assert getattr(sys.modules[parent], leaf) is module  # `from soft_mm.x import old_leaf` works too


def test_a_moved_package_moves_its_submodules():
    with pytest.warns(FutureWarning, match='soft_mm.ops.layers.gelu moved to soft_mm.ops.functional.gelu'):
        gelu = fresh_import('soft_mm.ops.layers.gelu')
    from soft_mm.ops.functional import gelu as new_gelu
    assert gelu is new_gelu  # one module: its globals (and any patch a benchmark applies) are shared
    assert new_path('soft_mm.ops.layers.add_norm_kernels') == 'soft_mm.ops.functional.add_norm_kernels'
    assert new_path('soft_mm.ops.layersx') is None and new_path('soft_mm.ops.functional') is None


@pytest.mark.parametrize('old', sorted(SPLIT))
def test_a_split_module_holds_the_public_names_of_its_parts(old):
    with pytest.warns(FutureWarning, match=f'{old} moved to '):
        module = fresh_import(old)
    for part in SPLIT[old]:
        source = importlib.import_module(part)
        for name in getattr(source, '__all__', [n for n in vars(source) if not n.startswith('_')]):
            assert getattr(module, name) is getattr(source, name), (part, name)
    from soft_mm.cli.errors import ConfigError, one_sentence_errors
    assert module.ConfigError is ConfigError and module.one_sentence_errors is one_sentence_errors


def test_only_old_paths_are_answered_and_the_finder_is_installed_once():
    finder = MovedModuleFinder()
    assert finder.find_spec('soft_mm.ops.functional.gelu') is None
    assert finder.find_spec('torch') is None
    assert finder.find_spec('soft_mm.models.health').name == 'soft_mm.models.health'
    soft_mm.moved.install()
    assert sum(isinstance(f, MovedModuleFinder) for f in sys.meta_path) == 1


def test_the_new_paths_import_without_a_warning():
    code = ('import warnings; warnings.simplefilter("error")\n'
            'import importlib, soft_mm.moved as m\n'
            'for name in sorted(set(m.MOVED.values()) | {p for parts in m.SPLIT.values() for p in parts}):\n'
            '    importlib.import_module(name)\n'
            'print("ok")\n')
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0 and proc.stdout.split() == ['ok'], proc.stdout + proc.stderr
