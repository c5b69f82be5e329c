"""A bfloat16 training step of a tiny SOFT backbone on the GPU route (CPU tensors, the Triton kernels in triton's
interpreter), in the test's own process or as one rank of a 2-process gloo DDP group
(tests/models/test_ddp_training.py).

The ranks are started by ``torch.multiprocessing.spawn``, which imports this module in each fresh process to find
:func:`run_rank`: the module sees to ``TRITON_INTERPRET`` before anything imports triton.

Everything a rank needs to give the gradients of the whole batch is fixed here: the model (seeded, every BatchNorm in
eval mode, no stochastic depth), the batch and the loss (a per-sample mean), so that DDP's average of the two halves'
gradients is the gradient of the whole batch.
"""
from __future__ import annotations

import os

# a rank inherits the test's TRITON_INTERPRET=1; a process started without it interprets the kernels too (triton
# reads the variable at its first import, below)
os.environ.setdefault('TRITON_INTERPRET', '1')

import datetime
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from soft_mm.models import SOFT, weight_cast
from soft_mm.ops.triton_route import interpreted_triton_route

# four stages, two blocks in stage 2 (as tests/models/test_weight_cast.py): every kind of layer, small enough for the
# interpreter
# 3x3 value convs: their fused kernel's taps are a loop the interpreter runs tap by tap (9x9: 9 times the time)
ARCH = {'embed_dims': [16, 32, 48, 64], 'num_heads': [1, 2, 3, 4], 'depths': [1, 2, 1, 1], 'v_conv_kernels': [3, 3, 3]}
BATCH, IMAGE = 4, (64, 64)
WORLD_SIZE = 2
# DDP's bucket size, MiB: the model holds 1.1 MB of float32 parameters, so DDP's defaults (a first bucket of 1 MiB,
# then 25 MiB) would make two buckets, the first one holding nearly everything; 0.1 MiB makes several, as a full-size
# model has with the defaults, so that the test sees which of them go out during the backward
BUCKET_CAP_MB = 0.1
# a rank that waits this long for the other one (dead, or stuck) gives up, so that the test ends
PROCESS_GROUP_TIMEOUT = datetime.timedelta(seconds=120)


def build_model() -> SOFT:
    """The same model in every process (seeded): each BatchNorm in eval mode (a half batch's statistics are not the
    whole batch's), no stochastic depth (its masks would differ between a rank's half and the whole batch)."""
    torch.manual_seed(0)
    return SOFT(ARCH, soft_norm=True, drop_path_rate=0.0, norm_eval=True).train()


def whole_batch() -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``(images (BATCH, 3, *IMAGE), projections)``: one random ``(C, H, W)`` projection per stage map."""
    gen = torch.Generator().manual_seed(1)
    images = torch.randn(BATCH, 3, *IMAGE, generator=gen)
    channels = ARCH['embed_dims']
    projections = [torch.randn(c, IMAGE[0] // 2 ** (i + 2), IMAGE[1] // 2 ** (i + 2), generator=gen)
                   for i, c in enumerate(channels)]
    return images, projections


def per_sample_mean_loss(maps: tuple[torch.Tensor, ...], projections: list[torch.Tensor]) -> torch.Tensor:
    """The mean over the samples of each map's projection onto a fixed random tensor (not the maps' plain sum: the last
    one is a LayerNorm's output, whose plain sum has no gradient), in float32."""
    return sum((m.float() * p).flatten(1).sum(1).mean() for m, p in zip(maps, projections))


def train_step(model: torch.nn.Module, images: torch.Tensor, projections: list[torch.Tensor]) -> float:
    """Forward under bfloat16 autocast (the GPU route casts the weights once per stage only there) and backward, both
    on the GPU route; returns the loss."""
    with interpreted_triton_route():
        with torch.autocast('cpu', dtype=torch.bfloat16):
            maps = model(images)
        loss = per_sample_mean_loss(maps, projections)
        loss.backward()
    return loss.item()


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    return {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}


def run_rank(rank: int, init_file: str, out_dir: str) -> None:
    """Rank ``rank`` of :data:`WORLD_SIZE`: two DDP training steps (no optimizer step between them: the same gradients)
    on its half of :func:`whole_batch`; writes ``rank{rank}.pt`` to ``out_dir``: its loss, every parameter's gradient
    after DDP's average in each step, how many tensors each weight cast of the forwards held, and of the second step
    the order in which the backward reached what the test watches (:func:`watched_backward`) and sent each of DDP's
    buckets, and the parameter names of each bucket.

    Two steps because DDP sends all gradients in one bucket at the end of the first backward (without
    ``find_unused_parameters`` it does not yet know the order in which they become ready) and from the second on in
    buckets rebuilt in that order, as soon as each is ready."""
    torch.set_num_threads(1)  # two ranks on the two cores
    dist.init_process_group('gloo', init_method=f'file://{init_file}', rank=rank, world_size=WORLD_SIZE,
                            timeout=PROCESS_GROUP_TIMEOUT)
    try:
        model = build_model()
        ddp = DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB, find_unused_parameters=False)
        names = {id(p): name for name, p in model.named_parameters()}
        events, buckets = watched_backward(model), {}

        def sent(process_group, bucket):
            # the averaging DDP does without a hook (allreduce_hook is its Python form), recorded as each bucket
            # goes out: the reducer calls it as soon as every gradient of the bucket is ready
            events.append(f'bucket {bucket.index()}')
            buckets[bucket.index()] = [names[id(p)] for p in bucket.parameters()]
            return allreduce_hook(process_group, bucket)

        ddp.register_comm_hook(None, sent)
        casts = count_weight_casts()
        images, projections = whole_batch()
        half = images[rank * BATCH // WORLD_SIZE:(rank + 1) * BATCH // WORLD_SIZE]
        loss = train_step(ddp, half, projections)
        first_grads = gradients(model)
        model.zero_grad(set_to_none=True)
        events.clear()
        buckets.clear()
        train_step(ddp, half, projections)
        torch.save(dict(loss=loss, first_grads=first_grads, grads=gradients(model), casts=casts, events=events,
                        buckets=buckets), Path(out_dir) / f'rank{rank}.pt')
    finally:
        dist.destroy_process_group()


def watched_backward(model: SOFT) -> list[str]:
    """A list that gets, in the backward's order, ``'stage 4 weight'`` when the last stage-4 parameter's gradient is
    accumulated, ``'stage 1 output'`` when the backward reaches stage 1's output map and ``'stage 1 weight'`` when the
    first stage-1 parameter's gradient is accumulated."""
    events: list[str] = []
    list(model.stages[3].parameters())[-1].register_post_accumulate_grad_hook(
        lambda p: events.append('stage 4 weight'))
    next(iter(model.stages[0].parameters())).register_post_accumulate_grad_hook(
        lambda p: events.append('stage 1 weight'))

    def watch_output(module, args, out):
        out[0].register_hook(lambda grad: events.append('stage 1 output'))

    model.stages[0].register_forward_hook(watch_output)
    return events


def count_weight_casts() -> list[int]:
    """A list that gets the number of tensors of each of the GPU route's weight casts (one per stage and forward)."""
    calls, cast = [], weight_cast.FlatCastPlan.__call__

    def counted(plan, tensors, dtype):
        calls.append(len(tensors))
        return cast(plan, tensors, dtype)

    weight_cast.FlatCastPlan.__call__ = counted  # (a rank's own process: nothing to restore)
    return calls
