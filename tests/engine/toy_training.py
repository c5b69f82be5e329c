"""A few-second mmengine training of a 5-parameter regression model, run as a script by the hook tests.

    python tests/engine/toy_training.py WORK_DIR MAX_EPOCHS [--resume] [--nan-at ITER] [--interval N]

Trains with soft_mm's AtomicCheckpointHook (``max_keep_ckpts=1``) and InvalidLossHook; 8 samples, batch 2 (4
iterations per epoch). ``--nan-at ITER`` makes the input of that (1-based, global) iteration NaN.
"""
from __future__ import annotations

import argparse

import torch
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch import nn
from torch.utils.data import Dataset

import soft_mm  # noqa: F401  (registers the hooks)

ITERS_PER_EPOCH = 4


class ToyRegression(BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor, mode: str = 'tensor'):
        out = self.linear(inputs)
        return {'loss': ((out - targets) ** 2).mean()} if mode == 'loss' else out


class ToyData(Dataset):
    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(0)
        self.inputs = torch.randn(2 * ITERS_PER_EPOCH, 4, generator=gen)
        self.targets = self.inputs.sum(1, keepdim=True)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> dict:
        return {'inputs': self.inputs[index], 'targets': self.targets[index]}


class NaNInput(Hook):
    """Replace the inputs of one training iteration by NaN (a broken image)."""

    def __init__(self, at_iter: int) -> None:
        self.at_iter = at_iter

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if runner.iter + 1 == self.at_iter:
            data_batch['inputs'].fill_(float('nan'))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument('work_dir')
    parser.add_argument('max_epochs', type=int)
    parser.add_argument('--resume', action='store_true')
    parser.add_argument('--nan-at', type=int)
    parser.add_argument('--interval', type=int, default=1)
    args = parser.parse_args()
    custom_hooks = [dict(type='InvalidLossHook')]
    if args.nan_at:
        custom_hooks.append(NaNInput(args.nan_at))
    runner = Runner(
        model=ToyRegression(), work_dir=args.work_dir,
        train_dataloader=dict(dataset=ToyData(), sampler=dict(type='DefaultSampler', shuffle=False), batch_size=2,
                              collate_fn=dict(type='default_collate'), num_workers=0),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.05)),
        train_cfg=dict(by_epoch=True, max_epochs=args.max_epochs),
        default_hooks=dict(checkpoint=dict(type='AtomicCheckpointHook', interval=args.interval, max_keep_ckpts=1),
                           logger=dict(type='LoggerHook', interval=1)),
        custom_hooks=custom_hooks, resume=args.resume, randomness=dict(seed=0), default_scope='mmengine')
    runner.train()


if __name__ == '__main__':
    main()
