"""Checks of soft_mm's custom ops that hold on every supported torch (shared by the op tests)."""
from __future__ import annotations

import pytest
import torch
from torch import Tensor

from soft_mm.ops.compat import HAS_CUSTOM_OP
from soft_mm.ops.custom_ops import FunctionOp
from soft_mm.ops.triton_route import TRITON_VERSION

# A test that runs the Triton kernels (under the interpreter on CPU). Skipped where triton is missing (which fails
# under CI=true: the installer installs it); deselected by tests/conftest.py where the installed triton is older than
# the kernels need (torch < 2.8 ships triton < 3.4 and pins it), where the dispatcher's refusal is tested instead.
triton_kernels = [pytest.mark.triton_kernels,
                  pytest.mark.skipif(TRITON_VERSION is None, reason='triton is not installed (bash tools/install.sh '
                                                                    'adds it)')]


def see_the_installed_triton(monkeypatch) -> None:
    """Make the dispatcher decide as with the triton the installer installs (3.8, the one the docs' tables state; an
    older one declines Blackwell, a test of its own), whatever triton runs the test: a decision reads only the
    version, so its rules are checked on the torch matrix's floor (triton 2.1) and GPU-image venv (3.6) too."""
    from soft_mm.ops import triton_route
    from soft_mm.ops.soft import dispatch

    monkeypatch.setattr(triton_route, 'TRITON_VERSION', max(triton_route.TRITON_VERSION or (0,), (3, 8)))
    # the decisions kept under it apart from those of the installed triton (negative versions: this setting's own)
    monkeypatch.setattr(dispatch, '_VERSION', [-1])


# A test that runs float16 autocast or float16 layers on CPU, which torch < 2.3 lacks (float16 GEMMs came in 2.2,
# CPU float16 autocast in 2.3): deselected there by tests/conftest.py.
# Mark a parameter with ``pytest.param(torch.float16, marks=cpu_float16)``.
cpu_float16 = pytest.mark.cpu_float16


def check_custom_op(op, args: tuple) -> None:
    """``torch.library.opcheck`` on torch >= 2.4 (schema, fake kernel against the real one: shapes, dtypes, memory
    layouts; autograd registration; a dynamic-shape AOT trace). On older torch the op is a
    :class:`~soft_mm.ops.custom_ops.FunctionOp`: its outputs equal its kernel's bit for bit, its backward gives every
    input that requires grad a gradient of that input's shape and dtype, and for float64 inputs the gradient of the
    first output equals the numerical one (``torch.autograd.gradcheck``)."""
    assert isinstance(op, FunctionOp), op
    if HAS_CUSTOM_OP:
        results = torch.library.opcheck(op.library_op, args)
        assert set(results.values()) == {'SUCCESS'}, results
        _check_eager_path(op, args)
        return
    outputs = op(*args)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    with torch.no_grad():
        expected = op.forward(*args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert all(torch.equal(out, exp) for out, exp in zip(outputs, expected))
    leaves = [a for a in args if isinstance(a, Tensor) and a.requires_grad]
    grads = torch.autograd.grad(outputs[0], leaves, torch.ones_like(outputs[0]), allow_unused=True)
    assert all(g is not None and g.shape == t.shape and g.dtype == t.dtype for g, t in zip(grads, leaves))
    if all(t.dtype == torch.float64 for t in leaves):
        def first_output(*tensors):
            it = iter(tensors)
            call = [next(it) if isinstance(a, Tensor) and a.requires_grad else a for a in args]
            out = op(*call)
            return out[0] if isinstance(out, tuple) else out

        assert torch.autograd.gradcheck(first_output, tuple(leaves), atol=1e-6, rtol=1e-5, fast_mode=True)


def _check_eager_path(op: FunctionOp, args: tuple) -> None:
    """An eager call runs the kernels under an ``autograd.Function``, not through the custom op's dispatch: outputs and
    gradients equal those of the custom op, bit for bit."""
    leaves = [a for a in args if isinstance(a, Tensor) and a.requires_grad]
    results = []
    for run in (op, op.library_op):
        outputs = run(*args)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        grads = (torch.autograd.grad(outputs[0], leaves, torch.ones_like(outputs[0]), allow_unused=True)
                 if leaves else ())
        results.append((outputs, grads))
    (eager, eager_grads), (library, library_grads) = results
    if leaves and op.function is not None:  # made by the op's own autograd.Function, not by the custom op's autograd
        assert type(eager[0].grad_fn).__name__.startswith(op.name.replace('::', '_')), type(eager[0].grad_fn)
    assert all(torch.equal(a, b) for a, b in zip(eager, library))
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(eager_grads, library_grads))


def grad_fn_name(tensor: Tensor) -> str:
    """The name of the autograd node that made ``tensor`` (``grad_fn.name()`` raises on torch <= 2.11 for the
    nodes of ``autograd.Function``s and custom ops: the node's class name instead)."""
    return type(tensor.grad_fn).__name__
