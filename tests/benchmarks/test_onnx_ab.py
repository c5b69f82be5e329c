"""benchmarks/onnx_ab.py: ONNX files of one model timed side by side in one onnxruntime process, with their op
counts before and after onnxruntime's optimizations."""
from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip('onnxruntime')
pytest.importorskip('onnx')


class TokensThenConv(torch.nn.Module):
    """A token-major input made a map in one of two ways, then a conv: ``flat`` as ``(B, N, C) -> (B, C, N)``,
    ``nhwc`` as a 4-d NHWC -> NCHW permute."""

    def __init__(self, nhwc: bool) -> None:
        super().__init__()
        self.nhwc = nhwc
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        tokens = x.flatten(2).transpose(1, 2) * 2  # (B, N, C)
        flat = tokens.transpose(1, 2).reshape(b, c, h, w)
        return self.conv(tokens.reshape(b, h, w, c).permute(0, 3, 1, 2) if self.nhwc else flat)


def export(model: torch.nn.Module, path) -> str:
    torch.manual_seed(0)
    with torch.no_grad():
        torch.onnx.export(model.eval(), (torch.randn(1, 8, 16, 24),), str(path), input_names=['input'],
                          opset_version=17, dynamo=False)
    return str(path)


def test_files_are_timed_against_the_first_with_their_op_counts(load_benchmark, tmp_path, capsys):
    tool = load_benchmark('onnx_ab')
    files = [export(TokensThenConv(nhwc), tmp_path / f'{name}.onnx')
             for nhwc, name in ((False, 'flat'), (True, 'nhwc'))]
    out = tmp_path / 'out'
    assert tool.main([*files, '--size', '16x24', '--rounds', '2', '--repeats', '1', '--out', str(out)]) == 0
    table = (out / 'onnx_ab.md').read_text()
    assert table in capsys.readouterr().out and 'median of 2 interleaved rounds' in table
    rows = json.loads((out / 'onnx_ab.json').read_text())['rows']
    assert [row['file'] for row in rows] == files and all(row['s'] > 0 for row in rows)
    assert f'| {files[0]} | {rows[0]["s"]:.4f} | 1.000x |' in table
    # each file's own transposes (two: to tokens and back), counted in the file and in the optimized graph
    assert [row['ops']['Transpose'] for row in rows] == [2, 2]
    assert all(set(row['optimized_ops']) == {'Transpose', 'ReorderInput', 'ReorderOutput'} for row in rows)


def test_bad_file_lists_are_named(load_benchmark, tmp_path, capsys):
    tool = load_benchmark('onnx_ab')
    for argv, message in ((['a.onnx'], 'files: give two or more ONNX files to compare, got 1'),
                          ([str(tmp_path / 'a.onnx'), str(tmp_path / 'b.onnx')], 'files: no such file: '),
                          (['a.onnx', 'b.onnx', '--rounds', '0'], '--rounds and --repeats must be >= 1, got 0 and 2')):
        with pytest.raises(SystemExit):
            tool.parse_args(argv)
        assert message in capsys.readouterr().err
