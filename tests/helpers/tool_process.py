"""Run a tool of this checkout as a user runs it, ``python tools/...`` (``tests/conftest.py`` puts the checkout first on
every child's PYTHONPATH): forked from a process that has the third-party stack imported already
(``tests/helpers/tool_zygote.py``, one per test process), or in a fresh process for the launch scripts, for a run whose
environment differs from that process's in what is read at import time, and for every run with
``SOFT_MM_TEST_FRESH_PROCESSES=1``."""
from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from helpers.repo import ROOT

# environment variables read when Python, torch, triton or OpenMP start (PYTHONPATH, OMP_NUM_THREADS, ...; not the
# launch scripts' PYTHON): a run that sets them otherwise than the zygote's own environment gets a fresh process
IMPORT_TIME_PREFIXES = ('PYTHON', 'OMP_', 'MKL_', 'KMP_', 'TRITON_', 'TORCH', 'CUDA_', 'LD_')


def _read_at_import(key: str) -> bool:
    return key.startswith(IMPORT_TIME_PREFIXES) and key != 'PYTHON'


class _Zygote:
    """The client side of tests/helpers/tool_zygote.py (``preload``: the modules it imports; empty: its default
    stack): one request at a time."""

    def __init__(self, preload: tuple[str, ...] = ()) -> None:
        self.env = dict(os.environ)
        zygote = ROOT / 'tests' / 'helpers' / 'tool_zygote.py'
        self.proc = subprocess.Popen([sys.executable, str(zygote), *preload], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, cwd=ROOT, env=self.env)
        self.buffer = b''
        assert self._reply(600) == {'ready': True}

    def serves(self, env: dict[str, str]) -> bool:
        keys = {k for k in (*env, *self.env) if _read_at_import(k)}
        return self.proc.poll() is None and all(env.get(k) == self.env.get(k) for k in keys)

    def _reply(self, timeout: float | None) -> dict | None:
        """The next reply line, or None when ``timeout`` seconds pass first."""
        fd = self.proc.stdout.fileno()
        while b'\n' not in self.buffer:
            if not select.select([fd], [], [], timeout)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f'the tool zygote exited ({self.proc.wait()})')
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b'\n', 1)
        return json.loads(line)

    def run(self, command: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory() as folder:
            out, err = Path(folder, 'stdout'), Path(folder, 'stderr')
            request = {'script': command[1], 'argv': command[2:], 'cwd': str(cwd), 'env': env, 'stdout': str(out),
                       'stderr': str(err)}
            self.proc.stdin.write((json.dumps(request) + '\n').encode())
            self.proc.stdin.flush()
            pid = self._reply(60)['pid']
            done = self._reply(timeout)
            if done is None:
                os.kill(pid, signal.SIGKILL)
                self._reply(None)
                raise subprocess.TimeoutExpired(command, timeout, out.read_bytes(), err.read_bytes())
            return subprocess.CompletedProcess(command, done['returncode'], out.read_text(errors='replace'),
                                               err.read_text(errors='replace'))

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


_ZYGOTES: dict[tuple[str, ...], _Zygote] = {}


def _zygote(preload: tuple[str, ...] = ()) -> _Zygote:
    zygote = _ZYGOTES.get(preload)
    if zygote is None or zygote.proc.poll() is not None:
        import atexit

        zygote = _ZYGOTES[preload] = _Zygote(preload)
        atexit.register(zygote.close)
    return zygote


def run_process(command: list[str], cwd: Path, env: dict[str, str], timeout: float,
                preload: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``command`` (``[sys.executable, SCRIPT, *ARGS]`` or any other) in ``cwd`` with ``env``, output captured as
    text: forked from the zygote that imported ``preload`` (empty: the whole third-party stack) where it serves such
    a run, else a fresh process."""
    fresh = os.environ.get('SOFT_MM_TEST_FRESH_PROCESSES') == '1'
    if not fresh and command[0] == sys.executable and command[1].endswith('.py'):
        zygote = _zygote(preload)
        if zygote.serves(env):
            return zygote.run(command, cwd, env, timeout)
    return subprocess.run(command, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


# what a run of code that must import the OpenMMLab stack and timm itself (or not at all) may find imported
TORCH_ONLY = ('numpy', 'torch')


def run_code(code: str, preload: tuple[str, ...] = (), cwd: Path | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
    """``code`` run as a script (from a temporary file) in ``cwd`` (default: the current folder), as
    :func:`run_process` runs one: forked from the zygote that imported ``preload`` (:data:`TORCH_ONLY`: nothing of the
    OpenMMLab stack or timm), soft_mm imported by the code itself."""
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder, 'code.py')
        script.write_text(code)
        return run_process([sys.executable, str(script)], Path.cwd() if cwd is None else cwd, dict(os.environ),
                           timeout, preload)


def run_python(script: Path | str, *args: str, cwd: Path | None = None, timeout: float = 900,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python SCRIPT ARGS`` (any path) in ``cwd`` (default: the current folder) with ``os.environ`` updated by
    ``env``, as :func:`run_process` runs it; the caller checks the exit status."""
    return run_process([sys.executable, str(script), *args], Path.cwd() if cwd is None else cwd,
                       dict(os.environ, **(env or {})), timeout)


def run_tool(args: list[str], cwd: Path, timeout: float = 900, check: bool = True,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python tools/...`` (``bash`` when ``args[0]`` ends in .sh, with ``PYTHON`` set to this interpreter for the
    launch scripts' ``${PYTHON:-python}``; ``args[0]`` relative to the repository root) in ``cwd``. With ``check``
    a non-zero exit fails the test with the ends of stdout and stderr."""
    script = str(ROOT / args[0])
    command = ['bash', script, *args[1:]] if script.endswith('.sh') else [sys.executable, script, *args[1:]]
    proc = run_process(command, cwd, dict(os.environ, PYTHON=sys.executable, **(env or {})), timeout)
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

_BLOCKER = '''"""Makes importing {blocked} fail as if they were not installed (written by tests/helpers)."""
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
