"""soft_mm/cli (errors.py, config_loading.py, runner.py): config loading, the custom_imports check, checkpoint checks
and one-sentence errors."""
from __future__ import annotations

import pytest
import torch
from mmengine.config import Config
from torch import nn

from soft_mm.cli.config_loading import default_work_dir, load_config, set_work_dir
from soft_mm.cli.errors import ConfigError, explain, one_sentence_errors
from soft_mm.models.arch import resolve_arch
from soft_mm.utils.checkpoint.reader import (
    CheckpointFileError,
    check_state_dict_fits,
    checkpoint_path_of_traceback,
    read_checkpoint,
    state_dict_of,
)


def test_missing_folder_and_unparsable_configs(tmp_path):
    with pytest.raises(ConfigError, match=r'^configs/nothing.py not found: pass the path of a config file'):
        load_config('configs/nothing.py')
    with pytest.raises(ConfigError, match=r'is a folder: pass the path of a config file'):
        load_config(str(tmp_path))
    bad = tmp_path / 'bad.py'
    bad.write_text('model = dict(type="X"\n')
    with pytest.raises(ConfigError, match=rf"^{bad} cannot be parsed \(.* at line 1\): fix the Python syntax"):
        load_config(str(bad))
    bad.write_text("_base_ = ['./missing_base.py']\n")
    with pytest.raises(ConfigError, match=rf'^{bad} cannot be loaded \(FileNotFoundError: .*fix the config or the '
                                          '_base_ files'):
        load_config(str(bad))
    bad.write_text("custom_imports = dict(imports=['no_such_package_xyz'], allow_failed_imports=False)\n")
    with pytest.raises(ConfigError, match=r"cannot be loaded \(ModuleNotFoundError: No module named 'no_such_"):
        load_config(str(bad))


def test_loading_a_config_with_an_mmdet_base_warns_nothing_about_pkg_resources():
    """mmengine imports pkg_resources and reloads it twice to find the mmdet:: scope of a base; setuptools warns at
    each: every tool printed those three warnings."""
    pytest.importorskip('mmdet')
    import warnings

    from helpers.repo import ROOT

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        load_config(str(ROOT / 'configs/retinanet_soft_tiny_demo.py'))
    assert not [str(w.message) for w in caught if 'pkg_resources' in str(w.message)]


def test_soft_without_custom_imports_names_the_fix(tmp_path):
    config = tmp_path / 'det.py'
    config.write_text("model = dict(type='RetinaNet', backbone=dict(type='SOFT', arch='tiny'))\n")
    with pytest.raises(ConfigError, match=r"det.py uses type='SOFT' but does not import soft_mm: add custom_imports = "
                                          r"dict\(imports=\['soft_mm'\], allow_failed_imports=False\)"):
        load_config(str(config))
    config.write_text("custom_hooks = [dict(type='InvalidLossHook')]\n")
    with pytest.raises(ConfigError, match="uses type='InvalidLossHook'"):
        load_config(str(config))
    config.write_text("custom_imports = dict(imports=['soft_mm.datasets'])\nmodel = dict(backbone=dict(type='SOFT'))\n")
    assert load_config(str(config), {'model.backbone.arch': 'small'}).model.backbone.arch == 'small'


def test_registry_key_error_becomes_one_sentence():
    error = KeyError('SOFT is not in the mmdet::model registry. Please check whether the value of `SOFT` is correct')
    assert explain(error) == ("type='SOFT' is not registered in mmdet::model: add custom_imports = dict(imports="
                              "['soft_mm'], allow_failed_imports=False) to the config.")
    assert explain(KeyError('Foo is not in the mmseg::model registry.')).endswith(
        'fix the name, or add the package that defines it to custom_imports in the config.')
    assert explain(KeyError('anything else')) is None and explain(RuntimeError('a bug')) is None


def test_one_sentence_errors_and_debug(tmp_path):
    text = tmp_path / 'notes.pth'
    text.write_text('not a checkpoint\n')
    with pytest.raises(SystemExit) as exc, one_sentence_errors():
        torch.load(str(text), weights_only=True)  # an UnpicklingError from deep inside the unpickler
    assert str(exc.value) == (f'{text} is not a PyTorch checkpoint (torch.load cannot read it): pass a .pth file '
                              'written by torch.save (a trained model, or a converted ImageNet checkpoint).')
    # the original error, not SystemExit, which is no Exception
    with pytest.raises(Exception), one_sentence_errors(debug=True):  # noqa: B017
        torch.load(str(text), weights_only=True)
    with pytest.raises(ZeroDivisionError), one_sentence_errors():  # not the user's mistake: keeps its traceback
        _ = 1 / 0


class _Head:
    """A class some other package registers: its own argument check, deep in code that is not soft_mm's."""

    def __init__(self, channels: int = 1) -> None:
        _check_channels(channels)


def _check_channels(channels: int) -> None:
    if channels < 1:
        raise ValueError(f'a problem inside another package: {channels}')


def test_an_argument_error_of_a_class_built_from_the_config_is_one_sentence():
    """What the registry builds from a config: soft_mm's argument checks and Python's unexpected keyword, with the
    classes being built; another package's internal ValueError keeps its traceback."""
    from mmengine.registry import MODELS

    import soft_mm  # noqa: F401  (registers SOFT)

    def sentence(cfg: dict) -> str | None:
        with pytest.raises((TypeError, ValueError)) as error:
            MODELS.build(cfg)
        return explain(error.value)

    assert sentence(dict(type='SOFT', arhc='tiny')).startswith(
        "the config's SOFT: SOFT() got an unexpected keyword argument 'arhc' (did you mean 'arch'?): its arguments ")
    assert sentence(dict(type='SOFT', arch='giant')).startswith(
        "the config's SOFT: arch='giant' is not a SOFT architecture; valid names: tiny, small, medium, large, huge")
    assert sentence(dict(type=_Head, channel=2)) == (
        "the config's _Head: _Head.__init__() got an unexpected keyword argument 'channel'.")
    assert sentence(dict(type=_Head, channels=0)) is None
    with pytest.raises(ValueError) as outside:  # raised by soft_mm, but not while building from a config
        resolve_arch('giant')
    assert explain(outside.value) is None


def test_soft_mm_debug_gives_the_traceback_back(monkeypatch, tmp_path):
    missing = tmp_path / 'missing.pth'
    with pytest.raises(SystemExit), one_sentence_errors():
        read_checkpoint(missing)
    for value in ('1', 'yes'):
        monkeypatch.setenv('SOFT_MM_DEBUG', value)
        with pytest.raises(CheckpointFileError), one_sentence_errors():
            read_checkpoint(missing)
    monkeypatch.setenv('SOFT_MM_DEBUG', '0')
    with pytest.raises(SystemExit), one_sentence_errors():
        read_checkpoint(missing)


def test_work_dir_defaults():
    assert default_work_dir('configs/retinanet_soft_tiny_demo.py') == 'work_dirs/retinanet_soft_tiny_demo'
    cfg = Config(dict(work_dir='from_config'))
    set_work_dir(cfg, 'configs/x.py', None)
    assert cfg.work_dir == 'from_config'
    set_work_dir(cfg, 'configs/x.py', 'given')
    assert cfg.work_dir == 'given'
    cfg = Config(dict())
    set_work_dir(cfg, 'configs/x.py', None)
    assert cfg.work_dir == 'work_dirs/x'


class Detector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
        self.head = nn.Linear(4, 2)


def test_checkpoint_of_another_model_does_not_fit(tmp_path):
    model = Detector()
    other = tmp_path / 'resnet.pth'
    torch.save({'state_dict': {'conv1.weight': torch.zeros(64, 3, 7, 7), 'fc.weight': torch.zeros(10, 64)}}, other)
    with pytest.raises(CheckpointFileError, match=rf"^{other} does not fit the model: only 0 of its 9 weights are in "
                                                  r"the file \(its keys start with 'conv1.', 'fc.'\): train it"):
        check_state_dict_fits(model, state_dict_of(read_checkpoint(other), other), other, 'the model', 'train it')
    # a whole detector's checkpoint given as a backbone init: the message proposes prefix='backbone.'
    detector = tmp_path / 'detector.pth'
    torch.save({'meta': {}, 'state_dict': {f'module.{k}': v for k, v in model.state_dict().items()}}, detector)
    tensors = state_dict_of(read_checkpoint(detector), detector)
    with pytest.raises(CheckpointFileError, match=r"does not fit model.backbone: only 0 of its 7 weights .* add "
                                                  r"prefix='backbone.' to the init_cfg"):
        check_state_dict_fits(model.backbone, tensors, detector, 'model.backbone', 'convert one')
    assert check_state_dict_fits(model.backbone, tensors, detector, 'model.backbone', '', prefix='backbone.') == 7
    assert check_state_dict_fits(model, tensors, detector, 'the model', '') == 9
    # shapes count: the same names with other shapes are another model
    resized = {k: torch.zeros([s + 1 for s in v.shape] or [2]) for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointFileError, match='only 0 of its 9 weights'):
        check_state_dict_fits(model, resized, detector, 'the model', 'x')


def test_state_dict_of_rejects_non_checkpoints(tmp_path):
    with pytest.raises(CheckpointFileError, match=r'holds a list, not a checkpoint dict'):
        state_dict_of([1, 2], 'x.pth')
    with pytest.raises(CheckpointFileError, match=r'holds no tensors'):
        state_dict_of({'meta': {'epoch': 1}}, 'x.pth')


def test_read_checkpoint_failures(tmp_path):
    good = tmp_path / 'good.pth'
    torch.save({'state_dict': {'w': torch.arange(1000.0)}}, good)
    data = good.read_bytes()
    cases = {'truncated.pth': (data[: len(data) // 2], r'is truncated \(the file ends before the checkpoint does\)'),
             'empty.pth': (b'', r'is empty: copy it again or use an earlier checkpoint'),
             'corrupt.pth': (data[:200] + bytes(100) + data[300:], r'is corrupt \(its zip archive cannot be read\)'),
             'notes.pth': (b'hello\n', r'is not a PyTorch checkpoint')}
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(CheckpointFileError, match=rf'^{tmp_path / name} {message}'):
            read_checkpoint(tmp_path / name)
    torch.save({'args': torch.nn.Identity()}, tmp_path / 'pickled.pth')  # a pickled module: refused, never run
    with pytest.raises(CheckpointFileError, match=r'holds a pickled torch.nn.modules.linear.Identity, which '
                                                  r'torch.load\(weights_only=True\) refuses to run: only if you trust'):
        read_checkpoint(tmp_path / 'pickled.pth')
    legacy = tmp_path / 'legacy.pth'  # the pre-zip format cannot be memory-mapped: read plainly
    torch.save({'w': torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    assert read_checkpoint(legacy)['w'].tolist() == [1.0, 1.0]
    with pytest.raises(Exception) as failure:  # whatever torch.load raises for a file that is no checkpoint
        torch.load(str(tmp_path / 'notes.pth'), weights_only=True)
    assert checkpoint_path_of_traceback(failure.tb) == str(tmp_path / 'notes.pth')
