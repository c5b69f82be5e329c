"""A ``torch.compile`` backend for tests that keeps every graph dynamo hands it (shared by the op and tool tests)."""
from __future__ import annotations

import torch
from torch._dynamo.backends.registry import lookup_backend


class RecordingBackend:
    """Keeps every graph dynamo hands it, then compiles it with ``inner``: a model split by graph breaks gives
    several graphs per compile, one left to eager gives none."""

    def __init__(self, inner: str = 'aot_eager') -> None:
        self.inner = lookup_backend(inner)
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
        self.graphs.append(graph)
        return self.inner(graph, example_inputs)

    def targets(self) -> list:
        """The call_function targets of every recorded graph, in order."""
        return [node.target for graph in self.graphs for node in graph.graph.nodes if node.op == 'call_function']
