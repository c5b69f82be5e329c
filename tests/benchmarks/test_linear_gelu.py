"""Tests of benchmarks/linear_gelu.py: a tiny run of SOFT-Norm-Tiny's fc1 layers and backbone, fused, unfused and in
the sigmoid form; the benchmark's own variants compute the library's function, and its ``rule`` column says what the
library runs."""
import json

import pytest
import torch
import torch.nn.functional as F

from soft_mm.models import blocks
from soft_mm.ops.functional import gelu

needs_onednn = pytest.mark.skipif(not gelu.fused_linear_gelu_available(), reason='this PyTorch build has no oneDNN')


def test_tiny_run_times_every_fc1_shape_and_the_three_settings(tmp_path, load_benchmark):
    tool = load_benchmark('linear_gelu')
    assert tool.main(['--arch', 'tiny', '--sizes', '64x96', '--rounds', '1', '--repeats', '1',
                      '--out', str(tmp_path)]) == 0
    assert blocks.linear_gelu is gelu.linear_gelu  # the library's function put back in the MLPs
    assert list(tool.VARIANTS) == ['rule', 'fused_bound', 'fused', 'unfused']
    data = json.loads((tmp_path / 'linear_gelu.json').read_text())
    # SOFT-Tiny's depths (1, 2, 3, 2): one fc1 shape per stage, 64x96 -> 16x24, 8x12, 4x6, 2x3 tokens; the SOFT stages'
    # GELU is tanh's, the softmax stage's erf's
    layers = [(r['tokens'], r['d_in'], r['d_out'], r['approximate'], r['count'], r['rule']) for r in data['layers']]
    assert layers == [(384, 64, 256, 'tanh', 1, 'sigmoid'), (96, 128, 512, 'tanh', 2, 'sigmoid'),
                      (24, 320, 1280, 'tanh', 3, 'sigmoid'), (6, 512, 2048, 'none', 2, 'unfused')]
    assert all(r['fused'] > 0 and r['unfused'] > 0 for r in data['layers'])
    assert [r['sigmoid'] is None for r in data['layers']] == [False, False, False, True]
    backbone, = data['backbone']
    assert backbone['hw'] == [64, 96]
    assert all(backbone[name] > 0 for name in ('rule', 'fused_bound', 'fused', 'unfused'))
    table = (tmp_path / 'linear_gelu.md').read_text()
    assert '| 24 | 320 → 1280 | tanh | 3 |' in table and 'GEMM rate' in table
    assert 'fused_bound / rule' in table and ' fused / rule' in table and 'unfused / rule' in table


def test_rejects_bad_rounds(load_benchmark, capsys):
    with pytest.raises(SystemExit):
        load_benchmark('linear_gelu').parse_args(['--rounds', '0'])
    assert '--rounds and --repeats must be >= 1, got 0 and 2' in capsys.readouterr().err


@needs_onednn
@pytest.mark.parametrize('d_in, approximate', [(64, 'tanh'), (320, 'tanh'), (64, 'none'), (512, 'none')])
def test_the_variants_compute_the_librarys_function_and_the_rule_column_is_what_it_runs(d_in, approximate,
                                                                                         load_benchmark, monkeypatch):
    tool = load_benchmark('linear_gelu')
    gen = torch.Generator().manual_seed(d_in)
    x, weight, bias = torch.randn(2, 37, d_in, generator=gen), 0.05 * torch.randn(96, d_in, generator=gen), \
        torch.randn(96, generator=gen)
    expected = F.gelu(F.linear(x.double(), weight.double(), bias.double()), approximate=approximate)
    with torch.no_grad():
        for name, variant in tool.VARIANTS.items():
            torch.testing.assert_close(variant(x, weight, bias, approximate), expected.float(), rtol=1e-5, atol=1e-5,
                                       msg=name)
        # what linear_gelu runs for the layer: oneDNN's fused kernel, the sigmoid form, or neither (F.gelu)
        ran = []
        fusable, sigmoid_form = gelu._fusable, gelu.gelu_tanh_

        def recorded_fusable(*args):
            dtype = fusable(*args)
            if dtype is not None:
                ran.append('fused')
            return dtype

        monkeypatch.setattr(gelu, '_fusable', recorded_fusable)
        monkeypatch.setattr(gelu, 'gelu_tanh_', lambda *a: ran.append('sigmoid') or sigmoid_form(*a))
        gelu.linear_gelu(x, weight, bias, approximate)
    assert (ran or ['unfused']) == [tool.rule_for(d_in, approximate)]
