"""soft_mm.moved: every old import path of a moved module still imports, warns once with the new path, and gives the
new module object itself (or, for a split module, all of its names); every public name an old path had imports from it
(tests/moved_names.txt, the names frozen from git history), a name that left its module with a warning naming its new
home; nothing else is intercepted."""
from __future__ import annotations

import importlib
import sys
import warnings

import pytest
from helpers.repo import ROOT
from helpers.tool_process import TORCH_ONLY, run_code

import soft_mm
from soft_mm.moved import LEFT, MOVED, REMOVED_IN, SPLIT, MovedModuleFinder, new_path


def fresh_import(name: str):
    """Import ``name`` again, the old path forgotten (the new module stays loaded)."""
    sys.modules.pop(name, None)
    return importlib.import_module(name)


@pytest.mark.parametrize('old', sorted(MOVED))
def test_an_old_path_is_the_new_module_with_a_future_warning(old):
    new = new_path(old)
    told = rf'{old} moved to {new}: import it from there \(the old path will be removed in soft_mm {REMOVED_IN}\)'
    with pytest.warns(FutureWarning, match=told):
        module = fresh_import(old)
    assert module is importlib.import_module(new)
    parent, _, leaf = old.rpartition('.')
    assert getattr(sys.modules[parent], leaf) is module  # `from soft_mm.x import old_leaf` works too


def test_a_moved_package_moves_its_submodules():
    with pytest.warns(FutureWarning, match='soft_mm.ops.layers.gelu moved to soft_mm.ops.functional.gelu'):
        gelu = fresh_import('soft_mm.ops.layers.gelu')
    from soft_mm.ops.functional import gelu as new_gelu
    assert gelu is new_gelu  # one module: its globals (and any patch a benchmark applies) are shared
    assert new_path('soft_mm.ops.layers.sdpa') == 'soft_mm.ops.functional.sdpa'
    assert new_path('soft_mm.ops.layersx') is None and new_path('soft_mm.ops.functional') is None


def test_a_path_that_moved_twice_leads_to_the_newest():
    assert new_path('soft_mm.models.official_checkpoint') == 'soft_mm.models.checkpoint_conversion'
    assert new_path('soft_mm.ops.health') == new_path('soft_mm.ops.soft.health') == 'soft_mm.ops.soft.kernel_health'


@pytest.mark.parametrize('old', sorted(SPLIT))
def test_a_split_module_holds_the_public_names_of_its_parts(old):
    with pytest.warns(FutureWarning, match=f'{old} moved to '):
        module = fresh_import(old)
    for part in SPLIT[old]:
        source = importlib.import_module(part)
        for name in getattr(source, '__all__', [n for n in vars(source) if not n.startswith('_')]):
            assert getattr(module, name) is getattr(source, name), (part, name)
    if old == 'soft_mm.ops.triton_nystrom':  # the Triton backend's declaration and its launches
        from soft_mm.ops.soft.backends.triton.backend import TRITON
        from soft_mm.ops.soft.backends.triton.nystrom_launch import triton_nystrom_products
        assert module.TRITON is TRITON and module.triton_nystrom_products is triton_nystrom_products
    elif old.endswith('cli') or old.endswith('tools'):
        from soft_mm.cli.errors import ConfigError, one_sentence_errors
        assert module.ConfigError is ConfigError and module.one_sentence_errors is one_sentence_errors
    else:  # the converters' public functions
        from soft_mm.models.checkpoint_conversion import build_classifier_from_checkpoint, save_converted_checkpoint
        from soft_mm.models.official.layout import convert_official_state_dict
        assert module.convert_official_state_dict is convert_official_state_dict
        assert module.build_classifier_from_checkpoint is build_classifier_from_checkpoint
        assert module.save_converted_checkpoint is save_converted_checkpoint


def frozen_names() -> dict[str, tuple[list[str], list[str]]]:
    """tests/moved_names.txt: module -> (the public names it had, those removed since: no module holds them)."""
    names = {}
    for line in (ROOT / 'tests' / 'moved_names.txt').read_text().splitlines():
        if line.strip() and not line.startswith('#'):
            module, _commit, *listed = line.split()
            names[module] = ([n for n in listed if not n.startswith('-')], [n[1:] for n in listed if n.startswith('-')])
    return names


FROZEN_NAMES = frozen_names()


def test_the_frozen_names_cover_every_old_path_and_every_module_names_left():
    assert set(MOVED) | set(SPLIT) | set(LEFT) <= set(FROZEN_NAMES)
    for module, left in LEFT.items():
        assert set(left) <= set(FROZEN_NAMES[module][0]), module


def is_old_path(module: str) -> bool:
    return module in SPLIT or new_path(module) is not None


@pytest.mark.parametrize('old', sorted(FROZEN_NAMES))
def test_every_name_an_old_path_had_imports_from_it_with_a_future_warning_naming_its_home(old):
    """``from OLD import NAME`` for every public name OLD had: the object of the module that holds it now, with a
    FutureWarning that names that module and the release that removes the old path; a module still there warns for
    the names that left it alone."""
    names, removed = FROZEN_NAMES[old]
    homes = [new_path(old)] if old in MOVED or old not in SPLIT else list(SPLIT[old])
    for name in names:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            module = fresh_import(old) if is_old_path(old) else importlib.import_module(old)
            value = getattr(module, name)
        told = [str(w.message) for w in caught if w.category is FutureWarning]
        home = LEFT.get(old, {}).get(name)
        if home is not None:  # the name left the module the old path gives
            said = f'moved to {home}.{name}: import it from there'
            assert any(f'{old}.{name}' in m and said in m for m in told), told
            assert value is getattr(importlib.import_module(home), name), (old, name)
        elif is_old_path(old):
            assert told and told[0].startswith(f'{old} moved to {" and ".join(homes)}: import it from there'), told
            assert any(getattr(importlib.import_module(h), name, None) is value for h in homes if h), (old, name)
        else:  # a module still there holds the name itself
            assert not told, told
            assert value is vars(module)[name]
        assert all(f'will be removed in soft_mm {REMOVED_IN})' in m for m in told), told
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', FutureWarning)
        module = importlib.import_module(old)
        assert not [name for name in removed if hasattr(module, name)], 'a removed name is back: list it as moved'


def _prints_ok(code: str, preload: tuple[str, ...] = ()) -> None:
    """Runs ``code`` in an interpreter where nothing of soft_mm was imported (forked from one that imported
    ``preload``, :func:`helpers.tool_process.run_code`): it must exit 0 having printed ``ok`` alone."""
    proc = run_code(code, preload)
    assert proc.returncode == 0 and proc.stdout.split() == ['ok'], proc.stdout + proc.stderr


def test_a_module_names_left_keeps_its_own_loader_and_answers_them_after_a_reload():
    code = ('import importlib, warnings, soft_mm.models.pyramid as pyramid\n'
            'loader = type(pyramid.__spec__.loader).__name__\n'
            'assert pyramid.__loader__ is pyramid.__spec__.loader and loader == "SourceFileLoader", loader\n'
            'assert importlib.reload(pyramid) is pyramid and pyramid.__spec__.loader is pyramid.__loader__\n'
            'from soft_mm.models.conv import like_input\n'
            'with warnings.catch_warnings(record=True) as caught:\n'
            '    warnings.simplefilter("always")\n'
            '    from soft_mm.models.pyramid import like_input as old\n'
            'assert old is like_input and "pyramid.like_input moved to" in str(caught[0].message), caught\n'
            'print("ok")\n')
    _prints_ok(code)


def test_only_old_paths_are_answered_and_the_finder_is_installed_once():
    finder = MovedModuleFinder()
    assert finder.find_spec('soft_mm.ops.functional.gelu') is None
    assert finder.find_spec('torch') is None
    assert finder.find_spec('soft_mm.models.health').name == 'soft_mm.models.health'
    spec = finder.find_spec('soft_mm.models.pyramid', soft_mm.models.__path__)  # a module still there, names left it
    assert spec.origin.endswith('pyramid.py') and type(spec.loader).__name__ == '_LeftNamesLoader'
    soft_mm.moved.install()
    assert sum(isinstance(f, MovedModuleFinder) for f in sys.meta_path) == 1


def test_the_new_paths_import_without_a_warning():
    code = ('import warnings; warnings.simplefilter("error")\n'
            'import importlib, soft_mm.moved as m\n'
            'news = {m.new_path(old) for old in m.MOVED} | {p for parts in m.SPLIT.values() for p in parts}\n'
            'for name in sorted(news):\n'
            '    importlib.import_module(name)\n'
            'print("ok")\n')
    _prints_ok(code)


# the old paths whose modules needed torch alone (the op layer) still import without timm or any mm* package
_FRAMEWORKS = ('timm', 'mmengine', 'mmcv', 'mmdet', 'mmseg', 'mmpretrain')
_FRESH = """
import importlib, importlib.abc, sys, warnings
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if {torch_only} and name.split('.')[0] in {frameworks!r}:
            raise ModuleNotFoundError(f'No module named {{name!r}}', name=name)
sys.meta_path.insert(0, Missing())
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    module = importlib.import_module({old!r})
told = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
assert told and told[0].startswith({old!r} + ' moved to '), told
new = importlib.import_module({new!r})
assert module is new, (module, new)
assert new.__spec__.name == new.__name__ == {new!r}, new.__spec__
if {torch_only}:  # (an op-layer module reloads as the kernel modules do; a model module would register twice)
    assert importlib.reload(new) is new and new.__name__ == {new!r}
assert not {torch_only} or not [name for name in sys.modules if name.split('.')[0] in {frameworks!r}]
print('ok')
"""


@pytest.mark.parametrize('old', sorted(MOVED))
def test_each_old_path_in_a_fresh_interpreter_keeps_the_new_module_its_own(old):
    """In an interpreter that has imported nothing of soft_mm the old path warns, gives the new module, and leaves it
    its own import attributes (a reload after an old-path import reloads the new module under its own name; the
    interpreted Triton kernels are reloaded this way when TRITON_INTERPRET changes); an old op-layer path imports with
    torch alone (in a process that has imported torch and numpy only)."""
    new = new_path(old)
    torch_only = old.startswith('soft_mm.ops.') and new.startswith('soft_mm.ops.')
    code = _FRESH.format(old=old, new=new, torch_only=torch_only, frameworks=_FRAMEWORKS)
    _prints_ok(code, TORCH_ONLY if torch_only else ())
