"""Shared test helpers."""
from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
_TOOLS: dict[str, ModuleType] = {}


def _load_tool(name: str) -> ModuleType:
    """Import ``tools/<name>.py`` once per session under a unique module name (``tools/test.py`` would shadow the
    standard library's ``test``)."""
    if name not in _TOOLS:
        spec = importlib.util.spec_from_file_location(f'soft_mm_tools_{name}', REPO_ROOT / 'tools' / f'{name}.py')
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _TOOLS[name] = module
    return _TOOLS[name]


@pytest.fixture(scope='session')
def load_tool() -> Callable[[str], ModuleType]:
    """``load_tool('get_flops')`` -> the module of ``tools/get_flops.py``."""
    return _load_tool
