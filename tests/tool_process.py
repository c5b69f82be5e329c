"""Run a tool of this checkout in a fresh process, as a user runs it (``tests/conftest.py`` puts the checkout first on
every child's PYTHONPATH)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from repo import ROOT


def run_tool(args: list[str], cwd: Path, timeout: float = 900, check: bool = True,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python tools/...`` (``bash`` when ``args[0]`` ends in .sh, with ``PYTHON`` set to this interpreter for the
    launch scripts' ``${PYTHON:-python}``; ``args[0]`` relative to the repository root) in ``cwd``. With ``check``
    a non-zero exit fails the test with the ends of stdout and stderr."""
    script = str(ROOT / args[0])
    command = ['bash', script, *args[1:]] if script.endswith('.sh') else [sys.executable, script, *args[1:]]
    proc = subprocess.run(command, check=False, cwd=cwd, env=dict(os.environ, PYTHON=sys.executable, **(env or {})),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f'{" ".join(args)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n'
                             f'--- stderr\n{proc.stderr[-6000:]}')
    return proc


def tool_output(args: list[str], cwd: Path, timeout: float = 900) -> str:
    """:func:`run_tool` that must succeed; its stdout and stderr together."""
    proc = run_tool(args, cwd, timeout)
    return proc.stdout + proc.stderr


def logged_metrics(output: str) -> dict[str, float]:
    """The last value of every ``coco/...`` metric printed by mmengine's logger."""
    return {key: float(value) for key, value in re.findall(r'(coco/\w+): (-?[\d.]+)', output)}


# What a lent GPU machine lacks: it has torch, triton, timm, rich and pytest, and no mm* package and no OpenCV
BARE_GPU_MACHINE_LACKS = ('mmengine', 'mmcv', 'mmdet', 'mmseg', 'mmpretrain', 'cv2')

_BLOCKER = '''"""Makes importing {blocked} fail as if they were not installed (written by tests/tool_process.py)."""
import sys

BLOCKED = {blocked!r}


class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition('.')[0] in BLOCKED:
            raise ModuleNotFoundError(f'No module named {{name!r}} (blocked by the test)', name=name)
        return None


sys.meta_path.insert(0, _Blocker())
'''


def blocked_imports_env(folder: Path, blocked: tuple[str, ...] = BARE_GPU_MACHINE_LACKS) -> dict[str, str]:
    """An environment for a child process in which importing any of ``blocked`` (and their submodules) fails with
    ``ModuleNotFoundError``, as where they are not installed: a ``sitecustomize`` written to ``folder``, which becomes
    the whole ``PYTHONPATH`` (so this checkout is not on it either)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / 'sitecustomize.py').write_text(_BLOCKER.format(blocked=tuple(blocked)))
    return dict(os.environ, PYTHONPATH=str(folder))
