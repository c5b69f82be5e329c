"""flat_cast: many tensors cast in a few launches, differentiably, with the values and gradients of casting each
(scaled) tensor by itself."""
import pytest
import torch

from soft_mm.ops.functional.flat_cast import flat_cast


def tensors(dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(5, 3), (7,), (2, 3, 4), (1,), (6, 6)]
    return [torch.randn(*shape, generator=gen, dtype=dtype).requires_grad_() for shape in shapes]


@pytest.mark.parametrize('source, target', [(torch.float32, torch.bfloat16), (torch.float32, torch.float16),
                                            (torch.float64, torch.float32)])
def test_values_and_gradients_are_those_of_each_cast_alone(source, target):
    scales = [1.0, 0.42044820762685725, 0.42044820762685725, 1.0, 3.0]
    leaves = tensors(source)
    cast = flat_cast(leaves, target, scales)
    alone = [(t * s).to(target) for t, s in zip(leaves, scales)]
    for a, b, t in zip(cast, alone, leaves):
        assert a.dtype == target and a.shape == t.shape and a.is_contiguous()
        assert torch.equal(a, b)  # the same roundings: bit for bit
    grads = [torch.randn(t.shape, generator=torch.Generator().manual_seed(i)).to(target) for i, t in enumerate(leaves)]
    got = torch.autograd.grad(cast, leaves, grads)
    want = torch.autograd.grad(alone, leaves, grads)
    for a, b in zip(got, want):
        assert a.dtype == source and torch.equal(a, b)


def test_an_unused_output_gets_no_gradient_and_float64_is_exact():
    leaves = tensors(torch.float64)
    cast = flat_cast(leaves, torch.float64, [2.0] * len(leaves))
    (cast[0].sum() * 3).backward()
    assert torch.equal(leaves[0].grad, torch.full_like(leaves[0], 6.0))
    assert all(t.grad is None for t in leaves[1:])
    assert torch.autograd.gradcheck(lambda *t: flat_cast(t, torch.float64, [0.5, 1, 1, 2, 1]),
                                    tuple(t.detach().requires_grad_() for t in leaves))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match='flat_cast: tensors must hold at least one tensor'):
        flat_cast([], torch.bfloat16)
    with pytest.raises(ValueError, match=r"must share one dtype and device, got \[\('torch.float32"):
        flat_cast([torch.ones(2), torch.ones(2, dtype=torch.float64)], torch.bfloat16)
    with pytest.raises(ValueError, match=r'flat_cast: scales must have one float per tensor \(2\), got 1'):
        flat_cast([torch.ones(2), torch.ones(3)], torch.bfloat16, [1.0])
