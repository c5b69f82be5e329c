"""What newer torch added, in one place, for every torch soft_mm supports (2.1 up to the newest; pyproject.toml).

Each fact is read once, at import, so that the code ``torch.compile`` traces calls nothing dynamo cannot trace
(dynamo in torch 2.7–2.11 refuses ``torch._C._is_autocast_available`` and ``importlib.util.find_spec``):

* :data:`HAS_CUSTOM_OP` (``torch.library.custom_op``, 2.4), whose absence :mod:`soft_mm.ops.custom_ops` meets with
  an ``autograd.Function``, and :func:`eager_without_custom_ops`: the code calling such ops run eagerly by
  ``torch.compile`` on older torch;
* :func:`is_exporting` (``torch.compiler.is_exporting``, 2.7) and :func:`is_compiling`;
* :func:`autocast_enabled` / :func:`autocast_dtype_of` (``torch.is_autocast_enabled(device_type)`` and
  ``torch.get_autocast_dtype``, 2.4) and :func:`autocast_available` (``torch.amp.is_autocast_available``);
* :func:`float32_precision_switches`, the per-backend float32 matmul switches (``fp32_precision``, 2.9);
* :func:`matmul` and :data:`CPU_FLOAT16_AUTOCAST`: float16 GEMMs (2.2) and float16 autocast (2.3) on CPU;
* :data:`HAS_SAFE_GLOBALS`: ``torch.serialization.add_safe_globals``, the safe loader's allow-list (2.4);
* :func:`dense_grad`: torch 2.1's CPU GELU backward misreads a gradient of other strides than its input.

The tests use the same names, so a feature's absence is decided here and nowhere else.
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Callable

import torch

__all__ = ['CPU_FLOAT16_AUTOCAST', 'CPU_FLOAT16_MATMUL', 'GELU_BACKWARD_TAKES_STRIDED_GRADS', 'HAS_CUSTOM_OP',
           'HAS_IS_EXPORTING', 'HAS_SAFE_GLOBALS', 'TORCH_VERSION', 'autocast_available', 'autocast_dtype_of',
           'autocast_enabled', 'dense_grad', 'eager_without_custom_ops', 'float32_precision_switches', 'is_compiling',
           'is_exporting', 'matmul']

TORCH_VERSION: tuple[int, int] = tuple(int(part) for part in re.match(r'(\d+)\.(\d+)', torch.__version__).groups())
HAS_CUSTOM_OP = hasattr(torch.library, 'custom_op')  # torch >= 2.4
HAS_IS_EXPORTING = hasattr(torch.compiler, 'is_exporting')  # torch >= 2.7
HAS_SAFE_GLOBALS = hasattr(torch.serialization, 'add_safe_globals')  # torch >= 2.4: weights_only's allow-list

# --- graph capture ---------------------------------------------------------------------------------------------------

if HAS_IS_EXPORTING:
    def is_exporting() -> bool:
        """True while ``torch.export`` traces. The flag it sets, read directly: dynamo in torch 2.7–2.13 folds
        ``torch.compiler.is_exporting()`` to True under any trace, ``torch.compile``'s included."""
        return torch.compiler._is_exporting_flag
else:
    def is_exporting() -> bool:
        """False: torch < 2.7 cannot tell ``torch.export`` from ``torch.compile``; the ONNX exporter and
        ``torch.jit.trace`` are told apart by :func:`soft_mm.ops.graph_mode.exporting` itself."""
        return False

# torch >= 2.3 has torch.compiler.is_compiling; 2.1 and 2.2 the same function in torch._dynamo
is_compiling = getattr(torch.compiler, 'is_compiling', None) or torch._dynamo.is_compiling

# --- autocast --------------------------------------------------------------------------------------------------------

_DEVICE_TYPES = ('cpu', 'cuda', 'xpu', 'mps', 'hpu', 'xla', 'meta', 'ipu', 'mtia', 'privateuseone')


def _probe_autocast(device_type: str) -> bool:
    probe = getattr(torch.amp, 'is_autocast_available', None)
    if probe is None:  # torch < 2.4: CPU and CUDA autocast, and the device types torch.autocast names
        return device_type in ('cpu', 'cuda', 'xpu', 'hpu', 'xla')
    try:
        return bool(probe(device_type))
    except RuntimeError:
        return False


_AUTOCAST_AVAILABLE = {device_type: _probe_autocast(device_type) for device_type in _DEVICE_TYPES}


def autocast_available(device_type: str) -> bool:
    """Whether ``device_type`` has autocast (read once at import for the known device types)."""
    return _AUTOCAST_AVAILABLE.get(device_type, False)


if TORCH_VERSION >= (2, 4):
    def autocast_enabled(device_type: str) -> bool:
        """Whether autocast is on for ``device_type``."""
        return autocast_available(device_type) and torch.is_autocast_enabled(device_type)

    def autocast_dtype_of(device_type: str) -> torch.dtype:
        """The dtype autocast casts to on ``device_type`` (whether or not it is on)."""
        return torch.get_autocast_dtype(device_type)
else:
    _ENABLED = {'cpu': torch.is_autocast_cpu_enabled, 'cuda': torch.is_autocast_enabled,
                'xpu': getattr(torch, 'is_autocast_xpu_enabled', None)}
    _DTYPE = {'cpu': torch.get_autocast_cpu_dtype, 'cuda': torch.get_autocast_gpu_dtype,
              'xpu': getattr(torch, 'get_autocast_xpu_dtype', None)}

    def autocast_enabled(device_type: str) -> bool:
        """Whether autocast is on for ``device_type``."""
        query = _ENABLED.get(device_type)
        return query is not None and query()

    def autocast_dtype_of(device_type: str) -> torch.dtype:
        """The dtype autocast casts to on ``device_type`` (whether or not it is on)."""
        query = _DTYPE.get(device_type)
        return query() if query is not None else torch.get_autocast_gpu_dtype()

def _cpu_autocast_takes_float16() -> bool:
    try:
        with warnings.catch_warnings():  # torch < 2.3 warns on construction ("Disabling autocast"), then raises
            warnings.simplefilter('ignore')
            with torch.autocast('cpu', dtype=torch.float16):
                pass
    except RuntimeError:  # torch < 2.3: "AutocastCPU only support Bfloat16"
        return False
    return True


CPU_FLOAT16_AUTOCAST = _cpu_autocast_takes_float16()

# --- matmul ----------------------------------------------------------------------------------------------------------


def _cpu_float16_matmul() -> bool:
    try:
        torch.ones(2, 2, dtype=torch.float16) @ torch.ones(2, 2, dtype=torch.float16)
    except RuntimeError:  # torch < 2.2: "addmm_impl_cpu_" / "baddbmm_with_gemm" not implemented for 'Half'
        return False
    return True


CPU_FLOAT16_MATMUL = _cpu_float16_matmul()


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b``; float16 on a CPU whose torch has no float16 GEMM (< 2.2) as a float16 GEMM with float32
    accumulation computes it: the float16 operands multiplied and summed in float32, the result rounded to float16."""
    if not CPU_FLOAT16_MATMUL and a.dtype == torch.float16 and a.device.type == 'cpu':
        return (a.float() @ b.float()).to(torch.float16)
    return a @ b

# --- gradients of other strides than their input ---------------------------------------------------------------


def _gelu_backward_takes_strided_grads() -> bool:
    x = torch.linspace(-3.0, 3.0, 16 * 32).reshape(16, 32).requires_grad_()
    grad = torch.linspace(-1.0, 1.0, 16 * 32).reshape(32, 16).t()  # the strides of a transpose
    with torch.enable_grad():
        strided, = torch.autograd.grad(torch.nn.functional.gelu(x), x, grad)
        dense, = torch.autograd.grad(torch.nn.functional.gelu(x), x, grad.contiguous())
    return torch.equal(strided, dense)


# torch 2.1's CPU GELU backward misreads a gradient whose strides differ from its input's (garbage, up to 1e32)
GELU_BACKWARD_TAKES_STRIDED_GRADS = _gelu_backward_takes_strided_grads()


class _DenseGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def dense_grad(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself, whose gradient is made contiguous on its way back where torch's GELU backward cannot take
    another layout (torch 2.1 on CPU: :data:`GELU_BACKWARD_TAKES_STRIDED_GRADS`); elsewhere ``x`` unchanged. For an
    op's input that a GELU computed (the SOFT layer's landmarks) and whose gradient the op builds transposed."""
    if GELU_BACKWARD_TAKES_STRIDED_GRADS or not (x.requires_grad and torch.is_grad_enabled()):
        return x
    return _DenseGrad.apply(x)

# --- float32 matmul precision ----------------------------------------------------------------------------------------


def float32_precision_switches() -> dict[str, object]:
    """The per-backend float32 matmul switches of torch >= 2.9, each an object with an ``fp32_precision`` attribute
    (``'ieee'``, ``'tf32'``, ``'bf16'`` or ``'none'``, inherit): cuBLAS and oneDNN. Empty on older torch, which has
    the one process-wide ``torch.set_float32_matmul_precision``."""
    return dict(_FP32_SWITCHES)


def _fp32_switches() -> dict[str, object]:
    if TORCH_VERSION < (2, 9):  # older torch.backends.cuda.matmul raises AssertionError on an unknown attribute
        return {}
    switches = {'cuda': getattr(torch.backends.cuda, 'matmul', None),
                'mkldnn': getattr(torch.backends.mkldnn, 'matmul', None)}
    return {label: owner for label, owner in switches.items() if hasattr(owner, 'fp32_precision')}


_FP32_SWITCHES = _fp32_switches()

# --- custom ops on torch < 2.4 -----------------------------------------------------------------------------------


def eager_without_custom_ops(fn: Callable) -> Callable:
    """``fn`` as it is on torch >= 2.4; on older torch run eagerly by ``torch.compile`` (a graph break at its call):
    dynamo there cannot trace the ops that stand in for the custom ops, and a graph break inside ``fn``'s own
    ``with`` blocks crashes its bytecode rewriting on Python 3.11 (torch 2.1: ``InternalTorchDynamoError``)."""
    return fn if HAS_CUSTOM_OP else torch._dynamo.disable(fn)
