"""Runtime adjustments shared by tools/train.py and tools/test.py: CPU training, CPU distributed runs, ``--amp``
(float16 or bfloat16 on a GPU, bfloat16 on CPU).

OpenMMLab's runtime assumes CUDA in three places that matter here: the default ``dist_cfg`` backend is NCCL,
mmengine's ``init_dist`` calls ``torch.cuda.set_device`` for every launcher, and the default DDP wrapper passes
``device_ids=[LOCAL_RANK]``. :func:`adapt_config_to_device` fixes all three when no GPU is visible, so the same
configs and launch scripts run on GPUs and on CPUs (with gloo).
"""
from __future__ import annotations

import os
import subprocess
from datetime import timedelta

import torch
import torch.distributed as torch_dist
from mmengine.config import Config, ConfigDict

from ..utils.config_tree import config_dicts

LAUNCHERS = ('none', 'pytorch', 'slurm', 'mpi')


AMP_DTYPES = ('float16', 'bfloat16')


def _amp_dtype(dtype: str | None) -> str:
    """The mixed-precision dtype for this machine: float16 by default on a GPU, bfloat16 (the only choice) on CPU."""
    if dtype is not None and dtype not in AMP_DTYPES:
        raise ValueError(f'--amp-dtype must be one of {AMP_DTYPES}, got {dtype!r}')
    if torch.cuda.is_available():
        return dtype or 'float16'
    if dtype == 'float16':
        raise SystemExit('--amp-dtype float16 needs a GPU: CPU mixed precision runs in bfloat16 (leave out '
                         '--amp-dtype, or pass --amp-dtype bfloat16)')
    return 'bfloat16'


def enable_amp(cfg: Config, dtype: str | None = None) -> str:
    """Switch ``cfg.optim_wrapper`` to mixed precision; returns the dtype chosen.

    On a GPU: mmengine's ``AmpOptimWrapper`` in float16 with a dynamic loss scale (``dtype='bfloat16'``: bfloat16, no
    scale needed but harmless). Without one: soft_mm's ``CPUAmpOptimWrapper`` (bfloat16 autocast, no loss scale),
    which also lets mmcv's ``nms`` and ``roi_align`` take bfloat16 tensors (:mod:`soft_mm.engine.amp`).
    """
    amp_dtype = _amp_dtype(dtype)
    if cfg.optim_wrapper.get('type', 'OptimWrapper') not in ('OptimWrapper', 'AmpOptimWrapper', 'CPUAmpOptimWrapper'):
        raise ValueError(f'--amp works with OptimWrapper configs, but optim_wrapper.type is '
                         f'{cfg.optim_wrapper.type!r}; set mixed precision in the config instead')
    if torch.cuda.is_available():
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
        cfg.optim_wrapper.dtype = amp_dtype
    else:
        cfg.optim_wrapper.type = 'CPUAmpOptimWrapper'
        cfg.optim_wrapper.pop('loss_scale', None)
        cfg.optim_wrapper.pop('dtype', None)
    return amp_dtype


def enable_test_amp(cfg: Config, dtype: str | None = None) -> str:
    """Evaluate under mixed precision: ``test_cfg.fp16`` (and ``val_cfg.fp16``) on, i.e. mmengine's autocast in each
    step, which is float16 on a GPU (``dtype='bfloat16'``: bfloat16) and bfloat16 on CPU; returns the dtype."""
    amp_dtype = _amp_dtype(dtype)
    if not torch.cuda.is_available():
        from ..engine.amp import enable_cpu_bf16_ops
        enable_cpu_bf16_ops()
    elif amp_dtype == 'bfloat16':
        # mmengine's loops pass no dtype to autocast: make CUDA autocast's default bfloat16 for this process
        torch.set_autocast_dtype('cuda', torch.bfloat16)
    for name in ('test_cfg', 'val_cfg'):
        loop = cfg.get(name)
        if loop is not None:
            loop['fp16'] = True
    return amp_dtype


COMPILE_BACKENDS = ('inductor', 'aot_eager', 'eager')


def compile_backbone_for_inference(model: torch.nn.Module, backend: str = 'inductor') -> torch.nn.Module:
    """Compile the backbone of ``model`` (its ``backbone`` attribute, or ``model`` itself) in place with
    ``torch.compile`` for inference, and return it.

    ``nn.Module.compile`` keeps the module and its state-dict keys, so a checkpoint loaded afterwards (as the runner
    of ``tools/test.py`` loads it) lands in the compiled module. With ``'inductor'`` the weights are frozen into the
    graph (inductor's ``freezing``, passed as this module's own compile option, so inductor's global setting is left
    as it is): the graph serves only no-grad inference, and the compilation happens at the first forward, after the
    weights are loaded. It pays under bfloat16 autocast on a CPU (``benchmarks/torch_compile.py``; the runs:
    docs/benchmarks/torch_compile.md), not in float32, and every new input size compiles again, even with dynamic
    shapes: so for inputs of one size (mmseg's sliding-window crops, a fixed-size resize), not for keep-ratio detection
    inputs.
    """
    if backend not in COMPILE_BACKENDS:
        raise ValueError(f'--compile takes one of {COMPILE_BACKENDS}, got {backend!r}')
    options = {'options': {'freezing': True}} if backend == 'inductor' else {}  # inductor's config, this graph only
    module = getattr(model, 'module', model)  # a DDP-wrapped model
    backbone = getattr(module, 'backbone', module)
    backbone.compile(backend=backend, **options)
    return backbone


def compiled_graphs_note(backend: str) -> str:
    """One line for a tool's log after a compiled run: how many graphs torch.compile (dynamo) captured in this
    process. An uncompiled run captures none, so the line tells whether the compiled module really ran."""
    from torch._dynamo.utils import counters

    return f'torch.compile ({backend}): {counters["stats"]["unique_graphs"]} graph(s) captured'


def _replace_sync_bn(node) -> None:
    """Turn every ``type='SyncBN'`` in a config tree into ``'BN'`` in place."""
    for _, owner in config_dicts(node):
        if owner.get('type') == 'SyncBN':
            owner['type'] = 'BN'


def _set_dist_env_from_launcher(launcher: str) -> None:
    """Fill RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT for ``init_process_group('env://')``.

    torchrun ('pytorch') sets them itself; SLURM and Open MPI name them differently.
    """
    if launcher == 'slurm':
        nodes = os.environ['SLURM_NODELIST']
        first_host = subprocess.run(['scontrol', 'show', 'hostname', nodes], check=True, capture_output=True,
                                    text=True).stdout.split()[0]
        os.environ.setdefault('MASTER_ADDR', first_host)
        os.environ.setdefault('MASTER_PORT', '29500')
        os.environ['RANK'] = os.environ['SLURM_PROCID']
        os.environ['WORLD_SIZE'] = os.environ['SLURM_NTASKS']
        os.environ['LOCAL_RANK'] = os.environ['SLURM_LOCALID']
    elif launcher == 'mpi':
        os.environ.setdefault('MASTER_ADDR', '127.0.0.1')
        os.environ.setdefault('MASTER_PORT', '29500')
        os.environ['RANK'] = os.environ['OMPI_COMM_WORLD_RANK']
        os.environ['WORLD_SIZE'] = os.environ['OMPI_COMM_WORLD_SIZE']
        os.environ['LOCAL_RANK'] = os.environ['OMPI_COMM_WORLD_LOCAL_RANK']


def adapt_config_to_device(cfg: Config, launcher: str) -> None:
    """Make ``cfg`` run where it is launched: unchanged with CUDA; on CPU, gloo and a CPU-compatible DDP setup.

    On CPU with a distributed ``launcher`` this also initialises the gloo process group (mmengine's own
    initialisation would call ``torch.cuda.set_device``), replaces ``SyncBN`` (GPU process groups only) by ``BN``
    and builds DDP with ``device_ids=None``.
    """
    if launcher not in LAUNCHERS:
        raise ValueError(f'launcher must be one of {LAUNCHERS}, got {launcher!r}')
    cfg.launcher = launcher
    if torch.cuda.is_available():
        return
    env_cfg = cfg.setdefault('env_cfg', ConfigDict())
    dist_cfg = env_cfg.setdefault('dist_cfg', ConfigDict())
    dist_cfg.backend = 'gloo'
    if launcher == 'none':
        return
    _replace_sync_bn(cfg.get('model'))
    wrapper = cfg.get('model_wrapper_cfg') or ConfigDict(
        type='MMDistributedDataParallel', broadcast_buffers=False,
        find_unused_parameters=cfg.get('find_unused_parameters', False))
    wrapper.device_ids = None
    cfg.model_wrapper_cfg = wrapper
    if not torch_dist.is_initialized():
        _set_dist_env_from_launcher(launcher)
        timeout = dist_cfg.get('timeout')  # torch < 2.2 takes no timeout=None: the default when unset
        torch_dist.init_process_group(backend='gloo', init_method='env://',
                                      **({'timeout': timedelta(seconds=timeout)} if timeout else {}))
