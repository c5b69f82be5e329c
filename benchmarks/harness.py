"""The one harness of the benchmark scripts: device-synced timing, peak memory, the GEMM rate, fresh-process cases
and the allocator setting they run under, the backbones compared, and inductor's weight freezing.

The scripts beside it import it as ``harness`` (a script's own folder is first on ``sys.path``; the tests put this
folder there too). Sizes on the command line are :mod:`soft_mm.utils.sizes`, errors against a reference
:func:`soft_mm.testing.relative_error`, the plain SOFT math :func:`soft_mm.ops.naive_soft_attention`.

glibc's malloc serves every allocation above its mmap threshold (at most 32 MB by default) with a fresh ``mmap`` and
returns it on free, so each new large tensor is page-faulted in again: measured here, allocating and filling a 69 MB
tensor takes 33 ms, against 4 ms once the memory is reused. At detection resolutions many activations are that big
(a stage-1 MLP hidden of a 1333×800 image is 69 MB), so the default allocator adds time that grows faster than the
pixels, for every backbone alike. ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` (glibc tunables read at
process start) keep freed memory for reuse; the benchmarks run their cases with them by default (``--glibc-malloc
default`` runs without), and the same two variables speed up CPU training and inference.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's soft_mm for every script here, installed or not (a bare GPU machine)
    sys.path.insert(0, str(ROOT))

from soft_mm.utils.sizes import parse_size, size_arg  # noqa: E402

__all__ = [
    'BACKBONES',
    'GLIBC_MALLOC_TUNING',
    'MMDET_BACKBONES',
    'SOFT_BACKBONES',
    'TIMM_BACKBONES',
    'UNFUSED_SUFFIX',
    'PeakMemory',
    'add_case_arguments',
    'add_glibc_malloc_argument',
    'add_rounds_arguments',
    'add_sizes_argument',
    'build_backbone',
    'check_positive',
    'cpu_model',
    'device_kernels',
    'figure',
    'gemm_gflops',
    'glibc_malloc_note',
    'in_autocast',
    'inductor_freezing',
    'interleaved_medians',
    'median_time',
    'patched',
    'profiled_call',
    'run_in_fresh_process',
    'save_figure',
    'sync',
    'timed',
    'unfuse_blocks',
    'write_results',
]


# --- timing, peak memory, the GEMM rate

def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); a no-op on CPU."""
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def profiled_call(fn: Callable[[], Any], device: torch.device) -> list:
    """``torch.profiler``'s events of one call of ``fn`` (CPU operators, and on a CUDA device its kernels), the
    device synced before the profile ends."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == 'cuda' else [])
    with profile(activities=activities) as prof:
        fn()
        sync(device)
    return list(prof.events())


def device_kernels(events: list) -> tuple[int, float]:
    """``(kernels, milliseconds)``: the device kernels among profiler ``events`` and their summed device time."""
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(kernels), sum(e.time_range.elapsed_us() for e in kernels) / 1e3


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds of one call of ``fn``, synchronised with the device before and after."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def median_time(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """Median seconds of ``repeats`` calls of ``fn`` after one warm-up call (which also compiles what is compiled)."""
    fn()
    return statistics.median(timed(fn, device) for _ in range(repeats))


def _rss_kib(field: str) -> int:
    for line in Path('/proc/self/status').read_text().splitlines():
        if line.startswith(field + ':'):
            return int(line.split()[1])
    raise RuntimeError(f'{field} not in /proc/self/status')


class PeakMemory:
    """Peak memory of what runs after :meth:`start`: CUDA allocator peak, or the rise of the peak RSS on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def start(self) -> None:
        if self.device.type == 'cuda':
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return
        with contextlib.suppress(OSError):  # '5' resets the peak RSS to the current RSS (Linux >= 4.0)
            Path('/proc/self/clear_refs').write_text('5')
        self.base = _rss_kib('VmRSS') * 1024

    def peak_mib(self) -> float:
        if self.device.type == 'cuda':
            torch.cuda.synchronize(self.device)
            return (torch.cuda.max_memory_allocated(self.device) - self.base) / 2 ** 20
        # (a rise, never below 0: the kernel syncs each thread's RSS count lazily, so a peak read after a run that
        # grew nothing can come out a few pages under the RSS read at the start)
        return max(0.0, (_rss_kib('VmHWM') * 1024 - self.base) / 2 ** 20)


def autocast_to(device_type: str, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """Autocast to ``dtype`` on ``device_type``; none for float32 (torch < 2.3 refuses a CPU autocast to any dtype
    but bfloat16, even a disabled one)."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dtype)


def gemm_gflops(device: torch.device, dtype: torch.dtype = torch.float32, size: int = 4096, repeats: int = 5) -> float:
    """The machine's matmul rate: a ``size``² matmul in ``dtype``, median of ``repeats`` (GFLOP/s, 2 per MAC)."""
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    a @ b
    return 2 * size ** 3 / statistics.median(timed(lambda: a @ b, device) for _ in range(repeats)) / 1e9


# --- fresh-process cases and the allocator setting

GLIBC_MALLOC_TUNING = {'MALLOC_MMAP_THRESHOLD_': str(1 << 32), 'MALLOC_TRIM_THRESHOLD_': str(1 << 36)}
_TUNING_TEXT = ', '.join(f'{key}={value}' for key, value in GLIBC_MALLOC_TUNING.items())


def cpu_model() -> str:
    """The CPU's model name, family and model (``/proc/cpuinfo``), or the machine type where there is none."""
    try:
        text = Path('/proc/cpuinfo').read_text()
    except OSError:
        return platform.machine()
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(':')
        fields.setdefault(key.strip(), value.strip())
    if 'model name' not in fields:
        return platform.machine()
    return f"{fields['model name']} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"


def add_rounds_arguments(parser: argparse.ArgumentParser, out: str) -> None:
    """``--rounds`` (interleaved rounds), ``--repeats`` (timed calls per case and round) and ``--out`` (the folder of
    the results, default ``out``), for the scripts that time cases side by side in one process."""
    parser.add_argument('--rounds', type=int, default=5, help='interleaved rounds (default: 5)')
    parser.add_argument('--repeats', type=int, default=2, help='timed calls per case and round (default: 2)')
    parser.add_argument('--out', default=out, help=f'folder of the .md and .json results (default: {out})')


def check_positive(parser: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> None:
    """``parser.error`` naming the arguments unless ``--rounds``, ``--repeats`` and the int arguments ``names`` (their
    ``args`` attributes) are all >= 1."""
    def listed(items: list[str]) -> str:  # 'a and b', 'a, b and c'
        return ', '.join(items[:-1]) + ' and ' + items[-1]

    names = ('rounds', 'repeats', *names)
    values = [getattr(args, name) for name in names]
    if min(values) < 1:
        flags = ['--' + name.replace('_', '-') for name in names]
        parser.error(f'{listed(flags)} must be >= 1, got {listed([str(v) for v in values])}')


def interleaved_medians(cases: dict[str, Callable[[], Any]], rounds: int, repeats: int, device: torch.device,
                        setups: dict[str, Callable[[], Any]] | None = None) -> dict[str, float]:
    """Median seconds of each case (``{name: fn}``) over ``rounds`` rounds, the cases interleaved round by round (in
    each round the median of ``repeats`` timed calls after a warm-up, :func:`median_time`); ``setups[name]()`` runs
    before each of that case's rounds."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            if setups and name in setups:
                setups[name]()
            times[name].append(median_time(fn, device, repeats))
    return {name: statistics.median(t) for name, t in times.items()}


def add_glibc_malloc_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--glibc-malloc', choices=('tuned', 'default'), default='tuned',
                        help=f"allocator setting of every case: 'tuned' keeps freed memory for reuse ({_TUNING_TEXT}), "
                             "'default' is glibc's own (default: tuned)")


def glibc_malloc_note(setting: str) -> str:
    """The allocator setting, as the tables' headers state it."""
    return f'glibc malloc tuned ({_TUNING_TEXT})' if setting == 'tuned' else 'glibc malloc default'


def add_case_arguments(parser: argparse.ArgumentParser, glibc_malloc: bool = True) -> None:
    """The arguments of a script whose cases run in fresh processes: ``--glibc-malloc``
    (:func:`add_glibc_malloc_argument`, unless ``glibc_malloc`` is False) and the hidden ``--worker SPEC_JSON`` that
    :func:`run_in_fresh_process` passes to the case's process."""
    if glibc_malloc:
        add_glibc_malloc_argument(parser)
    parser.add_argument('--worker', help=argparse.SUPPRESS)


def add_sizes_argument(parser: argparse.ArgumentParser, defaults: Sequence[str], what: str) -> None:
    """``--sizes`` (one or more ``H`` or ``HxW``, :func:`soft_mm.utils.sizes.size_arg`) as ``(H, W)`` tuples."""
    parser.add_argument('--sizes', nargs='+', type=size_arg, default=[parse_size(s) for s in defaults],
                        help=f'{what}, H (square) or HxW (default: {" ".join(defaults)})')


def run_in_fresh_process(script: str, spec: dict[str, Any],
                         glibc_malloc: str | None) -> tuple[dict[str, Any] | None, str]:
    """Run ``script --worker <spec json>`` in a fresh interpreter; returns (its last stdout line as json, or None when
    it failed, and its stderr). ``glibc_malloc``: ``'tuned'`` or ``'default'`` (:func:`add_glibc_malloc_argument`),
    or None for this process's own environment."""
    env = os.environ.copy()
    if glibc_malloc is not None:
        for key in GLIBC_MALLOC_TUNING:
            env.pop(key, None)
        if glibc_malloc == 'tuned':
            env.update(GLIBC_MALLOC_TUNING)
    proc = subprocess.run([sys.executable, script, '--worker', json.dumps(spec)], capture_output=True, text=True,
                          check=False, env=env)
    if proc.returncode != 0:
        return None, proc.stderr or f'rc={proc.returncode}'
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


# --- the backbones compared

SOFT_BACKBONES = {'soft_tiny': ('tiny', False), 'soft_small': ('small', False), 'soft_norm_tiny': ('tiny', True),
                  'soft_norm_small': ('small', True)}
# the same backbones without the CPU inference fusions of their blocks, for an A/B: the MLP's first linear and GELU
# (soft_mm.ops.functional.gelu), the residual sums started in the branches' last GEMMs
# (soft_mm.ops.functional.residual) and stage 4's float32 core for bfloat16 operands (soft_mm.ops.functional.sdpa)
UNFUSED_SUFFIX = '_unfused'
SOFT_BACKBONES.update({name + UNFUSED_SUFFIX: arch for name, arch in list(SOFT_BACKBONES.items())})
# timm models with features_only=True: the four stride-4..32 maps a detector's neck takes (Swin-T's default stochastic
# depth only where asked for; ConvNeXt-T and EfficientViT-B2 have none by default)
TIMM_BACKBONES = {'swin_t': 'swin_tiny_patch4_window7_224', 'convnext_t': 'convnext_tiny',
                  'efficientvit_b2': 'efficientvit_b2'}
# mmdet registry configs with the published arch settings (mmdet is the only source of PVT v1)
MMDET_BACKBONES: dict[str, dict[str, Any]] = {
    'pvt_t': dict(type='PyramidVisionTransformer', num_layers=[2, 2, 2, 2]),
    'pvt_s': dict(type='PyramidVisionTransformer', num_layers=[3, 4, 6, 3]),
    'pvtv2_b1': dict(type='PyramidVisionTransformerV2', embed_dims=64, num_layers=[2, 2, 2, 2]),
    'pvtv2_b2': dict(type='PyramidVisionTransformerV2', embed_dims=64, num_layers=[3, 4, 6, 3]),
}
BACKBONES = (*SOFT_BACKBONES, *MMDET_BACKBONES, *TIMM_BACKBONES)


class PyramidMaps(nn.Module):
    """The SOFT backbone's forward (the four maps) without mmengine: :class:`~soft_mm.models.SOFT` is an mmengine
    ``BaseModule``, which a bare GPU machine does not have; the modules, their initialisation and the computation are
    the same."""

    def __init__(self, pyramid: nn.Module) -> None:
        super().__init__()
        self.pyramid = pyramid

    @property
    def stages(self) -> nn.ModuleList:
        return self.pyramid.stages

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.pyramid.forward_pyramid(x)[0])


@contextlib.contextmanager
def patched(owner: Any, **values: Any) -> Iterator[None]:
    """``owner``'s attributes (a library module's settings, for an A/B run) set to ``values`` inside the block and
    restored after it: the benchmark's own switch, never a lasting change of the library."""
    with mock.patch.multiple(owner, **values):
        yield


def _plain_mlp_forward(mlp: nn.Module, x: torch.Tensor, residual: torch.Tensor | None = None, route: Any = None,
                       ) -> torch.Tensor:
    """timm's ``Mlp.forward`` (no fused GEMM epilogue), plus ``residual`` added as a separate sum (the forward's route
    taken and not needed)."""
    from timm.layers import Mlp

    out = Mlp.forward(mlp, x)
    return out if residual is None else residual + out


def _without_float32_core(forward: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A softmax attention's forward with its bfloat16 operands attended as they are (no float32 core): PyTorch's
    ``scaled_dot_product_attention`` in place of the layer's ``softmax_attention`` during the call."""
    import torch.nn.functional as F

    from soft_mm.models import attention

    def run(*args: Any, **kwargs: Any) -> torch.Tensor:
        with patched(attention, softmax_attention=lambda q, k, v, route=None: F.scaled_dot_product_attention(q, k, v)):
            return forward(*args, **kwargs)
    return run


def unfuse_blocks(model: nn.Module) -> nn.Module:
    """The A/B variant of a SOFT model without the blocks' CPU fusions, patched per instance in place: each MLP's
    first linear and GELU as two operators and its residual sum apart (:func:`_plain_mlp_forward`), the attention
    layers adding no residual in their GEMMs (``adds_residual = False``, the blocks' protocol for mixers that take
    none), stage 4's softmax attention without the float32 core."""
    from soft_mm.models.attention import SoftmaxAttention
    from soft_mm.models.blocks import GeluMlp

    for module in model.modules():
        if isinstance(module, GeluMlp):
            module.forward = types.MethodType(_plain_mlp_forward, module)
        elif hasattr(module, 'adds_residual'):
            module.adds_residual = False
        if isinstance(module, SoftmaxAttention):
            module.forward = _without_float32_core(module.forward)
    return model


def build_backbone(name: str, image_size: tuple[int, int] | None = None, stochastic_depth: bool = False,
                   ) -> nn.Module:
    """The backbone ``name`` of :data:`BACKBONES`, its ``forward(x)`` giving the stride-4..32 maps: SOFT (``soft_*``,
    torch and timm only), timm's Swin-T (built for ``image_size``), ConvNeXt-T and EfficientViT-B2, or mmdet's PVT and
    PVTv2 (mmdet needed). Without stochastic depth, or with ``stochastic_depth=True`` each model's own default rate, as
    its detection configs train it (SOFT's backbone 0.1, timm's Swin-T 0.1, ConvNeXt-T none)."""
    if name in SOFT_BACKBONES:
        from soft_mm.models.pyramid import SoftPyramid

        arch, soft_norm = SOFT_BACKBONES[name]
        pyramid = SoftPyramid(arch, soft_norm=soft_norm, **({} if stochastic_depth else {'drop_path_rate': 0.0}))
        pyramid.init_pyramid_weights()
        if name.endswith(UNFUSED_SUFFIX):
            unfuse_blocks(pyramid)
        return PyramidMaps(pyramid)
    if name in TIMM_BACKBONES:
        import timm

        # Swin is built for the input size: its attention windows and relative positions depend on it
        swin = dict(**({} if stochastic_depth else {'drop_path_rate': 0.0}),
                    **({'img_size': image_size} if image_size else {}))
        return timm.create_model(TIMM_BACKBONES[name], pretrained=False, features_only=True,
                                 **(swin if name == 'swin_t' else {}))
    if name in MMDET_BACKBONES:
        from mmdet.registry import MODELS
        from mmdet.utils import register_all_modules

        register_all_modules()
        return MODELS.build(dict(MMDET_BACKBONES[name]))
    raise ValueError(f'unknown backbone {name!r}; one of {", ".join(BACKBONES)}')


# --- torch.compile

@contextlib.contextmanager
def inductor_freezing(enabled: bool = True) -> Iterator[None]:
    """Inductor's global ``freezing`` flag set to ``enabled`` inside the block and restored on exit. With it the
    weights are folded into the compiled graph as constants (no-grad inference only). Inductor reads the flag when it
    compiles, at a compiled function's first call with new shapes: those calls belong inside the block."""
    import torch._inductor.config as inductor_config

    with inductor_config.patch(freezing=enabled):
        yield


# --- plots

def figure(ncols: int, figsize: tuple[float, float]) -> tuple[Any, Any]:
    """``(fig, axes)``: one row of ``ncols`` matplotlib axes, drawn off-screen (the Agg backend)."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=figsize)


def save_figure(fig: Any, title: str, path: Path, fontsize: float = 8) -> None:
    """Title ``fig``, write it to ``path`` (80 dpi) and close it."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=fontsize)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_results(out: str | Path, name: str, table: str, args: argparse.Namespace, **data: Any) -> Path:
    """Print ``table``, write it to ``out/<name>.md`` and ``{'args': the arguments but --worker, **data}`` to
    ``out/<name>.json``; returns the folder ``out`` (created if missing)."""
    print()
    print(table)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f'{name}.md').write_text(table)
    arguments = {key: value for key, value in vars(args).items() if key != 'worker'}
    (folder / f'{name}.json').write_text(json.dumps({'args': arguments, **data}, indent=2))
    return folder


# --- autocast per call

def in_autocast(fn: Callable[[], Any], device_type: str, dtype: torch.dtype) -> Callable[[], Any]:
    """``fn`` with each call in its own autocast region (``dtype`` on ``device_type``), as a training or test loop
    enters autocast per step: autocast's cache of cast weights lasts one call, so a model timed over many calls pays
    its weight casts in each, as it does in training."""
    def run() -> Any:
        with torch.autocast(device_type, dtype=dtype):
            return fn()
    return run
