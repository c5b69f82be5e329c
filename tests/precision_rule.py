"""The FlashAttention rule for low-precision paths of the SOFT op: a fast path's error against float64 must be
within a small multiple of the error of the plain PyTorch math run in the same low precision."""
from __future__ import annotations

import torch

from soft_mm.ops.attention import plain_soft_attention


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def outputs_and_grads(fn, inputs, grad_out):
    leaves = tuple(t.detach().clone().requires_grad_() for t in inputs)
    out = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, grad_out.to(out.dtype))
    return (out.detach(), *grads)


def rule_errors(fast, inputs, low_dtype, grad_out, **kwargs):
    """``(fast errors, plain errors)``, each a list for the output and the gradients of q, landmarks and v against
    float64; ``fast(*inputs)`` runs on the inputs as given, the plain math on them rounded to ``low_dtype``."""
    reference = outputs_and_grads(lambda *t: plain_soft_attention(*t, **kwargs), [t.double() for t in inputs],
                                  grad_out.double())
    results = outputs_and_grads(fast, inputs, grad_out)
    plain = outputs_and_grads(lambda *t: plain_soft_attention(*t, **kwargs), [t.to(low_dtype) for t in inputs],
                              grad_out.to(low_dtype))
    for tensors in (results, plain):
        assert all(t.dtype in (low_dtype, inputs[0].dtype) for t in tensors)
    return ([relative_error(a, b) for a, b in zip(results, reference)],
            [relative_error(a, b) for a, b in zip(plain, reference)])
