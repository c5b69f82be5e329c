"""The package's layers, held by import-linter's ``layers`` contract (``[tool.importlinter]`` in pyproject.toml):
each layer of soft_mm imports only the ones below it, so an import that runs up a layer (or closes a circle between
layers) fails here, as ``lint-imports`` fails in .ci/run."""
import os
import shutil
import subprocess

import pytest
from helpers.repo import ROOT


def test_no_import_runs_up_a_layer():
    command = shutil.which('lint-imports')
    if command is None:
        pytest.fail('lint-imports is missing: pip install import-linter (requirements.txt lists it)')
    # the checkout under test first on the path, as tests/conftest.py asserts for the suite
    env = {**os.environ, 'PYTHONPATH': str(ROOT)}
    result = subprocess.run([command, '--config', str(ROOT / 'pyproject.toml')], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, f'an import runs up a layer:\n{result.stdout}\n{result.stderr}'
    assert 'Contracts: 1 kept, 0 broken.' in result.stdout, result.stdout
