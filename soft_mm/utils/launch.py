"""Runtime adjustments shared by tools/train.py and tools/test.py: CPU training, CPU distributed runs, ``--amp``.

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

LAUNCHERS = ('none', 'pytorch', 'slurm', 'mpi')


def enable_amp(cfg: Config) -> None:
    """Switch ``cfg.optim_wrapper`` to float16 mixed precision (mmengine's ``AmpOptimWrapper``, dynamic loss scale).

    Without a GPU this stops with one sentence: mmcv's CPU kernels (nms, RoIAlign) have no bfloat16 versions, so CPU
    autocast breaks two-stage detectors in the middle of training.
    """
    if not torch.cuda.is_available():
        raise SystemExit('--amp needs a GPU: mmcv\'s CPU ops (nms, RoIAlign) have no float16/bfloat16 kernels; '
                         'train on CPU without --amp.')
    if cfg.optim_wrapper.get('type', 'OptimWrapper') not in ('OptimWrapper', 'AmpOptimWrapper'):
        raise ValueError(f'--amp works with OptimWrapper configs, but optim_wrapper.type is '
                         f'{cfg.optim_wrapper.type!r}; set mixed precision in the config instead')
    cfg.optim_wrapper.type = 'AmpOptimWrapper'
    cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')


def _replace_sync_bn(node) -> None:
    """Turn every ``type='SyncBN'`` in a config tree into ``'BN'`` in place."""
    if isinstance(node, dict):
        if node.get('type') == 'SyncBN':
            node['type'] = 'BN'
        for value in node.values():
            _replace_sync_bn(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _replace_sync_bn(value)


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
        timeout = dist_cfg.get('timeout')
        torch_dist.init_process_group(backend='gloo', init_method='env://',
                                      timeout=timedelta(seconds=timeout) if timeout else None)
