"""The package's layers, held by import-linter's ``layers`` contracts (``[tool.importlinter]`` in pyproject.toml) at
every level: the top-level rooms of soft_mm, and inside each package of more than one module the modules and folders
of that package (``exhaustive``: a new module must be given its layer). An import that runs up a layer, at any level,
or closes a circle fails here, as ``lint-imports`` fails in .ci/run."""
import os
import pkgutil
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.repo import ROOT

# each contract's container and whether it is exhaustive, read from its TOML table (tomllib is Python >= 3.11)
CONTRACTS = [(re.search(r'^containers = \["([\w.]+)"\]$', table, re.M).group(1),
              re.search(r'^exhaustive = true$', table, re.M) is not None)
             for table in (ROOT / 'pyproject.toml').read_text().split('[[tool.importlinter.contracts]]')[1:]]


def lint_imports(root: Path, config: Path) -> subprocess.CompletedProcess:
    command = shutil.which('lint-imports')
    if command is None:
        pytest.fail('lint-imports is missing: pip install import-linter (requirements.txt lists it)')
    # the package under test first on the path, as tests/conftest.py asserts for the suite
    env = {**os.environ, 'PYTHONPATH': str(root)}
    return subprocess.run([command, '--config', str(config), '--no-cache'], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def packages_of_several_modules() -> set[str]:
    found = set()
    for info in pkgutil.walk_packages([str(ROOT / 'soft_mm')], prefix='soft_mm.'):
        if info.ispkg:
            path = ROOT.joinpath(*info.name.split('.'))
            if len(list(pkgutil.iter_modules([str(path)]))) > 1:
                found.add(info.name)
    return found | {'soft_mm'}


def test_no_import_runs_up_a_layer_at_any_level():
    result = lint_imports(ROOT, ROOT / 'pyproject.toml')
    assert result.returncode == 0, f'an import runs up a layer:\n{result.stdout}\n{result.stderr}'
    assert f'Contracts: {len(CONTRACTS)} kept, 0 broken.' in result.stdout, result.stdout
    # every package of more than one module has its contract (engine and utils: one layer of independent modules)
    containers = {container for container, _ in CONTRACTS}
    assert packages_of_several_modules() <= containers, packages_of_several_modules() - containers
    assert all(exhaustive for container, exhaustive in CONTRACTS if container != 'soft_mm')


@pytest.mark.parametrize('module, planted', [
    ('ops/compat.py', 'from .soft import attention'),  # ops' ground floor reaching its top
    ('ops/soft/backends/triton/nystrom_kernels.py', 'from . import backend'),  # a kernel file reaching its launcher
    ('models/conv.py', 'from . import pyramid'),  # a part of the pyramid reaching it
])
def test_an_import_planted_up_a_layer_breaks_a_contract(tmp_path, module, planted):
    shutil.copytree(ROOT / 'soft_mm', tmp_path / 'soft_mm', ignore=shutil.ignore_patterns('__pycache__'))
    shutil.copy(ROOT / 'pyproject.toml', tmp_path / 'pyproject.toml')
    with open(tmp_path / 'soft_mm' / module, 'a') as file:
        file.write(f'\n{planted}  # noqa\n')
    result = lint_imports(tmp_path, tmp_path / 'pyproject.toml')
    assert result.returncode != 0 and 'BROKEN' in result.stdout, result.stdout
    assert ' kept, 0 broken.' not in result.stdout, result.stdout
