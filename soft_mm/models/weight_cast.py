"""A stage's GEMM weights cast once per forward under autocast on the GPU route, instead of once per layer call.

On the GPU route (:func:`~soft_mm.ops.triton_route.gpu_route`) under autocast, in eager runs, :func:`weights_cast_once`
casts the weights and biases of a stage's linear layers, of its SOFT layers' landmark convs and, in training mode, of
its downsampling convs in a few :func:`~soft_mm.ops.functional.flat_cast.flat_cast` launches, forward and backward,
and hands each layer its cast tensors: the values autocast would have given it, so the outputs and gradients are the
same. The projections that read the same input come out as one matrix, run as one GEMM (a SOFT layer's query/key and
value projections, ``(2C, C)``, the query rows scaled by SOFT's ``d^-1/4`` as
:meth:`~soft_mm.models.attention.SoftAttention.queries` does it; the softmax stage's query and key/value projections,
``(3C, C)``). Frozen weights are cast apart, checkpointed blocks are handed their cast weights as inputs, and the cast
stands aside where it would be wrong (graphs, CPU runs, saved-tensor hooks, ``DTensor`` or FSDP1 parameters):
docs/advanced/precision_and_backends.md (the weights cast once per stage) says why each.
"""
from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Iterator

import torch
from torch import nn

from ..ops.functional.flat_cast import FlatCastPlan
from ..ops.functional.residual import plain_linear
from ..ops.route import Route
from .attention import SoftAttention, SoftmaxAttention
from .blocks import Block
from .conv import ConvBNAct

__all__ = ['CastWeights', 'cast_once_applies', 'weights_cast_once']

_PLAIN = (torch.Tensor, nn.Parameter)
_LOW = (torch.bfloat16, torch.float16)


@dataclasses.dataclass
class _Cast:
    """One output of the cast: the parameters ``sources`` (``(layer, name)``: one, or projections concatenated along
    their rows) scaled by ``scales``, for ``owner``: a layer's parameter ``key`` swapped in, or an entry ``key`` of an
    attention layer's ``cast_weights``."""

    owner: nn.Module
    key: str
    sources: list[tuple[nn.Module, str]]
    scales: list[float]

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [layer._parameters[name] for layer, name in self.sources]

    @property
    def trainable(self) -> bool:
        return self.tensors[0].requires_grad

    @property
    def entry(self) -> bool:
        """Whether the cast is an entry of the owner's ``cast_weights`` (else the owner's parameter ``key``)."""
        return isinstance(self.owner, (SoftAttention, SoftmaxAttention))


def saved_tensor_hooks_active() -> bool:
    """Whether saved-tensor hooks are active (a non-reentrant checkpoint recording a forward it will recompute,
    activation offloading)."""
    top = getattr(torch._C._autograd, '_top_saved_tensors_default_hooks', None)
    return top is not None and top(False) is not None


def cast_once_applies(stage: nn.Module, x: torch.Tensor, route: Route) -> bool:
    """Whether :func:`weights_cast_once` may cast ``stage``'s weights for input ``x`` on the forward's ``route``: an
    eager call on the GPU route under a low-precision autocast, ``x`` a plain tensor (not a subclass that a weight of
    an earlier stage made it), no saved-tensor hooks around it."""
    return route.gpu and route.autocast in _LOW and type(x) in _PLAIN and not saved_tensor_hooks_active()


def _registered(layer: nn.Module, *names: str) -> bool:
    """Whether ``layer`` holds each of ``names`` as a parameter of its own (not FSDP1's view put in its place)."""
    return all(layer._parameters.get(name) is not None for name in names)


def _group(owner: nn.Module, key: str, layers: list[nn.Linear], name: str, scales: list[float]) -> list[_Cast]:
    """The ``name`` (weight or bias) of ``layers`` as one cast (``owner.cast_weights[key]``), or none where a layer
    has none."""
    if any(getattr(layer, name) is None for layer in layers):
        return []
    return [_Cast(owner, key, [(layer, name) for layer in layers], scales)]


def _projections(owner: nn.Module, layers: list[nn.Linear], scales: list[float]) -> list[_Cast] | None:
    """The projections that read the same input as one weight and one bias (``qkv_weight``, ``qkv_bias``), or None
    where they cannot share a cast (not all plain linear layers holding their parameters, some of them frozen and some
    not, a bias on some only)."""
    if not plain_linear(*layers) or not all(_registered(layer, 'weight') for layer in layers):
        return None
    params = [p for layer in layers for p in (layer.weight, layer.bias) if p is not None]
    if len({p.requires_grad for p in params}) > 1 or len({layer.bias is None for layer in layers}) > 1:
        return None
    if any(layer.bias is not None and not _registered(layer, 'bias') for layer in layers):
        return None
    return (_group(owner, 'qkv_weight', layers, 'weight', scales)
            + _group(owner, 'qkv_bias', layers, 'bias', scales))


def _parameters(module: nn.Module, skip: set[int] = frozenset()) -> list[_Cast]:
    return [_Cast(module, name, [(module, name)], [1.0]) for name, p in module.named_parameters(recurse=False)
            if id(p) not in skip]


def _query_casts(module: SoftAttention, scale: float) -> list[_Cast]:
    """A SOFT layer's query/key weight and bias scaled alone (``query_weight``, ``query_bias``), where its projection
    is a plain linear layer holding them."""
    qk = module.qk
    if not (plain_linear(qk) and _registered(qk, 'weight')) or (qk.bias is not None and not _registered(qk, 'bias')):
        return []
    casts = [_Cast(module, 'query_weight', [(qk, 'weight')], [scale])]
    if qk.bias is not None:
        casts.append(_Cast(module, 'query_bias', [(qk, 'bias')], [scale]))
    return casts


def _casts(stage: nn.Module) -> tuple[list[_Cast], list[ConvBNAct]]:
    """Every cast of ``stage``'s weights, and its conv + BatchNorm modules (whose mode decides whether their weights
    are cast), in one walk of its modules."""
    casts, done, kept, convs = [], set(), set(), []
    for module in stage.modules():
        if isinstance(module, Block):
            # the branches' last biases that join a fused sum and norm (a post-norm block's two, a pre-norm block's
            # attention's) in float32, as add_layer_norm reads them: nothing to cast
            branches = (module.attn, module.mlp) if module.post_norm else (module.attn,)
            kept.update(id(getattr(branch, 'output_bias', None)) for branch in branches)
        elif isinstance(module, SoftAttention):
            merged = _projections(module, [module.qk, module.v], [module.head_dim ** -0.25, 1.0])
            if merged is None:  # the query weights scaled alone; the value projection as any linear layer
                merged = _query_casts(module, module.head_dim ** -0.25)
                done.add(module.qk)
            else:
                done.update((module.qk, module.v))
            casts += merged
            conv = getattr(module, 'landmark_conv', None)
            if type(conv) is nn.Conv2d:
                casts += _parameters(conv)
        elif isinstance(module, SoftmaxAttention):
            merged = _projections(module, [module.q, module.kv], [1.0, 1.0])
            if merged is not None:
                casts += merged
                done.update((module.q, module.kv))
        elif isinstance(module, ConvBNAct):
            convs.append(module)
            if not module.folds() and type(module.conv) is nn.Conv2d:  # (a folding BatchNorm: autocast casts)
                casts += _parameters(module.conv)
        elif type(module) is nn.Linear and module not in done:
            casts += _parameters(module, kept)
    return [cast for cast in casts if all(t.dtype == torch.float32 for t in cast.tensors)], convs


class _StagePlan:
    """A stage's casts worked out once (one walk of its modules, the flat casts' layouts) and reused while the stage's
    modules are where they were, its parameters and their ``requires_grad`` are those it was worked out for and its
    convs fold their BatchNorms as they did; a module replaced, a parameter replaced, frozen or unfrozen, or a mode
    changed makes a new plan."""

    def __init__(self, stage: nn.Module) -> None:
        casts, self.convs = _casts(stage)
        self.modes = [conv.folds() for conv in self.convs]
        self.edges = [(parent, name, child) for parent in stage.modules() for name, child in parent._modules.items()]
        self.sources = [(layer, name, layer._parameters[name]) for cast in casts for layer, name in cast.sources]
        self.flags = [tensor.requires_grad for _, _, tensor in self.sources]
        self.plain = all(type(tensor) in _PLAIN for _, _, tensor in self.sources)
        self.block_index = {id(block): j for j, block in enumerate(getattr(stage, 'blocks', ()))}
        blocks = {id(module): j for j, block in enumerate(getattr(stage, 'blocks', ()))
                  for module in block.modules()}
        self.groups = []
        for group in ([cast for cast in casts if cast.trainable], [cast for cast in casts if not cast.trainable]):
            if group:
                tensors = [t for cast in group for t in cast.tensors]
                plan = FlatCastPlan(tensors, [s for cast in group for s in cast.scales],
                                    [len(cast.sources) for cast in group])
                self.groups.append((group, [blocks.get(id(cast.owner)) for cast in group], tensors, plan))

    def current(self) -> bool:
        """Whether the stage is still as the plan found it."""
        return (all(parent._modules.get(name) is child for parent, name, child in self.edges)
                and all(layer._parameters.get(name) is tensor and tensor.requires_grad == flag
                        for (layer, name, tensor), flag in zip(self.sources, self.flags))
                and all(conv.folds() == mode for conv, mode in zip(self.convs, self.modes)))


# each stage's plan, by the stage object (a copy of the model, e.g. mmengine's EMA model, makes its own)
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _plan(stage: nn.Module) -> _StagePlan:
    plan = _PLANS.get(stage)
    if plan is None or not plan.current():
        plan = _PLANS[stage] = _StagePlan(stage)
    return plan


class CastWeights:
    """The cast weights of one stage's forward, installed on its layers (see :func:`weights_cast_once`); for a
    checkpointed block, :meth:`of_block` and :meth:`run_block` hand its recomputation the same tensors."""

    def __init__(self, block_index: dict[int, int]) -> None:
        self.casts: list[tuple[_Cast, torch.Tensor]] = []
        self.blocks: dict[int, list[int]] = {}  # block index -> positions in casts
        self.block_index = block_index  # id(block) -> its index in the stage

    def add(self, cast: _Cast, low: torch.Tensor, block: int | None) -> None:
        if block is not None:
            self.blocks.setdefault(block, []).append(len(self.casts))
        self.casts.append((cast, low))

    def install(self) -> list[tuple[_Cast, torch.Tensor | None]]:
        """Install every cast; returns what :meth:`restore` puts back."""
        return _install([cast for cast, _ in self.casts], [low for _, low in self.casts])

    def of_block(self, block: nn.Module) -> tuple[torch.Tensor, ...]:
        """The cast tensors of ``block`` (a block of the stage), in a fixed order."""
        index = self._index(block)
        return tuple(self.casts[i][1] for i in self.blocks.get(index, ()))

    def run_block(self, block: nn.Module, tokens: torch.Tensor, hw_shape: tuple[int, int],
                  drop_scales: torch.Tensor | None, route: Route, *tensors: torch.Tensor) -> torch.Tensor:
        """``block(tokens, hw_shape, drop_scales, route)`` with ``tensors`` (:meth:`of_block`'s) installed as its cast
        weights: the forward under a checkpoint, and its recomputation in the backward."""
        casts = [self.casts[i][0] for i in self.blocks.get(self._index(block), ())]
        before = _install(casts, tensors)
        try:
            return block(tokens, hw_shape, drop_scales, route)
        finally:
            _restore(before)

    def _index(self, block: nn.Module) -> int | None:
        return self.block_index.get(id(block))


def _install(casts: list[_Cast], tensors) -> list[tuple[_Cast, torch.Tensor | None]]:
    before = []
    for cast, low in zip(casts, tensors):
        if cast.entry:
            before.append((cast, cast.owner.cast_weights.get(cast.key)))
            cast.owner.cast_weights[cast.key] = low
        else:
            before.append((cast, cast.owner._parameters[cast.key]))
            cast.owner._parameters[cast.key] = low
    return before


def _restore(before: list[tuple[_Cast, torch.Tensor | None]]) -> None:
    for cast, value in reversed(before):
        if cast.entry:
            if value is None:
                cast.owner.cast_weights.pop(cast.key, None)
            else:
                cast.owner.cast_weights[cast.key] = value
        else:
            cast.owner._parameters[cast.key] = value


@contextlib.contextmanager
def weights_cast_once(stage: nn.Module, x: torch.Tensor, route: Route) -> Iterator[CastWeights | None]:
    """Inside, ``stage``'s layers compute with their weights cast once to the autocast dtype (see the module
    docstring), where :func:`cast_once_applies`; yields the :class:`CastWeights` installed (None where nothing is
    cast)."""
    plan = _plan(stage) if cast_once_applies(stage, x, route) else None
    if plan is None or not plan.groups or not plan.plain:
        yield None
        return
    cast = CastWeights(plan.block_index)
    for group, blocks, tensors, flat in plan.groups:
        for one, low, block in zip(group, flat(tensors, route.autocast), blocks):
            cast.add(one, low, block)
    before = cast.install()
    try:
        yield cast
    finally:
        _restore(before)
