"""What the package's Triton kernels know of triton's interpreter, in one place: :data:`INTERPRET` and
:func:`loop_bound`, which the kernel modules import, so that no kernel signature carries an interpreter-only constant.

``TRITON_INTERPRET`` is read when a kernel is decorated, and :data:`INTERPRET` when this module is imported:
:func:`soft_mm.ops.triton_route.load_kernels` imports it again, before a kernel module, whenever the setting has changed
since. A compiled kernel sees ``INTERPRET`` as the constant False: the branches it guards are not compiled at all (the
cubins are those of kernels without them). Imports only triton and the standard library (``benchmarks/triton_cubins.py``
compiles the kernels without torch).
"""
import os

import triton
import triton.language as tl

__all__ = ['INTERPRET', 'loop_bound']

# True where the kernels run in triton's interpreter (TRITON_INTERPRET=1 when this module was imported)
INTERPRET = tl.constexpr(os.environ.get('TRITON_INTERPRET', '0') == '1')


@triton.jit
def loop_bound(bound):
    """A ``for`` loop's run-time ``bound`` (a kernel argument or a value computed from one): ``bound`` itself when
    compiled; under the interpreter the Python int it holds. triton 3.6's interpreter turns a loop bound into an int
    with ``int()`` of its one-element numpy array, which numpy >= 2.4 refuses (triton 3.8 squeezes the array first);
    read here, the bound reaches ``range`` as an int on every triton. (Returned, not assigned: the interpreter makes
    every assigned value a tensor again.)"""
    if INTERPRET:
        return bound.handle.data.item()
    return bound
