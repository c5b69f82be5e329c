"""The host's time per eager training step, on any machine: SOFT-Norm-Small beside Swin-T and ConvNeXt-T, and the
whole RetinaNet step with SOFT-Norm-Small and with Swin-T, on the GPU route with every Triton launch empty.

    python benchmarks/host_time.py                                  # batch 2 x 64x64, channels / 16, both parts
    python benchmarks/host_time.py --rounds 15 --repeats 5          # a run to keep
    python benchmarks/host_time.py --width-divisor 1                # the models at their own widths
    python benchmarks/host_time.py --parts backbones --cpu-route    # and SOFT's CPU route for contrast

An eager GPU step of a small backbone waits for the host: Python, autograd, autocast, the dispatcher and one launch
per kernel (``benchmarks/launch_counts.py`` counts the launches). This tool times that host work on a CPU machine:
CPU tensors on the GPU route (:func:`soft_mm.ops.triton_route.interpreted_triton_route`: the SOFT op and the blocks'
fused kernels take their Triton launches, the value conv CUDA's route, the kernels write their result dtype as on a
GPU) at a tiny input, with every Triton launch of the package empty (:func:`empty_triton_launches`): the package's
Python around a launch runs (buffers, grids, arguments), the kernel runs no program and its output buffers stay as
the caller allocated them.

What else a CPU step holds is the arithmetic of the ATen operators, and a tiny input does not make it small: the
weights' casts to bfloat16, the weight gradients and the optimizer's update scale with the parameters, not the
pixels, and at the models' own widths they are most of a CPU step. So every layer's channels are divided by
``--width-divisor`` (16 by default; depths, heads, windows, kernels, landmarks, strides and the head's classes and
anchors kept): the same operators and launches, with a sixteenth of the channels and 1/256 of the weights. Each row's
launches are counted at both widths, and a row whose counts differ says so (its code took another path).

1. **Backbones**: SOFT-Norm-Small, Swin-T (timm) and ConvNeXt-T, each with its default stochastic depth (as
   detection configs train them); a step is the forward under bfloat16 autocast, the backward of the maps' means and
   ``zero_grad``, as ``benchmarks/launch_counts.py`` counts it.
2. **RetinaNet** (where mmdet and mmcv's ops import): ``model.train_step(data, optim_wrapper)`` (data preprocessor,
   forward, loss, backward, optimizer step, ``zero_grad``) of mmdet's RetinaNet with SOFT-Norm-Small
   (``configs/retinanet_soft_small_coco.py``) and with mmdet's Swin-T (the backbone of
   ``mmdet::swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py``), both under that config's FPN (each backbone's four maps,
   its own ``in_channels``), RetinaHead and AdamW (``foreach``, as on a GPU), under the CPU bfloat16 optim wrapper
   (:class:`soft_mm.engine.CPUAmpOptimWrapper`), on a fixed synthetic batch with a few ground-truth boxes.

The cases' rounds are interleaved (``harness.interleaved_medians``), on ``--threads`` threads (1 by default: a GPU
step's host is one Python thread, and one thread keeps OpenMP's fork and join out of every tiny operator), with
denormals flushed (an empty launch leaves whatever its buffer held). Beside each time, the launches of the same step
(ATen operators that compute and Triton launches, ``launch_counts``' counter over the same empty launches) and the
host time per launch. Not included: Triton's own launcher on a GPU (argument binding, its cache lookup, the driver's
launch), CUDA's launch and caching-allocator costs, what CUDA autocast does differently from CPU autocast (LayerNorm
and the losses in float32), mmcv's CUDA focal loss (both detectors take mmdet's PyTorch one here), and the GPU's work.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import logging
import os
import sys

if __name__ == '__main__':  # the interpreter, or none, chosen before triton's import (the route needs it)
    if 'empty' in sys.argv[sys.argv.index('--launchers') + 1:] if '--launchers' in sys.argv else False:
        os.environ['TRITON_INTERPRET'] = '1'
    else:
        os.environ.pop('TRITON_INTERPRET', None)
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from harness import (
    ROOT,
    SOFT_BACKBONES,
    TIMM_BACKBONES,
    PyramidMaps,
    add_rounds_arguments,
    add_sizes_argument,
    autocast_to,
    build_backbone,
    check_positive,
    cpu_model,
    interleaved_medians,
    write_results,
)

__all__ = ['BACKBONE_MODELS', 'DETECTORS', 'LAUNCHERS', 'WIDTH_DIVISORS', 'Case', 'CountedLauncher', 'EmptyLauncher',
           'aten_ms', 'backbone_step', 'build_narrow_backbone', 'build_retinanet', 'detection_batch', 'detector_step',
           'empty_triton_launches', 'gpu_route', 'launcher_of', 'main', 'mmdet_available', 'narrow', 'parse_args',
           'step_launches']

BACKBONE_MODELS = ('soft_norm_small', 'swin_t', 'convnext_t')
# how the Triton kernels are launched (gpu_route); the first of the defaults is each part's reference row
LAUNCHERS = ('plan', 'kernel[grid]', 'empty')
DEFAULT_LAUNCHERS = ('plan', 'kernel[grid]')
# the NVIDIA GPU the stand-in driver is (sm_90: H100 / H200, the project's GPU machines)
STUB_TARGET = 90
SOFT = BACKBONE_MODELS[0]
PARTS = ('backbones', 'retinanet', 'chains')
# the chains part: nodes a chain, and the launches of each node (forward and backward)
CHAIN_NODES = 40
CPU_ROUTE = ', CPU route'
# channel divisors that keep every head whole (the models' head dims are 32) and every width a whole number
WIDTH_DIVISORS = (1, 2, 4, 8, 16)
DEFAULT_WIDTH_DIVISOR = 16
# the detectors: the project's RetinaNet config (SOFT-Norm-Small), and the same with mmdet's Swin-T backbone
RETINANET_CONFIG = 'configs/retinanet_soft_small_coco.py'
SWIN_CONFIG = 'swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py'  # in the mmdet wheel's .mim/configs
DETECTORS = ('retinanet_soft_norm_small', 'retinanet_swin_t')
# mmdet's Swin-T of SWIN_CONFIG, for a wheel without its configs; all four maps for the FPN of RETINANET_CONFIG
SWIN_T = dict(type='SwinTransformer', embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24], window_size=7,
              mlp_ratio=4, qkv_bias=True, qk_scale=None, drop_rate=0.0, attn_drop_rate=0.0, drop_path_rate=0.2,
              patch_norm=True, with_cp=False, convert_weights=True)
BOXES_PER_IMAGE = 3


# --- the launchers

class EmptyLauncher:
    """A route's launcher that launches nothing: ``launched[name]`` counts each kernel's launches; every tensor passed
    keeps its contents, and the interpreter's route writes bfloat16 results directly, as on a GPU
    (``exact_values``: no float32 buffer cast back)."""

    name = 'empty'
    exact_values = False

    def __init__(self, launched: Counter) -> None:
        self.launched = launched

    def __call__(self, kernel: Any, grid: tuple[int, ...], args: Any, meta: Any) -> None:
        self.launched[kernel.fn.__name__] += 1


@contextlib.contextmanager
def empty_triton_launches() -> Iterator[Counter]:
    """Inside, every Triton launch of the package is empty (:class:`EmptyLauncher` in place of each route's launcher,
    through :func:`soft_mm.ops.triton_route.watching_launches`); yields the ``Counter`` of launches per kernel name."""
    from soft_mm.ops.triton_route import watching_launches

    launched: Counter = Counter()
    with watching_launches(lambda inner: EmptyLauncher(launched)):
        yield launched


class CountedLauncher:
    """A route's launcher that counts each kernel's launches in ``launched`` and launches it with ``inner``."""

    def __init__(self, inner: Any, launched: Counter) -> None:
        self.inner, self.launched = inner, launched
        self.name, self.exact_values = inner.name, inner.exact_values

    def __call__(self, kernel: Any, grid: tuple[int, ...], args: Any, meta: Any) -> None:
        self.launched[kernel.fn.__name__] += 1
        self.inner(kernel, grid, args, meta)


def launcher_of(name: str) -> Any:
    """A new launcher of :data:`LAUNCHERS`' ``name`` (``'plan'`` or ``'kernel[grid]'``)."""
    from soft_mm.ops.triton_launch import KernelLauncher, PlannedLauncher

    return PlannedLauncher() if name == 'plan' else KernelLauncher()


@contextlib.contextmanager
def gpu_route(launcher: str | Any = 'empty', target: int = STUB_TARGET, count: bool = True) -> Iterator[Counter]:
    """The GPU route on CPU tensors; yields the ``Counter`` of Triton launches per kernel name. ``launcher``:
    ``'empty'`` (the interpreter's route, every launch empty: needs ``TRITON_INTERPRET=1``), or a launcher (or
    its name, ``'plan'`` / ``'kernel[grid]'``) that takes triton's real launch path to a stand-in driver of
    sm_``target`` (:func:`soft_mm.ops.triton_route.stubbed_triton_route`: the binder, the specialisation, the cache
    lookup and the launcher run; no kernel does; needs ``TRITON_INTERPRET`` unset). ``count``: whether the launches
    are counted (the timed steps are not: a counter's work is no GPU host's)."""
    from soft_mm.ops.triton_route import interpreted_triton_route, stubbed_triton_route, watching_launches
    from soft_mm.testing.stub_driver import stub_triton_driver

    if launcher == 'empty':
        with interpreted_triton_route(), empty_triton_launches() as launched:
            yield launched
        return
    launched: Counter = Counter()
    inner = launcher_of(launcher) if isinstance(launcher, str) else launcher
    counting = watching_launches(lambda route_launcher: CountedLauncher(route_launcher, launched)) if count \
        else contextlib.nullcontext()
    with stub_triton_driver(target), stubbed_triton_route(target, inner), counting:
        yield launched


def on_route(fn: Callable[[], object], route: str | Any) -> Callable[[], object]:
    """``fn`` run on the GPU route with ``route``'s launcher (:func:`gpu_route`: a launcher, or ``'empty'``), or on
    the CPU's own route (``route='cpu'``)."""
    if route == 'cpu':
        return fn

    def run() -> object:
        with gpu_route(route, count=False):
            return fn()
    return run


def step_launches(step: Callable[[], object], model: torch.nn.Module, route: str | Any) -> dict[str, int]:
    """``{'launches': n, 'triton': k}``: what one ``step`` of ``model`` launches on its route (``launch_counts``'
    counter: ATen operators that compute and Triton launches)."""
    from launch_counts import count

    with contextlib.nullcontext() if route == 'cpu' else gpu_route(route):
        launches = count(step, model)
    return dict(launches=len(launches), triton=sum(launch.name.startswith('triton.') for launch in launches))


def aten_ms(step: Callable[[], object], route: str | Any, steps: int = 3) -> float:
    """Milliseconds of ATen operators' own host time in one ``step`` on its route (the profiler's self time of the
    ``aten::`` events, a mean over ``steps`` steps after one unprofiled): what the rest of a step's host time is not
    (the package's Python, autograd's Functions and engine, the launcher)."""
    from torch.profiler import ProfilerActivity, profile

    run = on_route(step, route)
    run()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            run()
    total = sum(event.self_cpu_time_total for event in prof.key_averages() if event.key.startswith('aten::'))
    return total / 1e3 / steps


# --- the models, narrowed

def narrow(channels: Sequence[int], divisor: int) -> list[int]:
    """``channels`` divided by ``divisor``.

    Raises:
        ValueError: a width that ``divisor`` does not divide.
    """
    if any(c % divisor for c in channels):
        raise ValueError(f'width_divisor={divisor} does not divide the channels {list(channels)}')
    return [c // divisor for c in channels]


def build_narrow_backbone(name: str, hw: tuple[int, int], divisor: int) -> torch.nn.Module:
    """The backbone ``name`` of :data:`BACKBONE_MODELS` with its default stochastic depth, in train mode, as
    ``harness.build_backbone(name, hw, stochastic_depth=True)`` builds it, every stage's channels divided by
    ``divisor`` (depths, heads, windows, kernels and landmarks kept)."""
    if divisor == 1:
        return build_backbone(name, hw, stochastic_depth=True).train()
    if name == SOFT:
        from soft_mm.models.arch import ARCH_SETTINGS
        from soft_mm.models.pyramid import SoftPyramid

        arch, soft_norm = SOFT_BACKBONES[name]
        settings = dict(ARCH_SETTINGS[arch], embed_dims=tuple(narrow(ARCH_SETTINGS[arch]['embed_dims'], divisor)))
        pyramid = SoftPyramid(settings, soft_norm=soft_norm)
        pyramid.init_pyramid_weights()
        return PyramidMaps(pyramid).train()
    if name not in ('swin_t', 'convnext_t'):
        raise ValueError(f'unknown backbone {name!r}; one of {", ".join(BACKBONE_MODELS)}')
    import timm

    channels = narrow(build_backbone(name, hw).feature_info.channels(), divisor)
    widths = dict(img_size=hw, embed_dim=channels[0]) if name == 'swin_t' else dict(dims=tuple(channels))
    return timm.create_model(TIMM_BACKBONES[name], pretrained=False, features_only=True, **widths).train()


def backbone_step(model: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype = torch.bfloat16,
                  ) -> Callable[[], None]:
    """One training step of a backbone (in train mode), as ``launch_counts.count_model`` counts it: the forward of
    ``x`` under autocast to ``dtype``, the backward of the maps' means, ``zero_grad``."""
    def step() -> None:
        with autocast_to(x.device.type, dtype):
            maps = model(x)
        torch.autograd.backward([m.float().mean() for m in maps])
        model.zero_grad(set_to_none=True)
    return step


def mmdet_available() -> str | None:
    """None where mmdet and mmcv's compiled ops import, else why not."""
    try:
        import mmcv.ops  # noqa: F401
        import mmdet  # noqa: F401
    except Exception as err:  # an import of compiled ops fails in many ways
        return f'{type(err).__name__}: {err}'
    return None


def _swin_t_backbone() -> tuple[dict[str, Any], str]:
    """mmdet's Swin-T of :data:`SWIN_CONFIG` from the mmdet wheel's configs (else :data:`SWIN_T`) and its source."""
    import mmdet
    from mmengine.config import Config

    path = Path(mmdet.__file__).parent / '.mim' / 'configs' / SWIN_CONFIG
    if not path.is_file():
        return dict(SWIN_T), 'SWIN_T (the mmdet wheel has no configs)'
    backbone = Config.fromfile(str(path)).model.backbone.to_dict()
    backbone.pop('_delete_', None)
    return backbone, f'mmdet::{SWIN_CONFIG}'


def build_retinanet(name: str, divisor: int = 1) -> tuple[torch.nn.Module, Any, dict[str, Any]]:
    """``(model, optim_wrapper, description)`` of the detector ``name`` of :data:`DETECTORS`, in train mode,
    initialised (no checkpoint): :data:`RETINANET_CONFIG`'s model and optimizer (``foreach=True``, a GPU's default),
    the backbone replaced by mmdet's Swin-T with its four maps for ``retinanet_swin_t``; every channel count of the
    backbone, the FPN and the head divided by ``divisor``. The optim wrapper is
    :class:`soft_mm.engine.CPUAmpOptimWrapper` (bfloat16 autocast on CPU)."""
    if name not in DETECTORS:
        raise ValueError(f'unknown detector {name!r}; one of {", ".join(DETECTORS)}')
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from mmengine.config import Config
    from mmengine.logging import MMLogger
    from mmengine.optim import build_optim_wrapper

    import soft_mm.engine  # noqa: F401  (registers CPUAmpOptimWrapper)
    from soft_mm.models.arch import resolve_arch

    register_all_modules(init_default_scope=True)
    cfg = Config.fromfile(str(ROOT / RETINANET_CONFIG))
    model_cfg = copy.deepcopy(cfg.model)
    description: dict[str, Any] = dict(config=RETINANET_CONFIG)
    if name == 'retinanet_swin_t':
        backbone, description['backbone'] = _swin_t_backbone()
        # Swin's stages double the channels: all four maps for the FPN
        channels = narrow([backbone['embed_dims'] * 2 ** i for i in range(len(backbone['depths']))], divisor)
        backbone.update(out_indices=tuple(range(len(channels))), embed_dims=channels[0])
        model_cfg.backbone = backbone
        model_cfg.neck.in_channels = channels
    else:
        arch = resolve_arch(model_cfg.backbone.arch)
        model_cfg.backbone['arch'] = dict(arch, embed_dims=tuple(narrow(arch['embed_dims'], divisor)))
        model_cfg.neck.in_channels = narrow(model_cfg.neck.in_channels, divisor)
    model_cfg.backbone['init_cfg'] = None
    model_cfg.neck.out_channels = narrow([model_cfg.neck.out_channels], divisor)[0]
    model_cfg.bbox_head.in_channels = narrow([model_cfg.bbox_head.in_channels], divisor)[0]
    model_cfg.bbox_head.feat_channels = narrow([model_cfg.bbox_head.feat_channels], divisor)[0]
    model = MODELS.build(model_cfg)
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)  # init_weights logs every parameter
    try:
        model.init_weights()
    finally:
        logger.setLevel(level)
    model.train()
    optimizer = dict(cfg.optim_wrapper.optimizer.to_dict(), foreach=True)
    optim_wrapper = build_optim_wrapper(model, dict(type='CPUAmpOptimWrapper', optimizer=optimizer))
    description.update(backbone_type=model_cfg.backbone['type'], neck_in_channels=list(model_cfg.neck.in_channels),
                       head_channels=model_cfg.bbox_head.feat_channels, optimizer=optimizer)
    return model, optim_wrapper, description


def detection_batch(batch: int, hw: tuple[int, int], seed: int = 0) -> dict[str, list]:
    """A fixed synthetic batch as mmdet's data loader hands it to ``train_step``: ``batch`` uint8 BGR images of
    ``hw`` and their samples, each with :data:`BOXES_PER_IMAGE` ground-truth boxes (HorizontalBoxes, 1/8 to 1/2 of
    the image a side) and labels."""
    from mmdet.structures import DetDataSample
    from mmdet.structures.bbox import HorizontalBoxes
    from mmengine.structures import InstanceData

    gen = torch.Generator().manual_seed(seed)
    h, w = hw
    inputs, samples = [], []
    for _ in range(batch):
        inputs.append(torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=gen))
        size = torch.tensor([w, h]) * (0.125 + 0.375 * torch.rand(BOXES_PER_IMAGE, 2, generator=gen))
        corner = (torch.tensor([w, h]) - size) * torch.rand(BOXES_PER_IMAGE, 2, generator=gen)
        sample = DetDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), scale_factor=(1.0, 1.0)))
        sample.gt_instances = InstanceData(bboxes=HorizontalBoxes(torch.cat([corner, corner + size], 1)),
                                           labels=torch.randint(0, 80, (BOXES_PER_IMAGE,), generator=gen))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def detector_step(model: torch.nn.Module, optim_wrapper: Any, data: dict[str, list]) -> Callable[[], dict]:
    """One ``model.train_step(data, optim_wrapper)``: the step users time (its log variables returned)."""
    def step() -> dict:
        return model.train_step(data, optim_wrapper)
    return step


# --- the parts

class Case(NamedTuple):
    """One timed row: ``step`` of ``model`` on its ``route`` (``'cpu'``, ``'empty'`` or a launcher's name), with the
    launcher object the route keeps (one per case: its plans stay warm), and the launches of the same step at full
    width."""

    step: Callable[[], object]
    model: torch.nn.Module
    route: Any
    launcher: str
    full_width_launches: int


def _route_of(launcher: str) -> Any:
    """What :func:`gpu_route` takes for a launcher name of :data:`LAUNCHERS` (a launcher object, made once per case),
    or ``'cpu'`` / ``'empty'`` as they are."""
    return launcher if launcher in ('cpu', 'empty') else launcher_of(launcher)


def _case(build: Callable[[int], tuple[torch.nn.Module, Callable[[], object]]], divisor: int, launcher: str) -> Case:
    """The :class:`Case` of ``build(divisor) -> (model, step)`` on ``launcher``'s route, its launches at full width
    counted on the way (that model freed after)."""
    model, step = build(divisor)
    route = _route_of(launcher)
    full = (model, step) if divisor == 1 else build(1)
    full_launches = step_launches(full[1], full[0], route)['launches']
    del full
    return Case(step, model, route, launcher, full_launches)


def _timed_rows(part: str, hw: tuple[int, int], cases: dict[str, Case], args: argparse.Namespace,
                reference: str) -> list[dict]:
    """Time ``cases`` interleaved, count each one's launches and read its ATen share from the profiler."""
    runs = {name: on_route(case.step, case.route) for name, case in cases.items()}
    times = interleaved_medians(runs, args.rounds, args.repeats, torch.device('cpu'),
                                setups={name: gc.collect for name in runs})
    rows = []
    for name, case in cases.items():
        counts = step_launches(case.step, case.model, case.route)
        ms = 1e3 * times[name]
        aten = aten_ms(case.step, case.route)
        rows.append(dict(part=part, hw=list(hw), model=name.split(' ')[0], case=name,
                         route='cpu' if case.route == 'cpu' else 'gpu', launcher=case.launcher, ms=ms,
                         ratio=times[name] / times[reference], aten_ms=aten, non_aten_ms=ms - aten,
                         us_per_launch=1e6 * times[name] / counts['launches'],
                         full_width_launches=case.full_width_launches, **counts))
    return rows


def _case_names(base: str, launchers: Sequence[str], triton: bool) -> dict[str, str]:
    """``{case name: launcher}``: one case per launcher for a model with Triton launches (``triton``), named
    ``'<base> (<launcher>)'`` after the first; the first launcher alone for the others."""
    chosen = launchers if triton else launchers[:1]
    return {(base if i == 0 else f'{base} ({launcher})'): launcher for i, launcher in enumerate(chosen)}


def backbone_rows(args: argparse.Namespace, hw: tuple[int, int]) -> list[dict]:
    """Part 1 at one input size: each backbone's training step (SOFT's once per launcher, and on the CPU route with
    ``--cpu-route``)."""
    x = torch.randn(args.batch, 3, *hw, generator=torch.Generator().manual_seed(0))

    def builder(name: str) -> Callable[[int], tuple[torch.nn.Module, Callable[[], object]]]:
        def build(divisor: int) -> tuple[torch.nn.Module, Callable[[], object]]:
            model = build_narrow_backbone(name, hw, divisor)
            return model, backbone_step(model, x)
        return build

    cases = {}
    for name in BACKBONE_MODELS:
        for case, launcher in _case_names(name, args.launchers, name == SOFT).items():
            cases[case] = _case(builder(name), args.width_divisor, launcher)
    if args.cpu_route:
        cases[SOFT + CPU_ROUTE] = _case(builder(SOFT), args.width_divisor, 'cpu')
    return _timed_rows('backbones', hw, cases, args, SOFT)


def retinanet_rows(args: argparse.Namespace, hw: tuple[int, int], described: dict[str, Any]) -> list[dict]:
    """Part 2 at one input size: each detector's ``train_step`` on the synthetic batch (SOFT's once per launcher, and
    on the CPU route with ``--cpu-route``); ``described`` gets each detector's description."""
    data = detection_batch(args.batch, hw)

    def builder(name: str) -> Callable[[int], tuple[torch.nn.Module, Callable[[], object]]]:
        def build(divisor: int) -> tuple[torch.nn.Module, Callable[[], object]]:
            model, optim_wrapper, description = build_retinanet(name, divisor)
            if divisor == args.width_divisor:
                described[name] = description
            return model, detector_step(model, optim_wrapper, data)
        return build

    cases = {}
    for name in DETECTORS:
        for case, launcher in _case_names(name, args.launchers, name == DETECTORS[0]).items():
            cases[case] = _case(builder(name), args.width_divisor, launcher)
    if args.cpu_route:
        cases[DETECTORS[0] + CPU_ROUTE] = _case(builder(DETECTORS[0]), args.width_divisor, 'cpu')
    return _timed_rows('retinanet', hw, cases, args, DETECTORS[0])


def _chain(node: Callable[[torch.Tensor, Any], torch.Tensor], x: torch.Tensor, nodes: int) -> Callable[[], None]:
    """``nodes`` calls of ``node(y, route)``, each on the last one's output, forward and backward (a projection's sum),
    the route made once for the chain (as a model's forward makes it)."""
    from soft_mm.ops.route import route_of

    weights = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(x.dtype)

    def run() -> None:
        route = route_of(x)
        y = x
        for _ in range(nodes):
            y = node(y, route)
        (y.float() * weights.float()).sum().backward()
    return run


def chain_rows(args: argparse.Namespace) -> list[dict]:
    """The chains part: :data:`CHAIN_NODES` SOFT op calls (batch 2, 2 heads, 64 tokens, d = 8, 16 landmarks,
    SOFT-Norm, bfloat16 products) and as many add + LayerNorm nodes (512 rows of 8 channels, bfloat16, the branch's
    bias), each the last one's output in, forward and backward, on the GPU route with each launcher, beside the
    PyTorch forms (the op's reference backend; ``layer_norm(x + r)``): host µs a node and a launch."""
    import torch.nn.functional as F

    from soft_mm.ops import soft_attention
    from soft_mm.ops.functional.add_norm import add_layer_norm

    gen = torch.Generator().manual_seed(0)
    q = (0.5 * torch.randn(2, 2, 64, 8, generator=gen)).to(torch.bfloat16).requires_grad_()
    landmarks = (0.5 * torch.randn(2, 2, 16, 8, generator=gen)).requires_grad_()
    rows_in = torch.randn(512, 8, generator=gen).to(torch.bfloat16).requires_grad_()
    residual = torch.randn(512, 8, generator=gen).to(torch.bfloat16)
    weight, bias, branch_bias = (torch.randn(8, generator=gen).requires_grad_() for _ in range(3))

    def soft(backend: str | None) -> Callable[[torch.Tensor, Any], torch.Tensor]:
        return lambda x, route: soft_attention(x, landmarks, x, soft_norm=True, ridge=0.01, precision='bfloat16',
                                               backend=backend, route=route)

    chains = {
        'SOFT op': _chain(soft(None), q, CHAIN_NODES),
        'SOFT op (reference backend)': _chain(soft('reference'), q, CHAIN_NODES),
        'add + LayerNorm': _chain(lambda x, route: add_layer_norm(x, residual, weight, bias, 1e-5,
                                                                  branch_bias=branch_bias, route=route),
                                  rows_in, CHAIN_NODES),
        'layer_norm(x + r) (ATen)': _chain(lambda x, route: F.layer_norm(residual + x + branch_bias.to(x.dtype), (8,),
                                                                         weight, bias, 1e-5).to(x.dtype),
                                           rows_in, CHAIN_NODES),
    }
    cases: dict[str, Callable[[], object]] = {}
    described: dict[str, tuple[str, str, int]] = {}
    for name, run in chains.items():
        with gpu_route(_route_of(args.launchers[0])) as launched:  # (the Triton launches of one chain, counted)
            run()
        launches = sum(launched.values()) // CHAIN_NODES
        for launcher in (args.launchers if launches else args.launchers[:1]):
            case = name if launcher == args.launchers[0] else f'{name} ({launcher})'
            cases[case] = on_route(run, _route_of(launcher))
            described[case] = name, launcher, launches
    times = interleaved_medians(cases, args.rounds, args.repeats, torch.device('cpu'))
    rows = []
    for case, seconds in times.items():
        name, launcher, launches = described[case]
        node_us = 1e6 * seconds / CHAIN_NODES
        rows.append(dict(part='chains', case=case, model=name, launcher=launcher if launches else '—',
                         nodes=CHAIN_NODES, us_per_node=node_us, launches_per_node=launches,
                         us_per_launch=node_us / launches if launches else None))
    return rows


# --- the command line

def _launchers(value: str) -> str:
    if value not in LAUNCHERS:
        raise argparse.ArgumentTypeError(f'invalid choice: {value!r} (choose from {", ".join(LAUNCHERS)})')
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    add_sizes_argument(parser, ['64x64'], 'input size (tiny: the host\'s work, not the arithmetic)')
    parser.add_argument('--batch', type=int, default=2, help='images per batch (default: 2, mmdet\'s per GPU)')
    parser.add_argument('--parts', nargs='+', choices=PARTS,
                        help='what to time (default: both where mmdet and mmcv\'s ops import, else backbones)')
    parser.add_argument('--width-divisor', type=int, choices=WIDTH_DIVISORS, default=DEFAULT_WIDTH_DIVISOR,
                        help='every layer\'s channels divided by this (the same operators and launches, little '
                             f'arithmetic; 1: the models\' own widths; default: {DEFAULT_WIDTH_DIVISOR})')
    parser.add_argument('--launchers', nargs='+', type=_launchers, default=list(DEFAULT_LAUNCHERS),
                        help='how the Triton kernels are launched, a row of SOFT each: \'plan\' (the package\'s '
                             'launch plans) and \'kernel[grid]\' (triton\'s JITFunction.run), both through triton\'s '
                             'real launch path to a stand-in driver; or \'empty\' alone (the interpreter\'s route, '
                             f'every launch empty, the meter before launchers were counted) (default: '
                             f'{" ".join(DEFAULT_LAUNCHERS)})')
    parser.add_argument('--cpu-route', action='store_true',
                        help='also time SOFT\'s step on the CPU route (its own CPU kernels), for contrast')
    parser.add_argument('--threads', type=int, default=1, help='torch threads (default: 1, as a GPU step\'s host)')
    add_rounds_arguments(parser, 'work_dirs/host_time')
    args = parser.parse_args(argv)
    check_positive(parser, args, 'batch', 'threads')
    if 'empty' in args.launchers and len(args.launchers) > 1:
        parser.error('--launchers: \'empty\' runs alone (the interpreter\'s route; the others need it off)')
    if args.parts is None:
        args.parts = list(PARTS) if mmdet_available() is None else ['backbones', 'chains']
    elif 'retinanet' in args.parts:
        missing = mmdet_available()
        if missing is not None:
            parser.error(f'--parts retinanet needs mmdet and mmcv\'s compiled ops ({missing})')
    return args


def tables(rows: list[dict], described: dict[str, Any]) -> str:
    titles = {'backbones': ('Backbones: forward under autocast, backward of the maps\' means, zero_grad', 'model'),
              'retinanet': ('RetinaNet: model.train_step (data preprocessor, forward, loss, backward, optimizer step, '
                            'zero_grad)', 'detector')}
    lines = []
    for part, (title, what) in titles.items():
        part_rows = [r for r in rows if r['part'] == part]
        if not part_rows:
            continue
        lines += ['', f'## {title}', '', f'| input | {what} | route | launcher | ms a step | ÷ SOFT\'s | ATen ms | '
                  'other ms | launches a step (Triton) | µs a launch |', '|---|---|---|---|---|---|---|---|---|---|']
        for r in part_rows:
            differs = r['launches'] != r['full_width_launches']
            launches = f"{r['launches']:,} ({r['triton']:,})" + (
                f" **≠ {r['full_width_launches']:,} at full width**" if differs else '')
            launcher = r['launcher'] if r['triton'] else '—'
            lines.append(f"| {r['hw'][0]}x{r['hw'][1]} | {r['model']} | {r['route'].upper()} | {launcher} | "
                         f"{r['ms']:.2f} | {r['ratio']:.2f} | {r['aten_ms']:.2f} | {r['non_aten_ms']:.2f} | "
                         f"{launches} | {r['us_per_launch']:.1f} |")
    chain_rows_ = [r for r in rows if r['part'] == 'chains']
    if chain_rows_:
        title = f'## Chains of {CHAIN_NODES} nodes, forward and backward (host µs a node, and a Triton launch)'
        lines += ['', title, '',
                  '| node | launcher | µs a node | Triton launches a node | µs a launch |', '|---|---|---|---|---|']
        for r in chain_rows_:
            per_launch = '—' if r['us_per_launch'] is None else f"{r['us_per_launch']:.1f}"
            lines.append(f"| {r['model']} | {r['launcher']} | {r['us_per_node']:.1f} | {r['launches_per_node']} | "
                         f"{per_launch} |")
    for name, description in described.items():
        lines.append(f'\n{name}: ' + ', '.join(f'{key} {value}' for key, value in description.items()))
    return '\n'.join(lines).lstrip('\n') + '\n'


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from soft_mm.ops import triton_route

    interpret = 'empty' in args.launchers
    if triton_route.interpreting() != interpret or not triton_route.triton_available():
        need = 'TRITON_INTERPRET=1' if interpret else 'TRITON_INTERPRET unset'
        raise SystemExit(f'host_time: --launchers {" ".join(args.launchers)} needs {need} before triton is imported '
                         f'(run the script as a command: it sets it) and triton >= '
                         f'{".".join(map(str, triton_route.MIN_TRITON))}')
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    rows: list[dict] = []
    described: dict[str, Any] = {}
    try:
        for hw in args.sizes:
            if 'backbones' in args.parts:
                rows += backbone_rows(args, hw)
            if 'retinanet' in args.parts:
                rows += retinanet_rows(args, hw, described)
        if 'chains' in args.parts:
            rows += chain_rows(args)
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)
    width = ('the models\' own widths' if args.width_divisor == 1 else
             f'every layer\'s channels / {args.width_divisor} (launches counted at both widths)')
    how = ('every Triton launch empty (the interpreter\'s route: not included, Triton\'s own launcher and the '
           'driver)' if interpret else
           f'every Triton launch through triton\'s real launch path (the launcher of each row: \'plan\', the '
           f'package\'s launch plans; \'kernel[grid]\', triton\'s JITFunction.run with its binder and cache lookup) '
           f'to a stand-in driver of sm_{STUB_TARGET} that runs no kernel')
    header = (f'host time per training step, batch {args.batch}, {width}, bfloat16 autocast, CPU tensors on the GPU '
              f'route with {how} (route CPU: SOFT\'s own CPU kernels), median of {args.rounds} interleaved rounds x '
              f'{args.repeats} calls; {args.threads} thread(s), denormals flushed; torch {torch.__version__}, on '
              f'{cpu_model()}. ATen ms: the ATen operators\' own host time (the profiler\'s self time of aten:: '
              'events, a mean of 3 profiled steps); other ms: the rest of the step (the package\'s Python, '
              'autograd\'s Functions and engine, the launcher). Included: Python, autograd, autocast, the '
              'dispatcher, the CPU\'s arithmetic on the small tensors. Not included: the CUDA driver\'s launch and the '
              'caching allocator, CUDA autocast\'s float32 norms and losses, the GPU\'s work.')
    write_results(args.out, 'host_time', header + '\n\n' + tables(rows, described), args, header=header, rows=rows,
                  detectors=described)
    return 0


if __name__ == '__main__':
    sys.exit(main())
