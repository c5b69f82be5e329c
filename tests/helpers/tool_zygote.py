"""A process that imports the third-party stack once and forks one child per tool run (tests/helpers/tool_process.py
starts one per test process).

A tool's process spends about 6 s of this project's 2-core machine importing torch, torchvision, mmengine, mmcv, mmdet,
mmseg and mmpretrain before it does anything (``tools/train.py`` stopping at a missing dataset: 8.0 s fresh, 1.5 s
forked from here), and the test suite starts dozens of them. Here those imports happen once, and each
run is a fork that executes the tool as ``python TOOL ARGS`` would: ``sys.argv``, ``sys.path[0]``, the working folder
and the environment set, stdin from /dev/null, stdout and stderr to files, the script run as ``__main__``
(:func:`runpy.run_path`), then the interpreter's own exit: non-daemon threads joined, ``atexit`` handlers run, the
exit status of an uncaught ``SystemExit`` (its message on stderr) or exception (its traceback, status 1).

Nothing of soft_mm is imported before the fork: each run imports the package and the tool's own modules itself, as a
fresh process does. What a run inherits is the third-party modules already imported, with what their import did
(the OpenMMLab registries they fill, which mmengine's registries would import on first use anyway); the tests that
are about a fresh interpreter (another ``PYTHONPATH``, blocked imports, an installed wheel, a killed process) start
real processes.

``python tool_zygote.py MODULE ...`` imports those modules instead of :data:`PRELOAD` (``numpy torch``: a process for
the tests that check what an import of soft_mm alone pulls in, where the OpenMMLab stack must not be loaded).

Protocol, one JSON object per line: request ``{"script", "argv", "cwd", "env", "stdout", "stderr"}`` on stdin; the
reply ``{"pid": ...}`` when forked, then ``{"returncode": ...}`` (negative: killed by that signal) on stdout.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import random
import sys

PRELOAD = ('numpy', 'torch', 'torchvision', 'cv2', 'timm', 'matplotlib', 'mmengine', 'mmengine.runner', 'mmcv',
           'mmcv.ops', 'mmcv.transforms', 'mmdet.models', 'mmdet.datasets', 'mmdet.evaluation', 'mmdet.engine',
           'mmdet.visualization', 'mmseg.models', 'mmseg.datasets', 'mmseg.evaluation', 'mmseg.engine',
           'mmpretrain.models', 'mmpretrain.datasets', 'mmpretrain.evaluation', 'mmpretrain.engine',
           'pycocotools.coco')


def _run_child(request: dict, replies) -> None:
    """In the forked child: become ``python SCRIPT ARGV`` and exit with its status (never returns)."""
    import runpy
    import threading
    import traceback

    code = 1
    try:
        replies.close()
        os.chdir(request['cwd'])
        os.environ.clear()
        os.environ.update(request['env'])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the child's whole life
        for fd, path in ((1, request['stdout']), (2, request['stderr'])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        seed = int.from_bytes(os.urandom(8), 'little')  # a fresh interpreter's unseeded generators differ per run
        random.seed(seed)
        if 'numpy' in sys.modules:
            sys.modules['numpy'].random.seed(seed % 2**32)
        script = request['script']
        sys.argv = [script, *request['argv']]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        try:
            runpy.run_path(script, run_name='__main__')
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:  # the interpreter hands any uncaught exception to sys.excepthook and exits 1
            sys.excepthook(*sys.exc_info())
            code = 1
        threading._shutdown()  # as the interpreter does at exit: wait for non-daemon threads
        import atexit
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def main() -> None:
    replies = os.fdopen(os.dup(1), 'w')  # the protocol's own pipe: whatever the imports print goes to stderr
    os.dup2(2, 1)
    for name in sys.argv[1:] or PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    print(json.dumps({'ready': True}), file=replies, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run_child(request, replies)
        print(json.dumps({'pid': pid}), file=replies, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({'returncode': os.waitstatus_to_exitcode(status)}), file=replies, flush=True)


if __name__ == '__main__':
    main()
