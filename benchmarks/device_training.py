"""The device check's training parts (``benchmarks/device_check.py --parts training``, then ``--parts graphs`` in a
process of its own): SOFT-Norm-Small against timm's Swin-T and ConvNeXt-T in the training step, built to give its
answer the first time a GPU is lent, within its time.

**What runs, in order of value** (``training_plan``; each case one row of the JSON, written as it comes):

1. the eager training step of the three models at batch 2 × 800×1344, then at batch 1 and at batch 2 × 1600×2688
   (the step's time, its peak memory; at the first size the kernels one step launches and their device time);
2. the host's time per Triton launch: SOFT-Norm-Small's eager step with every launch through the launch plans and
   through ``kernel[grid]`` in turn (the difference per launch), and one add + LayerNorm call's host time with each;
3. the SOFT op's forward+backward at 67k tokens in bfloat16 (Triton; part 2's inputs and timing), then each SOFT
   stage's value conv with the attention output added at the first size's maps, the fused Triton kernel against the
   layer's PyTorch form, forward+backward with its kernels' device time (``conv_case``);
4. the whole RetinaNet step at the first size, SOFT-Norm-Small and Swin-T eager, under the same neck and head
   (torchvision's ``RetinaNet``, its FPN on the stride-8..32 maps with P6/P7 from C5 as mmdet's RetinaNet has them), a
   fixed synthetic batch of boxes: forward, losses, backward, AdamW step, ``zero_grad``;
5. the training step under ``torch.compile`` (inductor, default mode) of Swin-T, then SOFT-Norm-Small, at the first
   size;
6. if time is left, ConvNeXt-T's compiled step.

Then one summary table (``summarize``) answers each target of issue 53 with its figure, the target and met / not met /
not measured; ratios are the peer's time over SOFT's in the same run:

- eager training step ≥ 1.2× Swin-T (batch 2 × 800×1344);
- compiled training step ≥ 1.2× Swin-T (the same size, each model under ``torch.compile`` the same way);
- eager training step at batch 1 × 1600×2688 ≥ 1.5× Swin-T;
- the training step's peak memory below both peers' (eager, both sizes: every pair measured and below);
- the op's forward+backward at 67k tokens ≤ 1.0 ms.

``graphs_plan`` (its own run, so that a failure or a long recording there cannot eat the table's time): SOFT-Norm-Small
with ``compile_stages`` (each stage its own graph, ``soft_mm/models/compiled.py``) trained on two sizes taken in turn,
800×1344 and 800×1216, ``dict(mode='reduce-overhead', dynamic=True)`` (CUDA graphs); the whole RetinaNet step with
SOFT's stages as CUDA graphs (``dict(mode='reduce-overhead', pad_size_divisor=...)``) beside Swin-T's eager one; then
``dict(dynamic=True)``, with ``pad_size_divisor`` where the installed pyramid accepts that key (the row records which).
Each row counts the graphs dynamo compiles (``torch._dynamo.utils.counters['stats']['unique_graphs']``, there from torch
2.0 through 2.14) and the CUDA graphs captured (every ``torch.cuda.CUDAGraph.capture_begin``, which inductor's CUDA
graph trees call for each recording on torch 2.11 as on 2.14), in a warm phase (three rounds of both sizes: compile,
CUDA graphs' warm-up and recording) and in the steady phase that follows: graphs compiled there are recompiles, captures
there are re-records (a static input at a new address, e.g. weights cast to new tensors every step). The CUDA-graph
row (built without stochastic depth) then accumulates two micro-batches at its first size's bucket and compares the
gradients with an eager copy's: the graphed ones' error against float32 at most twice the eager bfloat16 one's, and no
capture during the micro-batches.

**Every call in its own autocast region**, as a training loop enters ``torch.autocast`` per step: autocast's cache of
cast weights lives for one call, so no model reuses another call's casts (SOFT's pyramid casts its weights once per
forward either way). The backward runs outside the region.

**Within the budget by construction.** Each case carries an estimate of its seconds on an H100 or H200
(``estimate_plan``), from the sizes and the 2026-12-04 H200 runs, with an upper bound for each compile; the plan is
printed with it. A case starts only if its estimate fits the time left (else it is recorded as skipped, with both
figures); inside a case a guard (``TimeGuard``) is checked between calls, so a case stops when the part's budget runs
out and keeps what it measured (``cut_short``); a single call that runs past the budget (a compile) is interrupted by
an alarm after a short grace. So the training part ends within ``training_budget_s`` plus the grace, whatever the GPU.

Under ``--smoke`` every case runs at tiny sizes on CPU tensors (the Triton kernels in the interpreter, dynamo's
``eager`` backend for the compiled cases, no CUDA graphs on CPU). Needs torch, timm and torchvision (for the
RetinaNet rows; where it is missing those rows record why), no mm* package.
"""
from __future__ import annotations

import contextlib
import functools
import math
import signal
import statistics
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple
from unittest import mock

import torch
from harness import PeakMemory, build_backbone, device_kernels, patched, profiled_call, timed
from torch import nn

SOFT = 'soft_norm_small'
PEER = 'swin_t'  # the peer the speed targets name
BACKBONES = (SOFT, PEER, 'convnext_t')
AUTOCAST_DTYPE = torch.bfloat16

TRAINING_FULL = dict(
    training_sizes=((2, (800, 1344)), (1, (1600, 2688)), (2, (1600, 2688))),  # (batch, image): the eager rows'
    # sizes, the first also the compiled, launch and RetinaNet rows'
    stage_sizes=((2, (800, 1344)), (2, (800, 1216))),  # the compile_stages rows' two sizes, taken in turn
    pad_size_divisor=128,  # for the CUDA-graphed compile_stages row, where the pyramid accepts it
    target_tokens=66816,  # the op's target: COCO's stage 1 at 1333×800
    launch_calls=300,  # the launch row's add + LayerNorm calls timed alone with each launcher
    training_repeats=5, compile_backend='inductor',
    # seconds of each part; a case starts only where its estimate fits what is left of them (both parts, each with
    # its process's start and the grace, within 480 s)
    training_budget_s=235, graphs_budget_s=205, hard_stop_grace_s=5, gate_on_estimates=True)
TRAINING_SMOKE = dict(
    training_sizes=((1, (64, 96)), (1, (64, 128)), (2, (64, 128))), stage_sizes=((1, (64, 96)), (1, (64, 128))),
    pad_size_divisor=64,
    target_tokens=200, training_repeats=1, compile_backend='eager', launch_calls=3,
    # (the estimates are a GPU's: on CPU only the budget itself stops a case)
    training_budget_s=900, graphs_budget_s=900, hard_stop_grace_s=10, gate_on_estimates=False)

# --- the estimates (seconds on an H100 or H200)

# the eager training step at batch 2 × 800×1344 on the H200 (docs/benchmarks/runs/2026-12-04_h200_eager_launches),
# scaled by the pixels above that size (below it the steps are launch-bound: no faster), and by SLOWER_GPU for an
# H100's lower bandwidth and an unknown host
STEP_MS = {SOFT: 101.3, PEER: 50.0, 'convnext_t': 34.6}
STEP_PIXELS = 2 * 800 * 1344
SLOWER_GPU = 1.5
# a training step under inductor compiles a forward and a backward graph: SOFT's forward alone took 34.7 s on the H200
# (docs/benchmarks/runs/2026-12-04_h200_device_check), bounded here at 2.3x that for both; Swin-T and ConvNeXt-T in
# proportion to their CPU inductor forward compiles against SOFT's (0.79 and 0.27,
# docs/benchmarks/runs/2026-12-05_xeon_issue48), rounded up
COMPILE_S = {SOFT: 80.0, PEER: 63.0, 'convnext_t': 25.0}
STAGES_COMPILE_S = 100.0  # the four stages with dynamic shapes: SOFT's bound x 1.25
CACHED_COMPILE = 0.6  # the second compile_stages row: the same kernels, from the on-disk Triton cache
BUILD_S = 2.0  # build on the CPU, initialise, move to the GPU
TRITON_FIRST_S = 25.0  # SOFT's Triton kernels (the op, add + LayerNorm) compiled on first use, cold cache
TRITON_NEW_SIZE_S = 8.0  # new specialisations at another size (token counts of other divisibility)
PROFILE_S = 2.0  # one profiled step (the profiler's start included)
OP_S = 6.0  # the op's row: its kernels mostly compiled by the eager SOFT rows (the same bfloat16 tiles), ms of calls
RETINANET_EXTRA_MS = 40.0  # FPN, head, losses and AdamW on top of the backbone's step
WARMUP_CALLS = 2  # a compile, then a steady call before the timed ones
WARM_ROUNDS = 3  # compile_stages rows: compile, CUDA graphs' warm-up, recording
MICRO_BATCHES = 2  # the accumulation row's micro-batches, one backward each before the gradients are read
LAUNCH_MICRO_S = 2.0  # the launch row's add + LayerNorm calls, timed alone with each launcher


class Case(NamedTuple):
    """One row of a plan: ``kind`` ``'eager'`` / ``'compiled'`` (a backbone's training step), ``'op'`` (the SOFT op
    at ``tokens``), ``'launch'`` (the host's time per Triton launch, launch plans against ``kernel[grid]``),
    ``'retinanet'`` (the whole detector step; ``mode='graphed'``: the backbone's stages as CUDA graphs), ``'stages'``
    (``compile_stages`` on two sizes, ``mode`` ``'dynamic'`` or ``'reduce-overhead'``), ``'conv'`` (the SOFT
    stages' value convs at ``image``'s maps: the fused Triton kernel against the layer's PyTorch form)."""

    kind: str
    model: str
    batch: int = 0
    image: tuple[int, int] = (0, 0)
    mode: str = ''
    profile: bool = False
    tokens: int = 0

    @property
    def input(self) -> str:
        return f'{self.batch}x{self.image[0]}x{self.image[1]}'

    def label(self) -> str:
        if self.kind == 'op':
            return f'op fwd+bwd, {self.model}, {self.tokens:,} tokens, bfloat16'
        what = {'eager': 'eager step', 'compiled': 'compiled step', 'retinanet': 'RetinaNet step',
                'conv': 'value conv + attention output fwd+bwd, Triton against PyTorch, bfloat16',
                'launch': 'host per Triton launch, plan against kernel[grid]',
                'stages': f'compile_stages ({self.mode}), two sizes'}[self.kind]
        graphed = ' (stages as CUDA graphs)' if self.kind == 'retinanet' and self.mode == 'graphed' else ''
        return f'{what}{graphed}, {self.model}, {self.input}'

    def row(self) -> dict:
        """The fields that name the row in the JSON."""
        if self.kind == 'op':
            return dict(case='op', model=self.model, tokens=self.tokens, dtype='bfloat16')
        row = dict(case=self.kind, model=self.model, input=self.input)
        return dict(row, mode=self.mode) if self.mode else row


def training_plan(cfg: dict) -> list[Case]:
    """The training part's cases in order of value (see the module docstring)."""
    sizes = cfg['training_sizes']
    first = sizes[0]
    eager = [Case('eager', name, *size, profile=size == first) for size in sizes for name in BACKBONES]
    launch = Case('launch', SOFT, *first)
    compiled = [Case('compiled', name, *first) for name in (PEER, SOFT)]
    retinanet = [Case('retinanet', name, *first) for name in (SOFT, PEER)]
    return [*eager, launch, Case('op', 'triton', tokens=cfg['target_tokens']), Case('conv', SOFT, *first),
            *retinanet, *compiled, Case('compiled', 'convnext_t', *first)]


def graphs_plan(cfg: dict) -> list[Case]:
    """The graphs part's cases: SOFT-Norm-Small's compile_stages on two sizes as CUDA graphs, the whole RetinaNet
    step with SOFT's stages as CUDA graphs beside Swin-T's eager one, then compile_stages with dynamic shapes."""
    batch, image = cfg['stage_sizes'][0]
    first = cfg['training_sizes'][0]
    return [Case('stages', SOFT, batch, image, mode='reduce-overhead'), Case('retinanet', PEER, *first),
            Case('retinanet', SOFT, *first, mode='graphed'), Case('stages', SOFT, batch, image, mode='dynamic')]


def estimate_plan(cases: list[Case], cfg: dict) -> list[float]:
    """Seconds each case is expected to take on an H100 or H200, walking the plan in order: a model built once per
    size (later cases at that size reuse it), SOFT's Triton kernels compiled on the first SOFT case and again in part
    at a new size, each compile at its bound (``COMPILE_S``), the second compile_stages row from the kernel cache."""
    built: set[tuple[str, tuple[int, int]]] = set()
    soft_sizes: set[tuple[int, int]] = set()
    stages_seen = 0
    estimates = []
    for case in cases:
        if case.kind in ('op', 'conv'):
            estimates.append(OP_S)
            continue
        step_s = STEP_MS[case.model] / 1e3 * max(1.0, case.batch * math.prod(case.image) / STEP_PIXELS) * SLOWER_GPU
        calls = WARMUP_CALLS + cfg['training_repeats'] + 1  # the warm-up, the timed calls, the peak-memory call
        cost = 0.0
        if case.kind == 'retinanet':
            step_s += RETINANET_EXTRA_MS / 1e3 * SLOWER_GPU
            cost += BUILD_S  # the neck and head, torchvision's import, the head's first kernels
            if case.mode == 'graphed':  # the stages compiled and their CUDA graphs recorded
                cost += STAGES_COMPILE_S * (CACHED_COMPILE if stages_seen else 1.0)
                stages_seen += 1
                calls += WARM_ROUNDS
        elif case.kind == 'launch':
            calls = 2 * (WARMUP_CALLS + cfg['training_repeats']) + 1
            cost += LAUNCH_MICRO_S
        elif case.kind == 'compiled':
            cost += COMPILE_S[case.model]
        elif case.kind == 'stages':
            calls = 2 * (WARM_ROUNDS + cfg['training_repeats']) + 1
            cost += STAGES_COMPILE_S * (CACHED_COMPILE if stages_seen else 1.0)
            stages_seen += 1
            if case.mode == 'reduce-overhead':  # the micro-batches: an eager copy, 3 × 2 steps at the padded size
                cost += BUILD_S
                calls += 3 * MICRO_BATCHES
        if (case.model, case.image) not in built or case.kind == 'stages' or case.mode == 'graphed':
            cost += BUILD_S
            built.add((case.model, case.image))
        if case.model == SOFT and case.image not in soft_sizes:
            cost += TRITON_NEW_SIZE_S if soft_sizes else TRITON_FIRST_S
            soft_sizes.add(case.image)
        estimates.append(cost + calls * step_s + (PROFILE_S if case.profile else 0.0))
    return estimates


def format_plan(title: str, cases: list[Case], estimates: list[float], budget_s: float) -> str:
    """The plan, one line per case with its estimate and the running total, the cases past the budget marked."""
    lines, total = [f'{title} (seconds on an H100 or H200, estimated; budget {budget_s:.0f} s):'], 0.0
    for number, (case, estimate) in enumerate(zip(cases, estimates), 1):
        total += estimate
        late = '' if total <= budget_s else '  (past the budget: runs only if time is left)'
        lines.append(f'  {number:2d}. {case.label():<62} ~{estimate:5.1f} s, total {total:6.1f} s{late}')
    return '\n'.join(lines)


# --- the time guard

class OutOfTime(BaseException):
    """The part's time budget ran out: raised by :meth:`TimeGuard.check` between calls, or by its alarm inside one.
    A stop like ``KeyboardInterrupt``, not an ``Exception``: dynamo, inductor and the models catch and wrap those, and
    this one must reach the case that records it."""


class TimeGuard:
    """A part's time budget: ``check()`` between calls raises :class:`OutOfTime` once ``budget_s`` seconds have passed
    since the guard was made; :meth:`hard_stop` arms an alarm that raises it inside a call that runs ``grace_s``
    beyond. ``clock`` is the time source (seconds)."""

    def __init__(self, budget_s: float, grace_s: float = 0.0, clock: Callable[[], float] = time.perf_counter) -> None:
        self.budget_s = budget_s
        self.grace_s = grace_s
        self.clock = clock
        self.start = clock()

    def left(self) -> float:
        return self.budget_s - (self.clock() - self.start)

    def reason(self) -> str:
        return f"the part's {self.budget_s:g} s were spent"

    def check(self) -> None:
        if self.left() <= 0:
            raise OutOfTime(self.reason())

    @contextlib.contextmanager
    def hard_stop(self) -> Iterator[None]:
        """Inside, a call still running ``grace_s`` after the budget is spent is interrupted (SIGALRM, main thread of a
        POSIX process; elsewhere nothing is armed and only :meth:`check` stops the case)."""
        if not hasattr(signal, 'setitimer') or threading.current_thread() is not threading.main_thread():
            yield
            return

        def stop(signum: int, frame: Any) -> None:
            raise OutOfTime(f'{self.reason()} (interrupted {self.grace_s:g} s later, inside a call)')

        previous = signal.signal(signal.SIGALRM, stop)
        signal.setitimer(signal.ITIMER_REAL, max(self.left() + self.grace_s, 1e-3))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def timed_calls(row: dict, key: str, fn: Callable[[], Any], device: torch.device, calls: int,
                guard: TimeGuard) -> None:
    """``calls`` timed calls of ``fn``, the guard checked before each; each time (ms) goes to ``row[key + '_each']``
    as it comes and their median to ``row[key]``, so a case stopped midway keeps what it measured."""
    each = row.setdefault(f'{key}_each', [])
    for _ in range(calls):
        guard.check()
        each.append(1e3 * timed(fn, device))
        row[key] = statistics.median(each)


# --- what the cases run

def backbone_step(model: nn.Module, run: Callable[[torch.Tensor], Any], x: torch.Tensor) -> Callable[[], None]:
    """One training step of a backbone alone, as a training loop runs it: ``run(x)`` (``model`` itself or its compiled
    form) in its own bfloat16 autocast region, the backward of the maps' means outside it, the gradients dropped."""
    def step() -> None:
        model.train()
        with torch.autocast(x.device.type, dtype=AUTOCAST_DTYPE):
            loss = sum(m.float().mean() for m in run(x))
        loss.backward()
        model.zero_grad(set_to_none=True)
    return step


def _kernels(row: dict, fn: Callable[[], Any], device: torch.device) -> None:
    """The kernels one call of ``fn`` launches and their summed device time (``torch.profiler``; none on CPU)."""
    row['kernels'], row['kernel_ms'] = device_kernels(profiled_call(fn, device))


def _peak(row: dict, fn: Callable[[], Any], device: torch.device) -> None:
    memory = PeakMemory(device)
    memory.start()
    fn()
    row['peak_mib'] = memory.peak_mib()


def _dynamo_counts() -> tuple[int, int]:
    """(graphs compiled, graph breaks) so far in this process (dynamo's counters, never reset by the check)."""
    from torch._dynamo.utils import counters

    return counters['stats']['unique_graphs'], sum(counters['graph_break'].values())


def _dynamo_since(before: tuple[int, int]) -> tuple[int, int]:
    """(graphs compiled, graph breaks) since :func:`_dynamo_counts` gave ``before``."""
    return tuple(now - then for now, then in zip(_dynamo_counts(), before))


@contextlib.contextmanager
def graph_captures() -> Iterator[list[int]]:
    """Inside, ``counts[0]`` counts the CUDA graphs captured (each ``torch.cuda.CUDAGraph.capture_begin``)."""
    counts = [0]
    begin = torch.cuda.CUDAGraph.capture_begin

    def counted(self: torch.cuda.CUDAGraph, *args: Any, **kwargs: Any) -> Any:
        counts[0] += 1
        return begin(self, *args, **kwargs)

    with mock.patch.object(torch.cuda.CUDAGraph, 'capture_begin', counted):
        yield counts


def step_case(case: Case, model: nn.Module, cfg: dict, device: torch.device, guard: TimeGuard, row: dict) -> None:
    """An eager or compiled training step (``torch.compile`` default, ``cfg['compile_backend']``): the first call
    (the compile apart for compiled rows), the timed steps, the peak memory, the kernels of one step where asked, the
    graphs and graph breaks dynamo made."""
    x = torch.randn(case.batch, 3, *case.image, device=device)
    run = model if case.kind == 'eager' else torch.compile(model, backend=cfg['compile_backend'])
    step = backbone_step(model, run, x)
    before = _dynamo_counts()
    guard.check()
    row['first_call_s'] = timed(step, device)
    if case.kind == 'compiled':
        row['backend'] = cfg['compile_backend']
        row['graphs'], row['graph_breaks'] = _dynamo_since(before)
    for _ in range(WARMUP_CALLS - 1):
        guard.check()
        step()
    timed_calls(row, 'step_ms', step, device, cfg['training_repeats'], guard)
    if case.kind == 'compiled':
        row['compile_s'] = max(0.0, row['first_call_s'] - row['step_ms'] / 1e3)
    guard.check()
    _peak(row, step, device)
    if case.profile:
        guard.check()
        _kernels(row, step, device)


# --- the host's time per Triton launch

class _NoLaunch:
    """A launcher that runs nothing (the smoke run's: the kernels' values do not matter there)."""

    name = 'none'
    exact_values = False

    def __call__(self, kernel: Any, grid: tuple[int, ...], args: Any, meta: Any) -> None:
        pass


class _Through:
    """A route's launcher replaced by ``launcher`` (:func:`soft_mm.ops.triton_route.watching_launches`), the launches
    counted in ``launched[0]``."""

    def __init__(self, launcher: Any, launched: list[int]) -> None:
        self.launcher, self.launched = launcher, launched
        self.name, self.exact_values = launcher.name, launcher.exact_values

    def __call__(self, kernel: Any, grid: tuple[int, ...], args: Any, meta: Any) -> None:
        self.launched[0] += 1
        self.launcher(kernel, grid, args, meta)


def launch_case(case: Case, model: nn.Module, cfg: dict, device: torch.device, guard: TimeGuard, row: dict) -> None:
    """The host's time per Triton launch, launch plans against ``kernel[grid]`` (triton's ``JITFunction.run``):
    SOFT-Norm-Small's eager training step with every launch through one launcher and then the other (rounds
    interleaved), the step's Triton launches counted, the difference per launch; and one add + LayerNorm call (its one
    forward launch) made ``cfg['launch_calls']`` times without synchronising, the host's time per call with each."""
    from soft_mm.ops.functional.add_norm import add_layer_norm
    from soft_mm.ops.triton_launch import KernelLauncher, PlannedLauncher
    from soft_mm.ops.triton_route import interpreted_triton_route, interpreting, watching_launches

    launched = [0]
    x = torch.randn(case.batch, 3, *case.image, device=device)
    step = backbone_step(model, model, x)
    # (under --smoke, CPU tensors on the interpreter's GPU route, every launch counted and none run: the rows filled)
    on_cpu = device.type == 'cpu' and interpreting()
    launchers = ({'plan': _NoLaunch(), 'kernel[grid]': _NoLaunch()} if on_cpu else
                 {'plan': PlannedLauncher(), 'kernel[grid]': KernelLauncher()})

    @contextlib.contextmanager
    def through(name: str) -> Iterator[None]:
        with interpreted_triton_route() if on_cpu else contextlib.nullcontext(), \
                watching_launches(lambda inner: _Through(launchers[name], launched)):
            yield

    for name in launchers:
        for _ in range(min(WARMUP_CALLS, cfg['training_repeats'])):
            guard.check()
            with through(name):
                step()
    launched[0] = 0
    with through('plan'):
        step()
    row['triton_launches'] = launched[0]
    for _ in range(cfg['training_repeats']):
        for name in launchers:
            guard.check()
            with through(name):
                seconds = timed(step, device)
            each = row.setdefault(f'step_ms_each_{name}', [])
            each.append(1e3 * seconds)
            row[f'step_ms_{name}'] = statistics.median(each)
    if row['triton_launches']:
        row['host_us_per_launch_saved'] = 1e3 * (row['step_ms_kernel[grid]'] - row['step_ms_plan']) / \
            row['triton_launches']
    rows, width = (2 * 4096, 64) if device.type == 'cuda' else (64, 16)
    branch, residual = (torch.randn(rows, width, device=device, dtype=AUTOCAST_DTYPE) for _ in range(2))
    weight, bias = torch.ones(width, device=device), torch.zeros(width, device=device)
    for name in launchers:
        guard.check()
        with torch.no_grad(), through(name):
            add_layer_norm(branch, residual, weight, bias, 1e-5)  # (the plan made)
            if device.type == 'cuda':
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            for _ in range(cfg['launch_calls']):
                add_layer_norm(branch, residual, weight, bias, 1e-5)
            row[f'add_norm_call_host_us_{name}'] = 1e6 * (time.perf_counter() - start) / cfg['launch_calls']
            if device.type == 'cuda':
                torch.cuda.synchronize(device)


# --- the whole RetinaNet step

class PyramidFPN(nn.Module):
    """A backbone's stride-8, 16 and 32 maps through torchvision's FPN, with P6 and P7 from C5 (mmdet's RetinaNet
    neck: ``start_level=1``, ``add_extra_convs='on_input'``, 256 channels), as torchvision's ``RetinaNet`` takes a
    backbone (``out_channels``; an ordered dict of maps). NHWC maps (timm's Swin-T) are turned NCHW first."""

    def __init__(self, backbone: nn.Module, out_channels: int = 256) -> None:
        from torchvision.ops.feature_pyramid_network import FeaturePyramidNetwork, LastLevelP6P7

        super().__init__()
        self.body = backbone
        info = getattr(backbone, 'feature_info', None)
        channels = list(info.channels()) if info is not None else list(backbone.pyramid.embed_dims)
        self.nhwc = getattr(backbone, 'output_fmt', 'NCHW') == 'NHWC'
        self.fpn = FeaturePyramidNetwork(channels[1:], out_channels,
                                         extra_blocks=LastLevelP6P7(channels[-1], out_channels))
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
        maps = self.body(x)
        if self.nhwc:
            maps = [m.permute(0, 3, 1, 2) for m in maps]
        return self.fpn(OrderedDict((str(i), m) for i, m in enumerate(maps[1:])))


def retinanet(backbone: nn.Module, image: tuple[int, int], num_classes: int = 80) -> nn.Module:
    """torchvision's RetinaNet on ``backbone`` (:class:`PyramidFPN`), its anchors those of mmdet's RetinaNet (octave
    base scale 4, three scales per octave, ratios 0.5, 1, 2, strides 8-128), its transform keeping ``image`` as it
    is (no resize at that size; normalisation and the batch's padding to 32 remain)."""
    from torchvision.models.detection import RetinaNet
    from torchvision.models.detection.anchor_utils import AnchorGenerator

    sizes = tuple(tuple(int(4 * stride * 2 ** (i / 3)) for i in range(3)) for stride in (8, 16, 32, 64, 128))
    anchors = AnchorGenerator(sizes, ((0.5, 1.0, 2.0),) * len(sizes))
    return RetinaNet(PyramidFPN(backbone), num_classes, min_size=min(image), max_size=max(image),
                     anchor_generator=anchors)


def synthetic_targets(batch: int, image: tuple[int, int], device: torch.device, boxes: int = 8,
                      num_classes: int = 80) -> list[dict[str, torch.Tensor]]:
    """A fixed batch of ``boxes`` boxes per image (5-40% of the image's sides, seeded) with labels."""
    gen = torch.Generator().manual_seed(0)
    height, width = image
    targets = []
    for _ in range(batch):
        size = torch.rand(boxes, 2, generator=gen) * 0.35 + 0.05
        corner = torch.rand(boxes, 2, generator=gen) * (1 - size)
        scale = torch.tensor([width, height], dtype=torch.float32)
        xyxy = torch.cat([corner * scale, (corner + size) * scale], dim=1)
        targets.append(dict(boxes=xyxy.to(device), labels=torch.randint(1, num_classes, (boxes,), generator=gen)
                            .to(device)))
    return targets


def retinanet_case(case: Case, model: nn.Module, cfg: dict, device: torch.device, guard: TimeGuard,
                   row: dict) -> None:
    """The whole detector step: forward and losses in their own bfloat16 autocast region, the backward, AdamW's step
    and ``zero_grad``; the times, the peak memory, the losses of the last call."""
    try:
        detector = retinanet(model, case.image).to(device)
    except ImportError as err:  # torchvision is absent: recorded
        row['error'] = f'torchvision is not importable here ({err})'
        return
    images = list(torch.rand(case.batch, 3, *case.image, device=device))
    targets = synthetic_targets(case.batch, case.image, device)
    optimizer = torch.optim.AdamW(detector.parameters(), lr=1e-4, weight_decay=0.05)
    losses: dict[str, torch.Tensor] = {}

    def step() -> None:
        detector.train()
        with torch.autocast(device.type, dtype=AUTOCAST_DTYPE):
            losses.update(detector(images, targets))
            loss = sum(losses.values())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    guard.check()
    row['first_call_s'] = timed(step, device)
    for _ in range(WARMUP_CALLS - 1):
        guard.check()
        step()
    timed_calls(row, 'step_ms', step, device, cfg['training_repeats'], guard)
    guard.check()
    _peak(row, step, device)
    row['losses'] = {name: float(value.detach()) for name, value in losses.items()}


# --- compile_stages on two sizes

def soft_with_compiled_stages(image: tuple[int, int], options: dict[str, Any], stochastic_depth: bool = True,
                              ) -> nn.Module:
    """SOFT-Norm-Small as :func:`harness.build_backbone` builds it, its pyramid made with ``compile_stages=options``
    (the benchmark's own switch: the pyramid class patched for the build)."""
    from soft_mm.models import pyramid

    with patched(pyramid, SoftPyramid=functools.partial(pyramid.SoftPyramid, compile_stages=options)):
        return build_backbone(SOFT, image, stochastic_depth=stochastic_depth)


def stage_options(case: Case, cfg: dict, device: torch.device) -> dict[str, Any]:
    """The ``compile_stages`` keywords of a stages row: ``dynamic=True``, CUDA graphs for the ``'reduce-overhead'``
    row on a GPU (on CPU there are none: compiled without), dynamo's ``eager`` backend under ``--smoke``."""
    options: dict[str, Any] = dict(dynamic=True)
    if case.mode == 'reduce-overhead' and device.type == 'cuda':
        options['mode'] = 'reduce-overhead'
    if cfg['compile_backend'] != 'inductor':
        options.pop('mode', None)
        options['backend'] = cfg['compile_backend']
    return options


def _padded(sizes, divisor: int) -> list[tuple[int, tuple[int, int]]]:
    """``sizes`` (``(batch, (H, W))`` each) with H and W rounded up to multiples of ``divisor``: the buckets."""
    return [(batch, (-(-h // divisor) * divisor, -(-w // divisor) * divisor)) for batch, (h, w) in sizes]


def _reserved_mib(device: torch.device) -> float | None:
    """The memory the CUDA caching allocator holds on ``device`` (its CUDA graphs' private pools included), MiB; None
    off CUDA."""
    return torch.cuda.memory_reserved(device) / 2 ** 20 if device.type == 'cuda' else None


def stages_case(case: Case, cfg: dict, device: torch.device, guard: TimeGuard, row: dict) -> None:
    """SOFT-Norm-Small with ``compile_stages`` trained on ``cfg['stage_sizes']`` in turn: a warm phase of
    ``WARM_ROUNDS`` rounds (compile, CUDA graphs' warm-up and recording), then ``training_repeats`` timed rounds; in
    each phase the graphs dynamo compiled and the CUDA graphs captured (in the steady phase: recompiles and
    re-records), the step time per size, the peak memory of the steady phase, on CUDA the memory the allocator came to
    hold during each size's warm calls (``warm_reserved_mib``: its graphs' pools, each bucket's graph memory where
    CUDA graphs are recorded). The CUDA-graphed row asks for
    ``pad_size_divisor`` and records whether the installed pyramid took it; it is built without stochastic depth
    (graphed and eager steps then compute the same function) and ends with :func:`micro_batches` at its first size's
    bucket."""
    options = stage_options(case, cfg, device)
    row['options'] = dict(options)
    row['cuda_graphs'] = options.get('mode') == 'reduce-overhead'
    row['pad_size_divisor'] = None
    row['stochastic_depth'] = case.mode != 'reduce-overhead'
    model = None
    divisor = 1  # the CUDA-graphed row's pad_size_divisor where the pyramid takes it
    if case.mode == 'reduce-overhead':
        try:
            model = soft_with_compiled_stages(case.image, dict(options, pad_size_divisor=cfg['pad_size_divisor']),
                                              stochastic_depth=False)
            row['pad_size_divisor'] = divisor = cfg['pad_size_divisor']
            row['padded_sizes'] = [f'{batch}x{h}x{w}' for batch, (h, w) in _padded(cfg['stage_sizes'], divisor)]
        except ValueError as err:  # an older pyramid: compile_stages has no such key
            row['pad_size_divisor_refused'] = str(err).splitlines()[0]
    if model is None:
        model = soft_with_compiled_stages(case.image, options, stochastic_depth=row['stochastic_depth'])
    model = model.to(device)
    sizes = [f'{batch}x{h}x{w}' for batch, (h, w) in cfg['stage_sizes']]
    row['sizes'] = sizes
    steps = [backbone_step(model, model, torch.randn(batch, 3, *image, device=device))
             for batch, image in cfg['stage_sizes']]
    with graph_captures() as captures:
        for phase, rounds in (('warm', WARM_ROUNDS), ('steady', cfg['training_repeats'])):
            before = _dynamo_counts()
            first_capture = captures[0]
            memory = PeakMemory(device)
            memory.start()
            for round_ in range(rounds):
                for size, step in zip(sizes, steps):
                    guard.check()
                    reserved = _reserved_mib(device)
                    seconds = timed(step, device)
                    if phase == 'warm' and reserved is not None:  # what compiling and recording this bucket kept
                        grown = row.setdefault('warm_reserved_mib', {}).get(size, 0.0)
                        row['warm_reserved_mib'][size] = grown + _reserved_mib(device) - reserved
                    if phase == 'warm' and round_ == 0:
                        row[f'first_call_s_{size}'] = seconds
                        if size == sizes[0]:  # the graphs of the first size; those at the second are recompiles
                            row['first_size_graphs'] = _dynamo_since(before)[0]
                    elif phase == 'steady':
                        each = row.setdefault(f'step_ms_each_{size}', [])
                        each.append(1e3 * seconds)
                        row[f'step_ms_{size}'] = statistics.median(each)
                    row[f'{phase}_graphs'], row[f'{phase}_graph_breaks'] = _dynamo_since(before)
                    row[f'{phase}_captures'] = captures[0] - first_capture
            if phase == 'steady':
                row['peak_mib'] = memory.peak_mib()
        if case.mode == 'reduce-overhead':
            batch, image = _padded(cfg['stage_sizes'], divisor)[0]
            micro_batches(model, batch, image, device, guard, captures, row)


def accumulated_gradients(model: nn.Module, inputs: list[torch.Tensor], dtype: torch.dtype | None,
                          projections: dict[tuple, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each parameter's gradient after the backward of every input in turn, accumulated (``zero_grad`` before the
    first only), as a loop of micro-batches runs them: the forward under autocast to ``dtype`` (None: float32), the
    loss a fixed random projection of each map (the maps' means would not do: the gradient of a post-norm map's mean
    is zero in exact arithmetic before the last LayerNorm, rounding noise in bfloat16); ``projections``: the
    projections by map index and shape, drawn on first use and shared by the runs compared."""
    model.train()
    model.zero_grad(set_to_none=True)
    for x in inputs:
        with torch.autocast(x.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            maps = model(x)
        loss = 0.0
        for i, m in enumerate(maps):
            key = (i, tuple(m.shape))
            if key not in projections:
                projections[key] = torch.randn(m.shape, generator=torch.Generator().manual_seed(i)).to(m.device)
            loss = loss + (m.float() * projections[key]).sum()
        loss.backward()
    return {name: p.grad.detach().float().clone() for name, p in model.named_parameters() if p.grad is not None}


def gradient_difference(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """``‖g - r‖ / ‖r‖`` over every parameter's gradient at once (a per-parameter ratio would be a ratio of
    roundings where a gradient is zero in exact arithmetic, as for a bias a LayerNorm's centring cancels); inf where a
    parameter has a gradient in one and not the other."""
    from soft_mm.testing.error_rule import relative_error

    if set(grads) != set(reference):
        return math.inf
    names = sorted(reference)
    return relative_error(torch.cat([grads[k].flatten() for k in names]),
                          torch.cat([reference[k].flatten() for k in names]))


def micro_batches(graphed: nn.Module, batch: int, image: tuple[int, int], device: torch.device, guard: TimeGuard,
                  captures: list[int], row: dict) -> None:
    """The gradients of ``MICRO_BATCHES`` accumulated micro-batches of ``batch`` images of size ``image`` (a bucket the
    graphed model has recorded: nothing padded, no capture) through ``graphed`` (bfloat16 autocast) against an eager
    copy's (its weights), beside the eager copy's own bfloat16 error against its float32 gradients, and the CUDA graphs
    captured during the micro-batches (re-records: 0 expected). ``micro_batches_equal``: the graphed gradients' error
    against the float32 ones at most twice the eager copy's bfloat16 one."""
    eager = build_backbone(SOFT, image).to(device)
    eager.load_state_dict(graphed.state_dict())
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(batch, 3, *image, generator=generator).to(device) for _ in range(MICRO_BATCHES)]
    projections: dict[tuple, torch.Tensor] = {}
    guard.check()
    before = captures[0]
    graph_grads = accumulated_gradients(graphed, inputs, AUTOCAST_DTYPE, projections)
    row['micro_batch_captures'] = captures[0] - before
    guard.check()
    eager_grads = accumulated_gradients(eager, inputs, AUTOCAST_DTYPE, projections)
    guard.check()
    float32_grads = accumulated_gradients(eager, inputs, None, projections)
    graphed.zero_grad(set_to_none=True)
    row['micro_batches_input'] = f'{batch}x{image[0]}x{image[1]}'
    row['grad_diff_graphed_vs_eager'] = gradient_difference(graph_grads, eager_grads)
    row['grad_diff_eager_bf16_vs_fp32'] = gradient_difference(eager_grads, float32_grads)
    row['grad_diff_graphed_vs_fp32'] = gradient_difference(graph_grads, float32_grads)
    row['micro_batches_equal'] = row['grad_diff_graphed_vs_fp32'] <= 2 * row['grad_diff_eager_bf16_vs_fp32']


# the SOFT stages' value convs (SOFT-Small: heads, head width, filter; stride 4, 8, 16 maps of the input)
VALUE_CONVS = ((2, 32, 9, 4), (4, 32, 5, 8), (10, 32, 3, 16))


def conv_case(case: Case, cfg: dict, device: torch.device, guard: TimeGuard, row: dict) -> None:
    """Each SOFT stage's value conv with the attention output added, forward and backward, at the maps of
    ``case.batch x case.image``, bfloat16 values and float32 filters (as under autocast): the fused Triton kernel
    (:func:`soft_mm.ops.functional.head_conv.conv_add`) against the layer's PyTorch form (the filters cast, the
    depthwise conv on the channels-last map through :func:`~soft_mm.ops.functional.head_conv.head_depthwise_conv`'s
    CUDA route, the sum); each with its kernels' device time (``'stage{i}_triton_*'``, ``'stage{i}_pytorch_*'``)."""
    gen = torch.Generator(device=device).manual_seed(0)
    # (on CPU, the --smoke run, the third stage alone: the interpreter runs a 9x9 filter's taps one by one)
    for stage, shape in enumerate(VALUE_CONVS, 1):
        if device.type == 'cpu' and stage < len(VALUE_CONVS):
            continue
        for name, fn in _conv_calls(case, shape, row, f'stage{stage}', device, gen):
            for _ in range(WARMUP_CALLS):
                fn()
            timed_calls(row, f'stage{stage}_{name}_ms', fn, device, cfg['training_repeats'], guard)
            kernels: dict = {}
            _kernels(kernels, fn, device)
            row[f'stage{stage}_{name}_kernels'] = kernels['kernels']
            row[f'stage{stage}_{name}_kernel_ms'] = kernels['kernel_ms']


def _conv_calls(case: Case, shape: tuple[int, int, int, int], row: dict, key: str, device: torch.device,
                gen: torch.Generator) -> list[tuple[str, Callable[[], None]]]:
    """The two forms of one stage's value conv as calls (forward and backward; the gradients dropped after each)."""
    from soft_mm.ops.functional.head_conv import conv_add, fuses_conv_add, head_depthwise_conv
    from soft_mm.ops.route import route_of

    heads, head_dim, kernel, stride = shape
    hw = (case.image[0] // stride, case.image[1] // stride)
    n, c = hw[0] * hw[1], heads * head_dim
    projection = torch.randn(case.batch, n, 2 * c, device=device, generator=gen, dtype=AUTOCAST_DTYPE)
    v = projection[..., c:].reshape(case.batch, n, heads, head_dim).transpose(1, 2).requires_grad_()
    out = torch.randn(case.batch, heads, n, head_dim, device=device, generator=gen,
                      dtype=AUTOCAST_DTYPE).requires_grad_()
    conv = nn.Conv2d(heads, heads, kernel, padding=kernel // 2, groups=heads, bias=False).to(device)
    grad = torch.randn(case.batch, n, c, device=device, generator=gen, dtype=AUTOCAST_DTYPE)
    route = route_of(v)
    row[f'{key}_map'] = f'{hw[0]}x{hw[1]}, {c} channels, k={kernel}'
    row[f'{key}_fused'] = fuses_conv_add(route, conv, v, out)

    def triton() -> None:
        torch.autograd.backward(conv_add(v, out, conv.weight, hw, route), grad)
        v.grad = out.grad = conv.weight.grad = None

    def pytorch() -> None:
        with torch.autocast(device.type, dtype=AUTOCAST_DTYPE):
            value_map = v.transpose(1, 2).reshape(case.batch, *hw, c).permute(0, 3, 1, 2)
            local = head_depthwise_conv(value_map, conv.weight, head_dim).permute(0, 2, 3, 1).reshape(case.batch, n, c)
            y = out.transpose(1, 2).reshape(case.batch, n, c) + local
        torch.autograd.backward(y, grad)
        v.grad = out.grad = conv.weight.grad = None
    return [('triton', triton), ('pytorch', pytorch)]


# --- running a plan

def run_plan(cases: list[Case], cfg: dict, device: torch.device, budget_s: float, rows: list[dict],
             save: Callable[[], None], op_case: Callable[[Case], dict] | None = None,
             clock: Callable[[], float] = time.perf_counter) -> list[dict]:
    """Run ``cases`` in order within ``budget_s`` seconds, each row appended to ``rows`` and ``save()`` called as it
    comes: a case whose estimate does not fit the time left is recorded as skipped, one that runs out of time inside
    as cut short (with what it measured), one that raises with its error; the next case runs. Models are built once
    per (name, size) and kept while a later case uses them. ``op_case(case)`` measures an ``'op'`` case."""
    guard = TimeGuard(budget_s, cfg['hard_stop_grace_s'], clock)
    estimates = estimate_plan(cases, cfg)
    models: dict[tuple[str, tuple[int, int]], nn.Module] = {}
    for index, (case, estimate) in enumerate(zip(cases, estimates)):
        row = dict(case.row(), estimate_s=round(estimate, 1))
        left = guard.left()
        if left <= 0 or (cfg['gate_on_estimates'] and estimate > left):
            row['skipped'] = (guard.reason() if left <= 0 else
                              f'needs about {estimate:.0f} s, {left:.0f} s of the budget left')
        else:
            start = clock()
            try:
                with guard.hard_stop():
                    _run_case(case, cfg, device, guard, row, models, op_case)
            except OutOfTime as stop:
                row['cut_short'] = str(stop)
            except Exception as err:  # out of memory, a compile failure, a kernel that fails: recorded
                row['error'] = _error_line(err)
            finally:
                if case.kind in ('compiled', 'stages'):
                    with contextlib.suppress(Exception):
                        torch._dynamo.reset()
            row['seconds'] = clock() - start
        later = {(c.model, c.image) for c in cases[index + 1:]}
        for key in [key for key in models if key not in later]:
            del models[key]
        print('  ' + ', '.join(f'{k}={v:.4g}' if isinstance(v, float) else f'{k}={v}' for k, v in row.items()
                               if not k.startswith('step_ms_each')), flush=True)
        rows.append(row)
        save()
    return rows


def _run_case(case: Case, cfg: dict, device: torch.device, guard: TimeGuard, row: dict,
              models: dict[tuple[str, tuple[int, int]], nn.Module], op_case: Callable[[Case], dict] | None) -> None:
    if case.kind == 'op':
        if op_case is None:
            raise ValueError('an op case needs op_case')
        row.update(op_case(case))
        return
    if case.kind == 'stages':
        stages_case(case, cfg, device, guard, row)
        return
    if case.kind == 'conv':
        conv_case(case, cfg, device, guard, row)
        return
    key = (case.model, case.image)
    if case.mode == 'graphed':  # a model of its own: the stages compiled, as CUDA graphs on a GPU
        guard.check()
        options = stage_options(Case('stages', case.model, mode='reduce-overhead'), cfg, device)
        options.update(dynamic=False, pad_size_divisor=cfg['pad_size_divisor'])
        row['options'] = dict(options)
        model = soft_with_compiled_stages(case.image, options).to(device)
    else:
        if key not in models:
            guard.check()
            models[key] = build_backbone(case.model, case.image, stochastic_depth=True).to(device)
        model = models[key]
    run = {'retinanet': retinanet_case, 'launch': launch_case}.get(case.kind, step_case)
    run(case, model, cfg, device, guard, row)


def _error_line(err: BaseException) -> str:
    """``'Type: first line of the message'``, at most 200 characters."""
    lines = str(err).splitlines()
    return f'{type(err).__name__}: {lines[0] if lines else ""}'[:200]


# --- the summary

class Target(NamedTuple):
    """One target of issue 53: ``what`` it measures, ``needed`` as printed, and the test on the figure."""

    what: str
    needed: str
    holds: Callable[[float], bool]


def _find(rows: list[dict], **fields: Any) -> dict | None:
    """The row with these fields that measured a time (whole, or cut short after some calls)."""
    for row in rows:
        if all(row.get(k) == v for k, v in fields.items()) and ('step_ms' in row or 'fwd_bwd_ms' in row):
            return row
    return None


def _cut_note(*rows: dict) -> str:
    """' (cut short: ...)' where a figure comes from a row stopped by the budget, with the calls it had."""
    cut = [f"{row['model']} after {len(row.get('step_ms_each', []))} calls" for row in rows if 'cut_short' in row]
    return f" (cut short: {', '.join(cut)})" if cut else ''


def _ratio_line(rows: list[dict], kind: str, size: str, target: Target, mode: str | None = None) -> dict:
    """Swin-T's time over SOFT's (``mode``: SOFT's row's, e.g. ``'graphed'``; Swin-T's row is the plain one)."""
    soft, peer = _find(rows, case=kind, model=SOFT, input=size, mode=mode), _find(rows, case=kind, model=PEER,
                                                                                  input=size, mode=None)
    line = dict(target=target.what, needed=target.needed)
    if soft is None or peer is None:
        missing = ' and '.join(name for name, row in ((SOFT, soft), (PEER, peer)) if row is None)
        return dict(line, status='not measured', measured=f'no {missing} row')
    ratio = peer['step_ms'] / soft['step_ms']
    return dict(line, figure=ratio, status='met' if target.holds(ratio) else 'not met',
                measured=f"{ratio:.2f}× ({peer['step_ms']:.1f} / {soft['step_ms']:.1f} ms){_cut_note(soft, peer)}")


def _memory_line(rows: list[dict], sizes: tuple[str, ...]) -> dict:
    """SOFT's eager peak memory over each peer's at each size: met when every pair is measured and below 1."""
    line = dict(target='peak memory of the eager training step, both sizes: SOFT / each peer', needed='< 1 each')
    pairs, missing = [], []
    for size in sizes:
        soft = _find(rows, case='eager', model=SOFT, input=size)
        for peer in BACKBONES[1:]:
            other = _find(rows, case='eager', model=peer, input=size)
            # (on CPU the peak is the rise of the process's peak RSS, which can be 0: not a measure)
            if soft is None or other is None or min(soft.get('peak_mib', 0), other.get('peak_mib', 0)) <= 0:
                missing.append(f'{peer} {size}')
            else:
                pairs.append((soft['peak_mib'] / other['peak_mib'], f'{peer} {size}'))
    not_measured = f'not measured: {", ".join(missing)}' if missing else ''
    if not pairs:
        return dict(line, status='not measured', measured=not_measured)
    worst, name = max(pairs)
    status = 'not met' if worst >= 1 else 'not measured' if missing else 'met'
    return dict(line, figure=worst, status=status,
                measured='; '.join(filter(None, (f'at most {worst:.2f} (against {name})', not_measured))))


def summarize(rows: list[dict], cfg: dict) -> list[dict]:
    """One line per target (module docstring): the figure, the target, and met / not met / not measured."""
    first, second = (f'{b}x{h}x{w}' for b, (h, w) in cfg['training_sizes'][:2])
    lines = [
        _ratio_line(rows, 'eager', first, Target(f'eager training step, {first}: Swin-T / SOFT', '≥ 1.2×',
                                                 lambda r: r >= 1.2)),
        _ratio_line(rows, 'compiled', first, Target(f'compiled training step, {first}: Swin-T / SOFT', '≥ 1.2×',
                                                    lambda r: r >= 1.2)),
        _ratio_line(rows, 'eager', second, Target(f'eager training step, {second}: Swin-T / SOFT', '≥ 1.5×',
                                                  lambda r: r >= 1.5)),
        _memory_line(rows, (first, second)),
    ]
    lines += [
        _ratio_line(rows, 'retinanet', first, Target(f'RetinaNet step, {first}: Swin-T eager / SOFT eager', '≥ 1.0×',
                                                     lambda r: r >= 1.0)),
        _ratio_line(rows, 'retinanet', first, Target(f'RetinaNet step, {first}: Swin-T eager / SOFT with its stages as '
                                                     'CUDA graphs', '≥ 1.3×', lambda r: r >= 1.3), mode='graphed'),
    ]
    launch = next((row for row in rows if row.get('case') == 'launch' and 'host_us_per_launch_saved' in row), None)
    line = dict(target="host time per Triton launch saved by the launch plans (SOFT's eager step)", needed='> 0 µs')
    if launch is None:
        lines.append(dict(line, status='not measured', measured='no launch row'))
    else:
        saved = launch['host_us_per_launch_saved']
        lines.append(dict(line, figure=saved, status='met' if saved > 0 else 'not met',
                          measured=f"{saved:.1f} µs ({launch['step_ms_kernel[grid]']:.1f} against "
                                   f"{launch['step_ms_plan']:.1f} ms a step, {launch['triton_launches']} launches)"))
    op = _find(rows, case='op', model='triton')
    line = dict(target=f"the op's forward+backward, {cfg['target_tokens']:,} tokens, bfloat16 (Triton)",
                needed='≤ 1.0 ms')
    if op is None:
        lines.append(dict(line, status='not measured', measured='no op row'))
    else:
        lines.append(dict(line, figure=op['fwd_bwd_ms'], measured=f"{op['fwd_bwd_ms']:.2f} ms",
                          status='met' if op['fwd_bwd_ms'] <= 1.0 else 'not met'))
    accumulated = next((row for row in rows if 'micro_batches_equal' in row), None)
    line = dict(target=f'{MICRO_BATCHES} accumulated micro-batches, stages as CUDA graphs: gradients against float32',
                needed="≤ 2× eager bfloat16's error, no re-record")
    if accumulated is None:
        lines.append(dict(line, status='not measured', measured='no micro-batches row'))
    else:
        held = accumulated['micro_batches_equal'] and accumulated['micro_batch_captures'] == 0
        lines.append(dict(line, figure=accumulated['grad_diff_graphed_vs_fp32'], status='met' if held else 'not met',
                          measured=f"{accumulated['grad_diff_graphed_vs_fp32']:.2e} against eager's "
                                   f"{accumulated['grad_diff_eager_bf16_vs_fp32']:.2e}; "
                                   f"{accumulated['micro_batch_captures']} captures during the micro-batches"))
    return lines


def format_summary(lines: list[dict]) -> str:
    """The summary as a Markdown table."""
    table = ['| target | measured | needed | |', '|---|---|---|---|']
    table += [f"| {line['target']} | {line['measured']} | {line['needed']} | {line['status']} |" for line in lines]
    return '\n'.join(table)
