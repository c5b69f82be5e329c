"""soft_mm's one checkpoint reader (soft_mm/utils/checkpoint/reader.py) and every kind of bad file through it: the
library (read_checkpoint, the converter's load_official_checkpoint / load_converted_checkpoint, the library's
refusing default) and the command lines that read checkpoints (convert_official_checkpoint, export_onnx, get_flops)."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from helpers.repo import ROOT
from helpers.tool_process import run_python

from soft_mm.models.checkpoint_conversion import (
    convert_official_checkpoint,
    load_converted_checkpoint,
    load_official_checkpoint,
)
from soft_mm.utils.checkpoint.reader import (
    CheckpointFileError,
    UnsafeCheckpointError,
    describe_load_error,
    read_checkpoint,
)


class _Opaque:  # a pickled object outside the allow-list
    pass


# kind -> the sentence read_checkpoint gives for it, after the path (a regex)
READER_MESSAGES = {
    'missing': r'not found: pass the path of an existing checkpoint\.',
    'folder': r'is a folder, not a checkpoint file: pass a \.pth file written by torch\.save',
    'empty': r'is empty: copy it again or use an earlier checkpoint',
    'truncated': r'is truncated \(the file ends before the checkpoint does\): copy it again',
    'corrupt': r'is corrupt \(its zip archive cannot be read\): copy it again',
    'text': r'is not a PyTorch checkpoint \(torch\.load cannot read it\): pass a \.pth file written by torch\.save',
    'pickled': r'holds a pickled \S*_Opaque, which torch\.load\(weights_only=True\) refuses to run: only if you trust',
}


def write_bad_files(folder: Path) -> dict[str, Path]:
    """One file of every kind that the reader refuses (``missing`` is not written)."""
    good = folder / 'good.pth'
    torch.save({'state_dict': {'w': torch.arange(4000.0)}}, good)
    data = good.read_bytes()
    files = {kind: folder / f'{kind}.pth' for kind in READER_MESSAGES}
    files['folder'].mkdir()
    files['empty'].write_bytes(b'')
    files['truncated'].write_bytes(data[: len(data) // 2])
    files['corrupt'].write_bytes(data[:200] + bytes(100) + data[300:])
    files['text'].write_text('these are not weights\n')  # an IndexError deep inside the unpickler
    torch.save({'state_dict': {'w': torch.ones(2)}, 'trainer': _Opaque()}, files['pickled'])
    return files


@pytest.fixture
def bad_files(tmp_path: Path) -> dict[str, Path]:
    return write_bad_files(tmp_path)


@pytest.mark.parametrize('kind', list(READER_MESSAGES))
def test_every_bad_file_is_one_sentence_naming_it(bad_files, kind):
    path = bad_files[kind]
    with pytest.raises(CheckpointFileError, match=rf'^{re.escape(str(path))} {READER_MESSAGES[kind]}') as error:
        read_checkpoint(path)
    message = str(error.value)
    assert error.value.path == str(path) and message.endswith('.') and '\n' not in message
    assert isinstance(error.value, UnsafeCheckpointError) == (kind == 'pickled')


def test_full_unpickling_only_when_asked(bad_files):
    path = bad_files['pickled']
    with pytest.raises(UnsafeCheckpointError, match=r'refuses to run: pass allow_pickle=True\.$'):
        read_checkpoint(path, unsafe_advice='pass allow_pickle=True')  # the caller's advice for a refused pickle
    with pytest.warns(UserWarning, match=r'holds a pickled \S*_Opaque, which .* weights_only=False, which unpickles'):
        checkpoint = read_checkpoint(path, allow_pickle=True)
    assert isinstance(checkpoint['trainer'], _Opaque) and checkpoint['state_dict']['w'].tolist() == [1.0, 1.0]
    # allow_pickle does not turn any other bad file into something readable
    with pytest.raises(CheckpointFileError, match=READER_MESSAGES['truncated']):
        read_checkpoint(bad_files['truncated'], allow_pickle=True)


def test_allowed_unpickling_of_a_class_that_is_gone(tmp_path, monkeypatch):
    module = types.ModuleType('soft_mm_test_gone_module')
    exec('class Trainer:\n    pass\n', module.__dict__)  # a class whose module disappears
    module.Trainer.__module__ = module.__name__
    monkeypatch.setitem(sys.modules, module.__name__, module)
    path = tmp_path / 'old.pth'
    torch.save({'trainer': module.Trainer()}, path)
    monkeypatch.delitem(sys.modules, module.__name__)
    with pytest.warns(UserWarning, match='weights_only=False'), pytest.raises(
            CheckpointFileError, match=rf"^{re.escape(str(path))} cannot be unpickled \(ModuleNotFoundError: No module "
                                       r"named 'soft_mm_test_gone_module'\): install the package that defines"):
        read_checkpoint(path, allow_pickle=True)


def test_zip_files_are_memory_mapped_and_legacy_files_read(tmp_path):
    path = tmp_path / 'zip.pth'
    torch.save({'w': torch.arange(6.0)}, path)
    loaded = read_checkpoint(path)['w']
    assert loaded.tolist() == list(range(6))
    maps = Path('/proc/self/maps')
    if maps.exists():  # Linux: the file is mapped into this process while its tensors live (not read into a copy)
        assert str(path) in maps.read_text()
    legacy = tmp_path / 'legacy.pth'  # the pre-zip format cannot be memory-mapped: read plainly
    torch.save({'w': torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    assert read_checkpoint(legacy)['w'].tolist() == [1.0, 1.0]


def test_permission_denied_is_described():
    problem, advice = describe_load_error(PermissionError(13, 'Permission denied'))
    assert problem == 'cannot be read (permission denied)' and advice.startswith('make it readable')


def test_one_reader_no_other_torch_load():
    """Every checkpoint soft_mm and its tools read goes through read_checkpoint: no other torch.load call exists."""
    calls = []
    for folder in ('soft_mm', 'tools'):
        for source in sorted((ROOT / folder).rglob('*.py')):
            for node in ast.walk(ast.parse(source.read_text())):
                func = node.func if isinstance(node, ast.Call) else None
                if isinstance(func, ast.Attribute) and func.attr == 'load' and ast.unparse(func.value) in (
                        'torch', 'serialization', 'torch.serialization'):
                    calls.append(f'{source.relative_to(ROOT)}:{node.lineno}')
    # the safe load (torch's allow-list or, on torch < 2.4, soft_mm's) and read_checkpoint's explicitly allowed full
    # unpickling
    files = sorted(call.split(':')[0] for call in calls)
    assert files == ['soft_mm/utils/checkpoint/allow_list.py'] * 2 + ['soft_mm/utils/checkpoint/reader.py'], calls


# --- the converter's readers ----------------------------------------------------------------------------------------

@pytest.mark.parametrize('kind', list(READER_MESSAGES))
def test_official_and_converted_readers_name_the_file(bad_files, kind):
    path = bad_files[kind]
    for read in (load_official_checkpoint, load_converted_checkpoint):
        with pytest.raises(CheckpointFileError, match=rf'^{re.escape(str(path))} ') as error:
            read(path)
        if kind != 'pickled':
            assert re.match(rf'{re.escape(str(path))} {READER_MESSAGES[kind]}', str(error.value))
    if kind == 'pickled':  # each reader's own advice
        with pytest.raises(UnsafeCheckpointError, match=r'only if you trust the file, pass allow_pickle=True \('
                                                        r'tools/model_converters/convert_official_checkpoint.py: '
                                                        r'--allow-unsafe-load\)'):
            load_official_checkpoint(path)
        with pytest.raises(UnsafeCheckpointError, match=r'refuses to run: convert an official file with tools/'):
            load_converted_checkpoint(path)


def test_library_converter_refuses_pickles_by_default(tmp_path, official_tiny):
    path = tmp_path / 'old_soft_tiny.pth'
    torch.save({'state_dict': official_tiny, 'trainer': _Opaque()}, path)
    with pytest.raises(UnsafeCheckpointError, match=r'holds a pickled \S*_Opaque'):
        convert_official_checkpoint(path, verify=False)  # as the command line does without --allow-unsafe-load
    with pytest.warns(UserWarning, match='weights_only=False'):
        converted = convert_official_checkpoint(path, verify=False, allow_pickle=True)
    assert converted.source_key == 'state_dict'


def test_files_without_a_state_dict_name_the_file_and_the_fix(tmp_path):
    path = tmp_path / 'meta_only.pth'
    torch.save({'epoch': 3, 'meta': {'lr': 0.1}}, path)
    with pytest.raises(CheckpointFileError, match=rf"^{re.escape(str(path))} has no usable state dict \(found no state "
                                                  r"dict in the checkpoint.*\): pass one of the SOFT authors'"):
        load_official_checkpoint(path)
    with pytest.raises(CheckpointFileError, match=rf'^{re.escape(str(path))} is not a converted SOFT checkpoint '
                                                  r'\(it needs a state_dict and a meta with an arch\): convert an '
                                                  r'official file with '
                                                  r'tools/model_converters/convert_official_checkpoint.py'):
        load_converted_checkpoint(path)
    listed = tmp_path / 'list.pth'
    torch.save([torch.ones(1)], listed)
    with pytest.raises(CheckpointFileError, match=r'holds a list, not a checkpoint dict or a state dict: pass one'):
        load_official_checkpoint(listed)
    with pytest.raises(ValueError, match=r"key='weights' is not one of"):  # a bad argument stays the caller's error
        load_official_checkpoint(path, key='weights')


# --- command lines --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('kind', list(READER_MESSAGES))
def test_converter_command_line_one_line_per_kind(bad_files, kind, load_tool, capsys):
    path, dst = bad_files[kind], bad_files['missing'].parent / 'out' / 'never.pth'
    assert load_tool('model_converters/convert_official_checkpoint').main([str(path), str(dst)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f'error: {path} ') and err.count('\n') == 1, err
    expected = (r'holds a pickled \S*_Opaque, which torch\.load\(weights_only=True\) refuses to run: only if you trust '
                r'the file, pass --allow-unsafe-load' if kind == 'pickled' else READER_MESSAGES[kind])
    assert re.match(rf'error: {re.escape(str(path))} {expected}', err), err
    assert not dst.parent.exists()


def test_converter_command_line_other_layout_and_unwritable_output(tmp_path, official_tiny, load_tool, capsys):
    tool = load_tool('model_converters/convert_official_checkpoint')
    resnet = tmp_path / 'resnet.pth'
    torch.save({'state_dict': {'conv1.weight': torch.zeros(64, 3, 7, 7)}}, resnet)
    assert tool.main([str(resnet), str(tmp_path / 'x.pth')]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f'error: cannot convert {resnet}: no block1.* keys') and err.count('\n') == 1
    assert err.endswith("; pass one of the SOFT authors' ImageNet checkpoints (a timm/DeiT-style dict or a bare "
                        'state dict of their model).\n')
    src = tmp_path / 'soft_tiny.pth'
    torch.save({'state_dict': official_tiny}, src)
    (tmp_path / 'taken').write_text('a file where the output folder should be\n')
    dst = tmp_path / 'taken' / 'out.pth'
    assert tool.main([str(src), str(dst), '--no-verify']) == 1
    err = capsys.readouterr().err
    assert err.startswith(f'error: {dst} cannot be written (') and err.count('\n') == 1, err
    assert err.endswith('pass a file path in a folder you can write to.\n')


CONVERTER = 'model_converters/convert_official_checkpoint.py'


def _run(tool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_python(ROOT / 'tools' / tool, *args, cwd=cwd, timeout=300)


def test_converter_process_exit_status_one_line_and_debug(bad_files):
    folder = bad_files['missing'].parent
    for kind in ('text', 'pickled'):
        plain = _run(CONVERTER, str(bad_files[kind]), 'out.pth', cwd=folder)
        assert plain.returncode == 1 and 'Traceback' not in plain.stderr
        assert plain.stderr.startswith(f'error: {bad_files[kind]} ') and plain.stderr.count('\n') == 1, plain.stderr
        debug = _run(CONVERTER, str(bad_files[kind]), 'out.pth', '--debug', cwd=folder)
        assert debug.returncode == 1 and 'Traceback (most recent call last)' in debug.stderr
        assert re.search(r'\b(CheckpointFile|UnsafeCheckpoint)Error: ', debug.stderr)
        assert 'torch/serialization.py' in debug.stderr  # and torch's own error, its cause
    assert not (folder / 'out.pth').exists()


def test_export_onnx_bad_checkpoints_one_sentence(bad_files, tmp_path, load_tool):
    tool = load_tool('deployment/export_onnx')
    for kind in ('truncated', 'pickled'):
        with pytest.raises(SystemExit) as exit_:
            tool.main(['classifier', '--checkpoint', str(bad_files[kind]), '--check'])
        assert re.match(rf'{re.escape(str(bad_files[kind]))} {READER_MESSAGES[kind]}', str(exit_.value))
    with pytest.raises(CheckpointFileError):  # --debug: the error itself, with its traceback
        tool.main(['classifier', '--checkpoint', str(bad_files['truncated']), '--check', '--debug'])
    other = tmp_path / 'other.pth'
    torch.save({'state_dict': {'conv1.weight': torch.zeros(1)}}, other)
    with pytest.raises(SystemExit, match=rf"^{re.escape(str(other))} lacks \d+ of the model's \d+ weights \(e\.g\. "
                                         r"'\S+'\): pass a checkpoint of the same arch\.$"):
        tool.main(['backbone', '--checkpoint', str(other), '--check'])
    config = tmp_path / 'resnet.py'
    config.write_text("model = dict(backbone=dict(type='ResNet', depth=18))\n")
    with pytest.raises(SystemExit, match=rf"^{re.escape(str(config))} has a model.backbone that is not SOFT"):
        tool.main(['backbone', '--config', str(config), '--check'])


def test_get_flops_bad_files_one_sentence(bad_files, tmp_path, load_tool):
    tool = load_tool('analysis_tools/get_flops')
    with pytest.raises(SystemExit) as exit_:
        tool.main(['--checkpoint', str(bad_files['empty'])])
    assert re.match(rf'{re.escape(str(bad_files["empty"]))} {READER_MESSAGES["empty"]}', str(exit_.value))
    with pytest.raises(SystemExit, match=r'^nothing.py not found: pass the path of a config file'):
        tool.main(['--config', 'nothing.py'])
    broken = tmp_path / 'broken.py'
    broken.write_text('model = dict(\n')
    with pytest.raises(SystemExit, match=rf'^{re.escape(str(broken))} cannot be parsed'):
        tool.main(['--config', str(broken)])
    with pytest.raises(CheckpointFileError):
        tool.main(['--checkpoint', str(bad_files['empty']), '--debug'])
