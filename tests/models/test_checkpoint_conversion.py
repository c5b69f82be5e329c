"""Tests of tools/model_converters/convert_official_checkpoint.py: one end-to-end subprocess run, the other cases
through main()."""
from __future__ import annotations

import argparse

import pytest
import torch
from helpers.repo import ROOT
from helpers.tool_process import run_python

from soft_mm.models.checkpoint_conversion import build_classifier_from_checkpoint, load_converted_checkpoint
from soft_mm.utils.checkpoint.reader import CheckpointFileError

TOOL = ROOT / 'tools' / 'model_converters' / 'convert_official_checkpoint.py'


@pytest.fixture(scope='module')
def tool(load_tool):
    return load_tool('model_converters/convert_official_checkpoint')


def test_cli_end_to_end(tmp_path, official_tiny):
    src = tmp_path / 'soft_tiny_norm.pth'
    torch.save({'state_dict': official_tiny, 'epoch': 299, 'args': argparse.Namespace(model='soft_tiny_norm')}, src)
    dst = tmp_path / 'out' / 'soft_norm_tiny_converted.pth'
    result = run_python(TOOL, str(src), str(dst), '--soft-norm', cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "arch    'tiny' (the table entry)" in result.stdout
    assert 'verified strict load into SoftVisionTransformer: 13,069,056 parameters' in result.stdout
    assert 'unmapped none' in result.stdout
    assert 'weights_only=False' not in result.stderr  # the timm file was read safely
    model = build_classifier_from_checkpoint(dst)
    assert model.soft_norm and model.stages[2].blocks[0].attn.newton_ridge == 0.01
    torch.testing.assert_close(model.head.weight.detach(), official_tiny['head.weight'], rtol=0, atol=0)


def test_cli_authors_small_is_announced_as_custom(tmp_path, official_small, tool, capsys):
    src = tmp_path / 'soft_small.pth'
    ema = {k: v.clone() for k, v in official_small.items()}
    ema['head.bias'] += 1
    torch.save({'state_dict': official_small, 'state_dict_ema': ema}, src)
    dst = tmp_path / 'soft_small_converted.pth'
    assert tool.main([str(src), str(dst), '--key', 'state_dict_ema', '--no-verify']) == 0
    out = capsys.readouterr().out
    assert '[state_dict_ema]' in out
    assert "a custom arch, not in the table: closest is 'small', but depths (1, 3, 20, 4) (table: (1, 3, 7, 4))" in out
    assert 'NOT a table arch' in out and "the authors' code's 'small' (depths 1,3,20,4; 38.9M parameters)" in out
    state_dict, meta = load_converted_checkpoint(dst)
    assert meta['arch']['depths'] == [1, 3, 20, 4] and meta['soft_norm'] is False
    torch.testing.assert_close(state_dict['head.bias'], ema['head.bias'], rtol=0, atol=0)


def test_cli_reports_unmapped_keys_and_norm_hint(tmp_path, official_tiny, tool, capsys):
    src = tmp_path / 'soft_tiny_norm.pth'
    torch.save({'module.' + k: v for k, v in {**official_tiny, 'head_dist.bias': torch.zeros(1000)}.items()}, src)
    assert tool.main([str(src), str(tmp_path / 'out.pth'), '--no-verify']) == 0
    captured = capsys.readouterr()
    assert '[bare state dict]' in captured.out
    assert 'unmapped 1 key(s), dropped: head_dist.bias' in captured.out
    assert 'suggests a SOFT-Norm checkpoint' in captured.err


def test_cli_fails_clearly_on_other_layouts(tmp_path, tool, capsys):
    src = tmp_path / 'resnet.pth'
    torch.save({'state_dict': {'conv1.weight': torch.zeros(64, 3, 7, 7), 'fc.weight': torch.zeros(10, 64)}}, src)
    dst = tmp_path / 'never.pth'
    assert tool.main([str(src), str(dst)]) == 1
    err = capsys.readouterr().err
    assert 'error: cannot convert' in err and 'not an official SOFT state dict' in err
    assert not dst.exists()
    assert tool.main([str(tmp_path / 'missing.pth'), str(dst)]) == 1
    assert capsys.readouterr().err == f'error: {tmp_path / "missing.pth"} not found: pass the path of an existing ' \
                                      'checkpoint.\n'


def test_cli_bad_files_stop_with_one_sentence(tmp_path, official_tiny, tool, capsys):
    good = tmp_path / 'soft_tiny.pth'
    torch.save({'state_dict': official_tiny}, good)
    data = good.read_bytes()
    (tmp_path / 'truncated.pth').write_bytes(data[: len(data) // 3])
    (tmp_path / 'notes.pth').write_text('these are not weights\n')
    dst = tmp_path / 'never.pth'
    for name, problem in (('truncated.pth', 'is truncated (the file ends before the checkpoint does): copy it again'),
                          ('notes.pth', 'is not a PyTorch checkpoint (torch.load cannot read it): pass a .pth file')):
        assert tool.main([str(tmp_path / name), str(dst)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f'error: {tmp_path / name} {problem}') and err.count('\n') == 1, err
    with pytest.raises(CheckpointFileError) as exc:  # --debug: the traceback, with torch's own error as its cause
        tool.main([str(tmp_path / 'truncated.pth'), str(dst), '--debug'])
    assert 'central directory' in str(exc.value.__cause__)
    assert not dst.exists() and not list(tmp_path.glob('.*'))


class _Trainer:
    """A pickled object other than argparse.Namespace (as old training scripts stored)."""


def test_cli_refuses_unsafe_unpickling_unless_allowed(tmp_path, official_tiny, tool, capsys):
    src = tmp_path / 'old_soft_tiny.pth'
    torch.save({'state_dict': official_tiny, 'trainer': _Trainer()}, src)
    dst = tmp_path / 'converted.pth'
    assert tool.main([str(src), str(dst), '--no-verify']) == 1
    err = capsys.readouterr().err
    assert err.startswith(f'error: {src} holds a pickled ') and err.count('\n') == 1
    assert '_Trainer, which torch.load(weights_only=True) refuses to run: only if you trust the file, pass ' \
           '--allow-unsafe-load (full unpickling can run code stored in it).' in err
    assert not dst.exists()
    with pytest.warns(UserWarning, match='weights_only=False, which unpickles arbitrary objects'):
        assert tool.main([str(src), str(dst), '--no-verify', '--allow-unsafe-load']) == 0
    state_dict, _ = load_converted_checkpoint(dst)
    torch.testing.assert_close(state_dict['head.weight'], official_tiny['head.weight'], rtol=0, atol=0)
