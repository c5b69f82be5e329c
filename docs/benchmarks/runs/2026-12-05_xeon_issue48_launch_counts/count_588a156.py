"""The launch counts of the code at 588a156 (before issue 48), counted as benchmarks/launch_counts.py counts: the
SOFT op forced to its Triton backend in the interpreter, the value conv on CUDA's route (that code had no GPU route
for CPU tensors). Run from a checkout of the later code, with a worktree of 588a156 beside it:

    git worktree add /tmp/before 588a156
    python docs/benchmarks/runs/2026-12-05_xeon_issue48_launch_counts/count_588a156.py /tmp/before . soft_norm_small

(it writes before_counts.json)
"""
import contextlib
import importlib.util
import json
import os
import sys

os.environ.setdefault('TRITON_INTERPRET', '1')
BEFORE, NOW = sys.argv[1], sys.argv[2]
sys.path.insert(0, BEFORE)
sys.path.insert(0, os.path.join(BEFORE, 'benchmarks'))

import torch  # noqa: E402 (after the paths)

spec = importlib.util.spec_from_file_location('lc_now', os.path.join(NOW, 'benchmarks/launch_counts.py'))
lc = importlib.util.module_from_spec(spec)
# the new tool imports soft_mm.ops.triton_route inside regions(): give it the old backend's loader instead
sys.modules['lc_now'] = lc
spec.loader.exec_module(lc)
import soft_mm  # noqa: E402 (after the paths)

assert soft_mm.__file__.startswith(BEFORE), soft_mm.__file__
from harness import build_backbone  # noqa: E402 (after the paths)

import soft_mm.ops.soft.attention as att  # noqa: E402 (after the paths)
import soft_mm.ops.soft.backends.triton.backend as tb  # noqa: E402 (after the paths)
from soft_mm.ops.functional import head_conv  # noqa: E402 (after the paths)

real_select = att.select
def select(device_type, dtype, precision, num_tokens, needs_grad, mode='eager', name=None, **kw):
    return real_select(device_type, dtype, precision, num_tokens, needs_grad, mode, 'triton', **kw)
att.select = select
real_nchw, real_custom = head_conv.uses_nchw_route, head_conv.uses_custom_backward
head_conv.uses_nchw_route = lambda device_type, k: real_nchw('cuda', k)
head_conv.uses_custom_backward = lambda device_type, k: real_custom('cuda', k)

@contextlib.contextmanager
def regions(counter, model=None):
    stack = counter.regions
    real = tb._kernels
    tb._kernels = lambda: lc._CountingKernels(real(), counter)
    modules = [] if model is None else list(model.modules())
    for m in modules:
        m.forward = lc._watch(stack, m.forward, type(m).__name__)
    patches = []
    import importlib as il
    for path, label in lc.FUNCTIONS.items():
        mod, attr = path.split(':')
        try:
            owner = il.import_module(mod)
        except ImportError:
            continue
        *parents, name = attr.split('.')
        for parent in parents:
            owner = getattr(owner, parent)
        if not hasattr(owner, name):
            continue
        patches.append((owner, name, getattr(owner, name)))
        setattr(owner, name, lc._watch(stack, getattr(owner, name), label))
    try:
        yield
    finally:
        for m in modules:
            del m.forward
        tb._kernels = real
        for owner, name, orig in patches:
            setattr(owner, name, orig)
lc.regions = regions
x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
rows = {}
for name in sys.argv[3:]:
    c = lc.count_model(build_backbone(name, (224, 224)), x, torch.bfloat16)
    rows[name] = {k: lc.tally(v) for k, v in c.items()}
    print(name, rows[name]['forward']['total'], rows[name]['step']['total'], rows[name]['step']['categories'],
          flush=True)
with open('before_counts.json', 'w') as f:
    json.dump(rows, f, indent=1)
