"""Training hooks: crash-safe checkpoints, a stop at the first invalid loss, and the SOFT layers' attention health.

All are registered in mmengine's root ``HOOKS`` registry, so mmdet, mmseg and mmpretrain configs name them without a
scope once ``soft_mm`` is imported (``custom_imports=dict(imports=['soft_mm'])``)::

    default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook', interval=1, max_keep_ckpts=3))
    custom_hooks = [dict(type='InvalidLossHook'), dict(type='AttentionHealthHook', interval=50)]

They import with mmengine alone (``import soft_mm`` without timm registers them too); ``AttentionHealthHook`` reads
the model's SOFT layers through :mod:`soft_mm.models.attention_health` (timm) when training starts.
"""
from __future__ import annotations

import glob
import math
import os
import os.path as osp

import torch
from mmengine.dist import is_main_process
from mmengine.fileio import LocalBackend
from mmengine.hooks import CheckpointHook, Hook
from mmengine.registry import HOOKS

from ..ops.soft.kernel_health import DEFAULT_MAX_ITERS, DEFAULT_TARGET_RESIDUAL
from ..utils.atomic import PARTIAL_SUFFIX, atomic_write_text, partial_path, publish
from ..utils.checks import is_int


@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """mmengine's ``CheckpointHook`` (same arguments) with crash-safe writes on a local file system.

    mmengine 0.10.7 deletes the oldest checkpoint beyond ``max_keep_ckpts`` first, then writes ``epoch_N.pth`` in
    place, then ``last_checkpoint``: a kill during the write leaves a truncated file that ``last_checkpoint`` and
    ``--resume`` may point to, and nothing to go back to. Here every checkpoint is written to a hidden
    ``.<name>.<random>.partial`` file in the same folder, flushed and renamed into place; ``last_checkpoint`` is
    replaced the same way afterwards; and the old checkpoints are deleted last. Whenever the process dies,
    ``last_checkpoint`` names a complete file. Temporary files of killed runs are removed when training starts.
    Remote back-ends (``out_dir='s3://...'``) keep mmengine's behaviour; object stores publish an upload only once it
    is complete. ``save_best`` checkpoints are written by mmengine's own code.
    """

    def before_train(self, runner) -> None:
        super().before_train(runner)
        if self._is_local() and is_main_process():
            for stale in glob.glob(osp.join(glob.escape(self.out_dir), f'.*{PARTIAL_SUFFIX}')):
                runner.logger.warning(f'removing {stale}, the unfinished checkpoint of an earlier run')
                os.remove(stale)

    def _is_local(self) -> bool:
        return isinstance(getattr(self, 'file_backend', None), LocalBackend) and self.file_client_args is None

    def _save_checkpoint_with_step(self, runner, step: int, meta: dict) -> None:
        if not self._is_local():
            super()._save_checkpoint_with_step(runner, step, meta)
            return
        outdated = None
        if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids and self.keep_ckpt_ids[-1] == step):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                outdated = self.keep_ckpt_ids.popleft()  # deleted only once the new checkpoint is complete
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info('keep_ckpt_ids', list(self.keep_ckpt_ids))

        filename = self.filename_tmpl.format(step)
        self.last_ckpt = osp.join(self.out_dir, filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)  # saved inside the checkpoint, as mmengine does
        temp = partial_path(self.last_ckpt) if is_main_process() else None
        runner.save_checkpoint(self.out_dir, osp.basename(temp) if temp else filename,
                               save_optimizer=self.save_optimizer, save_param_scheduler=self.save_param_scheduler,
                               meta=meta, by_epoch=self.by_epoch, backend_args=self.backend_args, **self.args)
        if not is_main_process():  # Runner.save_checkpoint writes on the main process only
            return
        publish(temp, self.last_ckpt)
        atomic_write_text(osp.join(runner.work_dir, 'last_checkpoint'), self.last_ckpt)
        if outdated is not None:
            old = osp.join(self.out_dir, self.filename_tmpl.format(outdated))
            if osp.isfile(old):
                os.remove(old)


class InvalidLossError(RuntimeError):
    """Training stopped at a NaN or infinite loss; ``str(error)`` is one sentence with the iteration and what to do."""


@HOOKS.register_module()
class InvalidLossHook(Hook):
    """Stop training at the first iteration whose loss (or any ``loss*`` term) is NaN or infinite.

    Works for every model built on mmengine's ``BaseModel`` (mmdet, mmseg, mmpretrain): it reads the ``log_vars``
    that ``train_step`` returns. Runs before the checkpoint hook, so no checkpoint of the broken weights is written;
    the message names the iteration, the bad terms and the last complete checkpoint to resume from.

    Args:
        interval: check every ``interval`` iterations (1: every one; the check reads one scalar per loss term).
    """

    priority = 'VERY_HIGH'

    def __init__(self, interval: int = 1) -> None:
        if not (isinstance(interval, int) and interval >= 1):
            raise ValueError(f'interval must be an int >= 1, got {interval!r}')
        self.interval = interval

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs: dict | None = None) -> None:
        if not outputs or not self.every_n_train_iters(runner, self.interval):
            return
        bad = {}
        for name, value in outputs.items():
            if 'loss' not in name:
                continue
            number = float(value.detach().float().sum()) if isinstance(value, torch.Tensor) else float(value)
            if not math.isfinite(number):
                bad[name] = number
        if not bad:
            return
        last = runner.message_hub.get_info('last_ckpt')
        if last is None and osp.isfile(osp.join(runner.work_dir, 'last_checkpoint')):
            with open(osp.join(runner.work_dir, 'last_checkpoint')) as f:
                last = f.read().strip() or None
        terms = ', '.join(f'{name}={value}' for name, value in bad.items())
        resume = (f'the last good checkpoint is {last}: resume from it with --resume {last}' if last else
                  'no checkpoint was saved before it: restart')
        raise InvalidLossError(
            f'training stopped at iteration {runner.iter + 1} (epoch {runner.epoch + 1}) because the loss is not '
            f'finite ({terms}); {resume} after lowering the learning rate, adding gradient clipping '
            '(optim_wrapper.clip_grad) or checking the data of that iteration.')


@HOOKS.register_module()
class AttentionHealthHook(Hook):
    """Every ``interval`` training iterations, the attention health of every SOFT layer on that iteration's batch.

    During the chosen iteration the landmarks the forward uses are recorded (read-only forward hooks; the training is
    unchanged), and after it the figures of :func:`soft_mm.models.attention_health.attention_health` are computed in
    float64: per layer ``attn_health/<layer>/{condition,effective_rank,residual,iters_to_target,branch_ratio,
    uniformity}`` (docs/advanced/attention_health.md says what each means) and the model-wide
    ``attn_health/max_condition``, ``max_residual`` and ``min_effective_rank``. They go to the visualizer (so to
    ``vis_data/scalars.json``, TensorBoard with ``--tensorboard``, and ``tools/analysis_tools/plot_logs.py``, which
    draws them in a panel of their own) at step = the iteration, and the table to the log. One line in a config
    enables it::

        custom_hooks = [dict(type='AttentionHealthHook', interval=50)]

    Args:
        interval: record every ``interval`` iterations (an int >= 1); the float64 figures cost a few milliseconds per
            layer.
        target_residual: the Newton residual ``iters_to_target`` asks for (> 0).
        max_iters: the most Newton–Schulz iterations tried for it (>= 1).
        log_table: also write the per-layer table to the log.
    """

    priority = 'LOW'

    def __init__(self, interval: int = 50, target_residual: float = DEFAULT_TARGET_RESIDUAL,
                 max_iters: int = DEFAULT_MAX_ITERS, log_table: bool = True) -> None:
        if not is_int(interval, 1):
            raise ValueError(f'AttentionHealthHook: interval must be an int >= 1, got {interval!r}')
        if isinstance(target_residual, bool) or not isinstance(target_residual, (int, float)) \
                or not target_residual > 0:
            raise ValueError(f'AttentionHealthHook: target_residual must be a number > 0, got {target_residual!r}')
        if not is_int(max_iters, 1):
            raise ValueError(f'AttentionHealthHook: max_iters must be an int >= 1, got {max_iters!r}')
        self.interval = interval
        self.target_residual = float(target_residual)
        self.max_iters = max_iters
        self.log_table = log_table
        self._recorder = None

    def before_train(self, runner) -> None:
        from ..models.attention_health import LandmarkRecorder

        model = getattr(runner.model, 'module', runner.model)  # (Distributed)DataParallel
        self._recorder = LandmarkRecorder(model)
        if not self._recorder.layers:
            runner.logger.warning('AttentionHealthHook: the model has no SOFT attention layer; nothing to record')

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if self._recorder is not None and self._recorder.layers and self.every_n_train_iters(runner, self.interval):
            self._recorder.attach()

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs: dict | None = None) -> None:
        if self._recorder is None or not self._recorder.attached:
            return
        from ..models.attention_health import format_health_table, health_scalars

        self._recorder.detach()
        report = self._recorder.health(self.target_residual, self.max_iters)
        self._recorder.clear()
        if not report:
            return
        step = runner.iter + 1
        runner.visualizer.add_scalars(health_scalars(report), step=step)
        if self.log_table:
            runner.logger.info(f'attention health at iteration {step}:\n{format_health_table(report)}')

    def after_train(self, runner) -> None:
        if self._recorder is not None:
            self._recorder.detach()
