"""What a GPU would launch for one forward and one training step, per block: SOFT-Norm-Small, Swin-T and ConvNeXt-T,
counted on any machine.

    python benchmarks/launch_counts.py                       # CPU: batch 2 x 224x224, bfloat16 autocast, GPU route
    python benchmarks/launch_counts.py --sizes 800x1344      # more tokens, the same counts (no size branch)

An eager GPU step of a small backbone waits for Python: the host issues one kernel launch per ATen operator that
computes something (views, allocations and metadata launch none) and one per Triton kernel, at tens of microseconds
each. Counting those is a property of the code, not of the machine, so it is counted here on CPU tensors with a
``TorchDispatchMode`` (every ATen operator that reaches the dispatcher, after autograd and autocast, composite
operators already split into the ones that run) and a counter around each Triton launch (the interpreter's own copies
in and out of a kernel are no GPU work and are not counted).

**The GPU route on CPU** (:func:`soft_mm.ops.triton_route.interpreted_triton_route`, on by default; ``--cpu-route``
counts the CPU's own kernels instead): the SOFT op and the blocks' fused kernels take their Triton kernels in the
interpreter, as a CUDA device would take the compiled ones, and the value conv the route CUDA takes; the kernels
write bfloat16 results directly, as on a GPU (the interpreter's own bfloat16 stores truncate, which a count does not
mind; tests and tools that check values write float32 and cast). Each launch is
attributed to the block it came from: the forward's by the modules and the package functions running when it was made,
the backward's by the forward operation whose gradient it computes (autograd's sequence number), in the categories of
:data:`CATEGORIES`.

A training step is the forward under autocast and the backward of the maps' means, as ``benchmarks/eager_launches.py``
times it (no optimizer step: that is the same per parameter for every model). ``tests/benchmarks/test_launch_counts.py``
holds SOFT-Norm-Small's count per training step at or under :data:`STEP_BUDGET`.
"""
from __future__ import annotations

import argparse
import bisect
import contextlib
import os
import sys

if __name__ == '__main__' and '--cpu-route' not in sys.argv:  # the interpreter must be chosen before triton's import
    os.environ.setdefault('TRITON_INTERPRET', '1')
from collections import Counter
from collections.abc import Callable, Iterator

import torch
from harness import add_sizes_argument, autocast_to, build_backbone, cpu_model, write_results
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

__all__ = [
    'BUDGET_SIZE',
    'CATEGORIES',
    'MODELS',
    'NO_KERNEL',
    'STEP_BUDGET',
    'CountingLauncher',
    'Launch',
    'LaunchCounter',
    'count',
    'count_model',
    'counting_launches',
    'main',
    'regions',
    'tally',
]

MODELS = ('soft_norm_small', 'swin_t', 'convnext_t')
DTYPES = {'bfloat16': torch.bfloat16, 'float16': torch.float16, 'float32': torch.float32}
# SOFT-Norm-Small's launches per training step on the GPU route, batch 2 x 64x64 (the test's size: the interpreter
# runs the kernels in a minute there, against four at 224x224), bfloat16 autocast, its default stochastic depth: what
# the test holds, a little above the count (796 with torch 2.14; 224x224: 12 fewer, no position-embedding resize), and
# at most 0.8x Swin-T's at 224x224 (1,058)
STEP_BUDGET = 805
BUDGET_SIZE = (64, 64)
# ATen operators that launch no kernel: allocations and metadata (views are recognised by their schema)
NO_KERNEL = {'empty', 'empty_strided', 'new_empty', 'new_empty_strided', 'empty_like', '_unsafe_view', 'detach',
             'lift_fresh', 'alias', 'set_', 'resize_', 'sym_size', 'sym_stride', 'sym_numel', 'is_same_size',
             'sym_storage_offset', 'is_contiguous', 'is_non_overlapping_and_dense', 'promote_types',
             '_local_scalar_dense'}
GEMMS = {'mm', 'addmm', 'bmm', 'baddbmm', 'convolution', 'convolution_backward', '_convolution', 'cudnn_convolution',
         'mkldnn_convolution', '_scaled_dot_product_flash_attention_for_cpu',
         '_scaled_dot_product_flash_attention_for_cpu_backward', '_scaled_dot_product_efficient_attention',
         '_scaled_dot_product_efficient_attention_backward', '_scaled_dot_product_flash_attention',
         '_scaled_dot_product_flash_attention_backward', 'native_batch_norm_backward'}
NORMS = {'native_layer_norm', 'native_layer_norm_backward', 'native_batch_norm', '_native_batch_norm_legit',
         '_native_batch_norm_legit_no_training', 'native_batch_norm_backward', 'batch_norm_backward'}
ACTIVATIONS = {'gelu', 'gelu_backward', 'relu', 'relu_', 'threshold_backward', 'sigmoid', 'tanh'}
# the modules whose forward adds a residual (the blocks, and the branches that start the blocks' sums)
RESIDUAL_MODULES = {'Block', 'GeluMlp', 'SoftAttention', 'SoftmaxAttention', 'SwinTransformerBlock', 'ConvNeXtBlock'}
# the labels of the package functions the counter watches (module classes label the rest)
FUNCTIONS = {'soft_mm.models.attention:soft_attention': 'SOFT op',
             'soft_mm.models.attention:SoftAttention.sample_landmarks': 'landmark sampler',
             'soft_mm.models.attention:SoftAttention._queries_and_values': 'query projection',
             'soft_mm.models.attention:head_depthwise_conv': 'value conv',
             'soft_mm.models.pyramid:resize_pos_embed': 'position embedding',
             'soft_mm.models.weight_cast:FlatCastPlan.__call__': 'weight cast'}
# (category, what it holds), in the order of the tables
CATEGORIES = (
    ('Triton kernels', 'the fused kernels themselves, one launch each'),
    ('casts', '_to_copy (autocast\'s weight and input casts, the blocks\' dtype changes) and the weights\' one cast'),
    ('SOFT op wrapper', 'torch operators of the SOFT op around its kernels (and the op itself off the GPU route)'),
    ('landmark sampler', 'the pooling, patch matmul, LayerNorm and GELU of the landmarks'),
    ('query scale', 'operators of the query/key and value projections other than their GEMM (the query scale, '
                    'the weights\' concatenation where they are not cast)'),
    ('value conv', 'the per-head depthwise conv and its layout changes'),
    ('position embedding', 'the position embedding\'s resize and add'),
    ('GEMMs and convs', 'linear layers, convolutions, attention kernels and their gradients'),
    ('norms', 'LayerNorm and BatchNorm, forward and backward'),
    ('residual adds', 'the blocks\' sums (and the value conv\'s, SOFT\'s local term)'),
    ('activations', 'GELU, ReLU and their gradients'),
    ('backward reductions', 'sums and adds in the backward (bias gradients, the gradients of a tensor used twice)'),
    ('gradient accumulation', 'writing the parameters\' .grad'),
    ('other', 'everything else (the counter prints its operators)'),
)


class Launch(tuple):
    """``(name, phase, category, labels)``: ``'aten.<op>'`` or ``'triton.<kernel>'``, ``'forward'`` or
    ``'backward'``, a name of :data:`CATEGORIES`, and the stack of module and function labels it came from."""

    name = property(lambda self: self[0])
    phase = property(lambda self: self[1])
    category = property(lambda self: self[2])
    labels = property(lambda self: self[3])


def _category(op: str, labels: tuple[str, ...], backward: bool) -> str:
    if op.startswith('triton.'):
        return 'Triton kernels'
    name = op[5:]
    if name == '_to_copy' or 'weight cast' in labels:
        return 'casts'
    if labels and labels[-1] == 'gradient accumulation':
        return 'gradient accumulation'
    if backward and name in ('sum', 'add'):
        return 'backward reductions'
    for label in reversed(labels):  # the innermost package function decides
        if label in ('SOFT op', 'landmark sampler', 'value conv', 'position embedding'):
            return 'SOFT op wrapper' if label == 'SOFT op' else label
        if label == 'query projection' and name not in GEMMS:
            return 'query scale'
    if name in GEMMS:
        return 'GEMMs and convs'
    if name in NORMS:
        return 'norms'
    if name in ACTIVATIONS:
        return 'activations'
    if name in ('add', 'add_') and labels and labels[-1] in RESIDUAL_MODULES:
        return 'residual adds'
    return 'other'


class _Regions:
    """The stack of labels (module classes, watched package functions) of the forward, with autograd's sequence
    number at each change, so that a backward operation finds the labels of the forward operation it differentiates."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.seqs: list[int] = []
        self.stacks: list[tuple[str, ...]] = []

    def _mark(self) -> None:
        if not torch.is_grad_enabled():
            return
        with _disable_current_modes():  # one tiny node, to read autograd's sequence counter (not counted)
            seq = (torch.zeros((), requires_grad=True) * 1).grad_fn._sequence_nr()
        self.seqs.append(seq)
        self.stacks.append(tuple(self.stack))

    def push(self, label: str) -> None:
        self.stack.append(label)
        self._mark()

    def pop(self) -> None:
        self.stack.pop()
        self._mark()

    def labels_of(self, seq: int) -> tuple[str, ...]:
        i = bisect.bisect_right(self.seqs, seq) - 1
        return self.stacks[i] if i >= 0 else ()


class LaunchCounter(TorchDispatchMode):
    """Records a :class:`Launch` per ATen operator that runs a kernel (views, allocations and metadata excluded; the
    operators inside ``soft_mm`` custom ops included) and per Triton launch, into ``launches``."""

    # the package's eager caches (the pooling matrices) stay on under this mode: it only watches
    observes_only = True

    def __init__(self, regions: _Regions | None = None, launches: list[Launch] | None = None) -> None:
        super().__init__()
        self.launches: list[Launch] = [] if launches is None else launches
        self.regions = regions or _Regions()

    def record(self, name: str) -> None:
        node = torch._C._current_autograd_node()
        if node is None:
            phase, labels = 'forward', tuple(self.regions.stack)
        else:
            seq = node._sequence_nr()
            phase = 'backward'
            labels = ('gradient accumulation',) if seq >= 2 ** 63 else self.regions.labels_of(seq)
        self.launches.append(Launch((name, phase, _category(name, labels, phase == 'backward'), labels)))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == 'soft_mm':  # look inside: the custom op's kernel, its operators counted by a child
            with LaunchCounter(self.regions, self.launches):
                return func.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *args, **kwargs)
        name = func.overloadpacket.__name__
        if not func.is_view and name not in NO_KERNEL:
            self.record(f'aten.{name}')
        return func(*args, **kwargs)


class CountingLauncher:
    """A route's launcher that records each Triton launch in ``counter`` (``'triton.<kernel>'``) and launches it with
    ``inner`` (what the route would have used), outside the counter's dispatch mode: the interpreter's copies between
    torch and numpy are no GPU kernels. The kernels write bfloat16 results directly, as on a GPU (the interpreter's
    own bfloat16 stores truncate, which a count does not mind)."""

    exact_values = False

    def __init__(self, inner, counter: LaunchCounter) -> None:
        self.inner, self.counter = inner, counter
        self.name = inner.name

    def __call__(self, kernel, grid, args, meta) -> None:
        from soft_mm.ops.triton_launch import kernel_name

        self.counter.record(f'triton.{kernel_name(kernel)}')
        with _disable_current_modes():
            self.inner(kernel, grid, args, meta)


def _watch(regions: _Regions, fn: Callable, label: str) -> Callable:
    def watched(*args, **kwargs):
        regions.push(label)
        try:
            return fn(*args, **kwargs)
        finally:
            regions.pop()
    return watched


@contextlib.contextmanager
def regions(counter: LaunchCounter, model: torch.nn.Module | None = None) -> Iterator[None]:
    """Label the counter's launches: each module's class (its instance's ``forward`` wrapped: hooks would change
    the path the package takes, which keeps hooked branches apart), the functions of :data:`FUNCTIONS`, and each
    Triton launch of the package counted (:class:`CountingLauncher` around every route's launcher, through
    :func:`soft_mm.ops.triton_route.watching_launches`)."""
    import importlib

    from soft_mm.ops.triton_route import watching_launches

    stack = counter.regions
    patches = []
    for path, label in FUNCTIONS.items():
        module_name, attribute = path.split(':')
        owner = importlib.import_module(module_name)
        *parents, name = attribute.split('.')
        for parent in parents:
            owner = getattr(owner, parent)
        patches.append((owner, name, getattr(owner, name)))
        setattr(owner, name, _watch(stack, getattr(owner, name), label))
    modules = [] if model is None else list(model.modules())
    for module in modules:
        module.forward = _watch(stack, module.forward, type(module).__name__)
    try:
        with watching_launches(lambda inner: CountingLauncher(inner, counter)):
            yield
    finally:
        for module in modules:
            del module.forward
        for owner, name, original in patches:
            setattr(owner, name, original)


@contextlib.contextmanager
def counting_launches(model: torch.nn.Module | None = None) -> Iterator[list[Launch]]:
    """Context yielding the list of every :class:`Launch` made inside it, labelled by ``model``'s modules (if given)
    and the package's functions."""
    counter = LaunchCounter()
    with regions(counter, model), counter:
        yield counter.launches


def count(fn: Callable[[], object], model: torch.nn.Module) -> list[Launch]:
    """The launches of one call of ``fn`` running ``model`` (run once before, uncounted, so that caches are warm)."""
    fn()
    with counting_launches(model) as launches:
        fn()
    return launches


def count_model(model: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype) -> dict[str, list[Launch]]:
    """``{'forward': launches, 'step': launches}`` of one forward (no grad) and one training step (forward under
    autocast to ``dtype``, backward of the maps' means)."""
    def forward():
        with torch.no_grad(), autocast_to(x.device.type, dtype):
            return model.eval()(x)

    def step():
        model.train()
        with autocast_to(x.device.type, dtype):
            maps = model(x)
        torch.autograd.backward([m.float().mean() for m in maps])
        model.zero_grad(set_to_none=True)

    return {'forward': count(forward, model), 'step': count(step, model)}


def tally(launches: list[Launch]) -> dict:
    """Totals of a list of launches: all, per category, per phase, and the top operators."""
    return dict(total=len(launches), categories=dict(Counter(launch.category for launch in launches)),
                phases=dict(Counter(launch.phase for launch in launches)),
                ops=dict(Counter(launch.name for launch in launches).most_common()))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    add_sizes_argument(parser, ['224x224'], 'input size')
    parser.add_argument('--batch', type=int, default=2, help='images per batch (default: 2, mmdet\'s per GPU)')
    parser.add_argument('--dtype', choices=tuple(DTYPES), default='bfloat16',
                        help='autocast dtype, or float32 without autocast (default: bfloat16)')
    parser.add_argument('--models', nargs='+', choices=MODELS, default=list(MODELS))
    parser.add_argument('--no-stochastic-depth', action='store_true',
                        help='build the models without stochastic depth (default: each model\'s own rate, as its '
                             'detection configs train it: SOFT 0.1, Swin-T 0.1, ConvNeXt-T none)')
    parser.add_argument('--cpu-route', action='store_true',
                        help='count the CPU\'s own kernels (default: the GPU route, Triton kernels interpreted)')
    parser.add_argument('--out', default='work_dirs/launch_counts', help='folder of the .md and .json results')
    args = parser.parse_args(argv)
    if args.batch < 1:
        parser.error(f'--batch must be >= 1, got {args.batch}')
    return args


def tables(rows: list[dict]) -> str:
    lines = ['| input | model | launches a forward | a training step (forward + backward) |', '|---|---|---|---|']
    lines += [f"| {r['hw'][0]}x{r['hw'][1]} | {r['model']} | {r['forward']['total']:,} | {r['step']['total']:,} "
              f"({r['step']['phases'].get('forward', 0):,} + {r['step']['phases'].get('backward', 0):,}) |"
              for r in rows]
    for r in rows:
        if not r['model'].startswith('soft'):
            continue
        lines += ['', f"## {r['model']} per block, {r['hw'][0]}x{r['hw'][1]}", '',
                  '| block | a forward | a training step | what it holds |', '|---|---|---|---|']
        for name, what in CATEGORIES:
            fwd, stp = r['forward']['categories'].get(name, 0), r['step']['categories'].get(name, 0)
            if fwd or stp:
                lines.append(f'| {name} | {fwd} | {stp} | {what} |')
        others = Counter({op: n for op, n in r['step_other_ops'].items()})
        if others:
            lines += ['', 'other, a training step: ' + ', '.join(f'{op} {n}' for op, n in others.most_common())]
        lines += ['', 'operators, a training step: ' + ', '.join(f'{op} {n}' for op, n in
                                                                 list(r['step']['ops'].items())[:15])]
    return '\n'.join(lines) + '\n'


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from soft_mm.ops.triton_route import interpreted_triton_route

    dtype = DTYPES[args.dtype]
    route = contextlib.nullcontext() if args.cpu_route else interpreted_triton_route()
    rows = []
    with route:
        for hw in args.sizes:
            x = torch.randn(args.batch, 3, *hw, generator=torch.Generator().manual_seed(0))
            for name in args.models:
                model = build_backbone(name, hw, stochastic_depth=not args.no_stochastic_depth)
                counts = count_model(model, x, dtype)
                rows.append(dict(hw=list(hw), model=name, forward=tally(counts['forward']),
                                 step=tally(counts['step']),
                                 step_other_ops=dict(Counter(launch.name for launch in counts['step']
                                                             if launch.category == 'other'))))
    route_name = 'the CPU route' if args.cpu_route else 'the GPU route (Triton kernels interpreted)'
    precision = 'autocast ' + args.dtype if dtype != torch.float32 else 'float32'
    depth = 'without stochastic depth' if args.no_stochastic_depth else "each model's default stochastic depth"
    header = (f'launches per call, batch {args.batch}, {precision}, {route_name}, {depth}; torch '
              f'{torch.__version__}, counted on {cpu_model()}')
    write_results(args.out, 'launch_counts', header + '\n\n' + tables(rows), args, header=header, rows=rows)
    return 0


if __name__ == '__main__':
    sys.exit(main())
