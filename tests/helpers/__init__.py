"""What the tests share (``tests/`` is on the tests' import path: ``from helpers.repo import ROOT``).

* :mod:`.repo` — where the repository's folders are;
* :mod:`.op_checks` — the op tests' inputs and float64 references; :mod:`.model_checks` — the published variants, the
  variant record and the drop-in configs; :mod:`.kernel_launches` — counting a forward's or a step's launches;
  :mod:`.compile_recording` — a ``torch.compile`` backend that records the graphs it is given;
* :mod:`.tool_process` — running ``tools/*.py`` as a user does, in a child forked from :mod:`.tool_zygote` (a script:
  one per test process); :mod:`.checkpoint_kill` — killing a training while it writes a checkpoint;
* :mod:`.demo_training` — a few training steps of a demo config through mmengine's Runner; :mod:`.ddp_step` — a
  training step of a tiny backbone on the GPU route, alone or as a rank of a 2-process DDP group.

The test files themselves are laid out like the package: ``tests/<subpackage>/`` for ``soft_mm/<subpackage>/``
(``cli``, ``datasets``, ``engine``, ``models``, ``ops``, ``utils``), ``tests/configs`` for ``configs/``,
``tests/tools`` for ``tools/``, ``tests/benchmarks`` for ``benchmarks/``, ``tests/converters`` for the authors'
checkpoints, and at the top the package's own top-level modules (imports, registry, moved paths, import layers) and
the README.
"""
