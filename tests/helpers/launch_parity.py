"""Run as a script without ``TRITON_INTERPRET``: one training step of a small SOFT-Norm pyramid on the GPU route of a
stand-in sm_90 driver (triton's real launch path, CPU tensors, no kernel run), each Triton launch made twice, once by
``kernel[grid]`` and once by a launch plan from its second use on; prints, as JSON, per kernel the signatures seen and
whether every plan launch handed the driver's launcher exactly what ``kernel[grid]`` handed it.

    python tests/helpers/launch_parity.py [--dtypes bfloat16 float16] [--enter-hook-on float16]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

if os.environ.get('TRITON_INTERPRET') == '1':
    raise SystemExit('launch_parity: run it without TRITON_INTERPRET=1 (the kernels must be compiled ones)')

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from soft_mm.models.pyramid import SoftPyramid
from soft_mm.ops.triton_launch import KernelLauncher, PlannedLauncher, kernel_name, specialization
from soft_mm.ops.triton_route import stubbed_triton_route
from soft_mm.testing.stub_driver import RecordingLauncher, stub_triton_driver

ARCH = {'embed_dims': [16, 32, 48, 64], 'num_heads': [1, 2, 3, 4], 'depths': [1, 2, 1, 1]}


def comparable(value):
    """A launcher argument as it can be compared across two launches: tensors by identity, triton's per-launch
    metadata by its contents, hooks by identity, tuples item by item."""
    if isinstance(value, tuple):
        return tuple(comparable(v) for v in value)
    if isinstance(value, torch.Tensor):
        return ('tensor', id(value))
    kind = type(value).__name__
    if kind == 'LazyDict':
        return ('metadata', tuple(sorted((k, repr(v)) for k, v in value.data.items())),
                tuple(repr(extra) for extra in getattr(value, 'extras', ())))
    if kind == 'HookChain' or callable(value):
        return ('hook', id(value))
    return value


def idle(hook) -> bool:
    return hook is None or (type(hook).__name__ == 'HookChain' and not hook.calls)


def without_idle_hooks(call: tuple) -> tuple:
    """A recorded launch as a plan makes it where triton's launch hooks call nothing (an empty ``HookChain``, the
    default): the per-launch metadata and both hooks None, which is what ``kernel[grid]``'s launch does then too (the
    launcher calls no hook, so nothing reads the metadata); any other launch as it is."""
    name, args = call
    if idle(args[7]) and idle(args[8]):
        args = (*args[:6], None, None, None, *args[9:])
    return name, args


class ComparingLauncher(KernelLauncher):
    """Launches each kernel with ``kernel[grid]``, then twice with a launch plan (the first makes the plan), and
    compares what the driver's launcher got from ``kernel[grid]`` and from the plan's direct launch."""

    exact_values = False

    def __init__(self) -> None:
        self.plan = PlannedLauncher()
        self.jit = KernelLauncher()
        self.seen: dict[str, dict] = {}
        self.with_metadata = 0  # planned launches that handed the launcher triton's per-launch metadata

    def __call__(self, kernel, grid, args, meta) -> None:
        self.last = kernel, grid, args, meta
        calls = RecordingLauncher.calls
        self.jit(kernel, grid, args, meta)
        reference = without_idle_hooks(calls[-1])
        self.plan(kernel, grid, args, meta)
        self.plan(kernel, grid, args, meta)
        planned = calls[-1]
        self.with_metadata += planned[1][6] is not None
        entry = self.seen.setdefault(kernel_name(kernel), {'signatures': set(), 'launches': 0, 'equal': 0})
        entry['signatures'].add(repr((specialization(args), sorted(meta.items()))))
        entry['launches'] += 1
        entry['equal'] += comparable(reference) == comparable(planned) and reference[0] == planned[0]


def stream_read_at_each_launch(launcher: ComparingLauncher) -> bool:
    """Whether a planned launch hands the driver's launcher the stream current at the launch (a CUDA graph is
    captured on a side stream): the last launch made again by its plan after the stand-in driver's stream changed."""
    from triton.runtime import driver

    kernel, grid, args, meta = launcher.last
    stand_in = driver.active
    for stream in (7, 11):
        stand_in.get_current_stream = lambda device=None, stream=stream: stream
        launcher.plan(kernel, grid, args, meta)
        if RecordingLauncher.calls[-1][1][3] != stream:
            return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument('--dtypes', nargs='+', default=['bfloat16', 'float16'])
    parser.add_argument('--enter-hook-on', nargs='*', default=[],
                        help="the dtypes whose step runs with triton's launch_enter_hook set (a profiler's): the "
                             'launcher then gets the per-launch metadata')
    parser.add_argument('--mutate', action='store_true',
                        help='plans pass one argument wrong (the last trailing parameter doubled): the check must '
                             'see it')
    args = parser.parse_args()
    if args.mutate:
        from soft_mm.ops import triton_launch

        trailing = triton_launch._trailing_parameters
        triton_launch._trailing_parameters = lambda kernel, n, meta: (
            lambda values: (*values[:-1], values[-1] * 2) if values else values)(trailing(kernel, n, meta))
    torch.manual_seed(0)
    model = SoftPyramid(ARCH, soft_norm=True, drop_path_rate=0.1).train()
    model.init_pyramid_weights()
    x = torch.randn(2, 3, 64, 64)
    launcher = ComparingLauncher()
    with stub_triton_driver(90, record=True), stubbed_triton_route(90, launcher):
        if not launcher.plan.direct:
            raise SystemExit('launch_parity: this triton has no direct launch (triton < 3.4)')
        import triton

        hooks = triton.knobs.runtime
        default = hooks.launch_enter_hook  # (an empty HookChain on triton >= 3.5, None before)
        for dtype in args.dtypes:
            if dtype in args.enter_hook_on:  # a profiler's hook, as triton's own profiler registers one
                hooks.launch_enter_hook = lambda metadata: None
            try:
                with torch.autocast('cpu', dtype=getattr(torch, dtype)):
                    maps, _ = model.forward_pyramid(x)
                torch.autograd.backward([m.float().mean() for m in maps])
            finally:
                hooks.launch_enter_hook = default
            model.zero_grad(set_to_none=True)
        stream = stream_read_at_each_launch(launcher)
    report = {'triton': triton.__version__, 'stream_read_at_each_launch': stream,
              'planned_launches_with_metadata': launcher.with_metadata, 'kernels': {
        name: {'signatures': len(entry['signatures']), 'launches': entry['launches'], 'equal': entry['equal']}
        for name, entry in sorted(launcher.seen.items())}}
    print(json.dumps(report))
    return 0


if __name__ == '__main__':
    sys.exit(main())
