"""soft_mm.utils.compile_backbone_for_inference: the backbone compiled in place, its state-dict keys unchanged (so a
checkpoint loaded afterwards lands in it), the compiled forward run by dynamo and equal to eager."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from soft_mm.cli import compile_backbone_for_inference
from soft_mm.models import SOFT

NARROW_ARCH = {'embed_dims': (16, 32, 48, 64), 'num_heads': (1, 2, 2, 2), 'depths': (1, 1, 1, 1)}


class Detector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = SOFT(NARROW_ARCH, soft_norm=True)
        self.backbone.init_weights()  # the weights training starts from
        self.neck = nn.Conv2d(64, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.neck(self.backbone(x)[-1])


def test_backbone_compiled_in_place_keeps_its_keys_and_loads_weights_afterwards():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model, trained = Detector().eval(), Detector().eval()
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01 * torch.randn_like(p))
    keys = list(model.state_dict())
    backbone = compile_backbone_for_inference(model, 'aot_eager')
    assert backbone is model.backbone and list(model.state_dict()) == keys  # no _orig_mod. prefix
    model.load_state_dict(trained.state_dict())  # as the runner loads the checkpoint after the tool compiled
    x = torch.randn(1, 3, 70, 90)
    with torch.no_grad():
        compiled, eager = model(x), trained(x)
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)
    assert torch._dynamo.utils.counters['stats']['unique_graphs'] >= 1  # dynamo ran the backbone


def test_unknown_compile_backend_is_refused():
    with pytest.raises(ValueError, match=r"--compile takes one of \('inductor', 'aot_eager', 'eager'\), got 'tvm'"):
        compile_backbone_for_inference(Detector(), 'tvm')


def test_inductor_freezes_this_backbone_only_and_leaves_the_global_setting(monkeypatch):
    # freezing goes with the backbone's own compile options (inductor applies them to its compilations only); the
    # global flag, which every later torch.compile in the process would read, is left as it was
    import torch._inductor.config as inductor_config

    calls = []
    monkeypatch.setattr(torch, 'compile', lambda fn, **kwargs: calls.append(kwargs) or fn)
    before = inductor_config.freezing
    compile_backbone_for_inference(Detector(), 'inductor')
    compile_backbone_for_inference(Detector(), 'aot_eager')
    assert calls == [{'backend': 'inductor', 'options': {'freezing': True}}, {'backend': 'aot_eager'}]
    assert inductor_config.freezing is before
