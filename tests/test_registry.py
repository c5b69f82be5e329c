"""Tests of the registry glue: ``type='SOFT'`` / ``'soft_mm.SOFT'`` from mmengine, mmdet and mmseg, and
``custom_imports=dict(imports=['soft_mm'])`` in a config."""
from __future__ import annotations

import textwrap

import pytest
from helpers.repo import ROOT
from helpers.tool_process import TORCH_ONLY, run_code
from mmengine.registry import MODELS as MMENGINE_MODELS

import soft_mm
from soft_mm.models import SOFT
from soft_mm.registry import MODELS as SOFT_MM_MODELS


def check_tiny(model, out_indices=(0, 1, 2, 3)) -> None:
    assert type(model) is SOFT
    assert model.embed_dims == (64, 128, 320, 512) and model.out_indices == out_indices


def test_registered_in_the_root_and_soft_mm_registries():
    assert MMENGINE_MODELS.get('SOFT') is SOFT
    assert SOFT_MM_MODELS.get('SOFT') is SOFT
    assert SOFT_MM_MODELS.scope == 'soft_mm' and SOFT_MM_MODELS.parent is MMENGINE_MODELS
    assert soft_mm.SOFT is SOFT


def test_another_packages_soft_is_not_replaced(tmp_path):
    # a package that registered its own SOFT in mmengine's root registry first: importing soft_mm stops with one
    # sentence and leaves that class in place (a fresh interpreter: this one has soft_mm's registered)
    script = textwrap.dedent('''
        from mmengine.registry import MODELS

        @MODELS.register_module(name='SOFT')
        class OtherSOFT:
            pass

        try:
            import soft_mm
        except RuntimeError as error:
            print(type(error).__name__, '|', error)
        print(MODELS.get('SOFT').__qualname__)
    ''')
    proc = run_code(script, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout.splitlines()
    assert out == ["RegistryConflictError | soft_mm: model registry 'mmengine' already holds 'SOFT' from "
                   "__main__.OtherSOFT; soft_mm does not replace it: import soft_mm before that package, or give one "
                   "of the two another name", 'OtherSOFT'], out


def test_registering_again_keeps_one_soft():
    from soft_mm.registry import register_all

    register_all()  # (what a second `import soft_mm` after a reload does): no error, the same class
    assert MMENGINE_MODELS.get('SOFT') is SOFT and SOFT_MM_MODELS.get('SOFT') is SOFT


@pytest.mark.parametrize('registry', [MMENGINE_MODELS, SOFT_MM_MODELS], ids=['mmengine', 'soft_mm'])
@pytest.mark.parametrize('type_name', ['SOFT', 'soft_mm.SOFT'])
def test_build_from_mmengine_registries(registry, type_name):
    model = registry.build({'type': type_name, 'arch': 'tiny', 'out_indices': (1, 3), 'soft_norm': True})
    check_tiny(model, (1, 3))
    assert model.soft_norm


@pytest.mark.parametrize('package', ['mmdet', 'mmseg'])
@pytest.mark.parametrize('type_name', ['SOFT', 'soft_mm.SOFT'])
def test_build_from_downstream_registries(package, type_name):
    pytest.importorskip(package)
    registry = __import__(f'{package}.registry', fromlist=['MODELS']).MODELS
    check_tiny(registry.build({'type': type_name, 'arch': 'tiny'}))
    model = registry.build({'type': type_name, 'arch': 'small', 'frozen_stages': 1, 'out_indices': [0, 2]})
    assert model.arch_settings['depths'] == (1, 3, 7, 4) and model.out_indices == (0, 2)
    assert not any(p.requires_grad for p in model.stages[0].parameters())


def run_fresh_python(code: str, preload: tuple[str, ...] = ()) -> str:
    """Run ``code`` in an interpreter where nothing of soft_mm is imported yet, with the repository importable: forked
    from one that imported ``preload`` (:func:`helpers.tool_process.run_code`; empty: the OpenMMLab stack)."""
    result = run_code(textwrap.dedent(code), preload, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


CONFIG = """
custom_imports = dict(imports=['soft_mm'], allow_failed_imports=False)
model = dict(type='SOFT', arch='tiny', out_indices=(1, 2, 3), landmark_mode='avg', landmark_grid=5)
"""


def test_custom_imports_in_a_config_register_soft(tmp_path):
    # In a fresh interpreter SOFT is unknown until the config's custom_imports import soft_mm.
    config = tmp_path / 'soft_tiny_config.py'
    config.write_text(CONFIG)
    out = run_fresh_python(f"""
        import sys
        from mmengine.config import Config
        from mmengine.registry import MODELS
        assert 'soft_mm' not in sys.modules and MODELS.get('SOFT') is None
        cfg = Config.fromfile({str(config)!r})
        assert 'soft_mm' in sys.modules
        model = MODELS.build(cfg.model)
        attn = model.stages[0].blocks[0].attn
        print(type(model).__module__, type(model).__name__, model.out_channels, attn.landmark_mode, attn.landmark_grid)
    """)
    assert out.split() == ['soft_mm.models.backbone', 'SOFT', '[128,', '320,', '512]', 'avg', '5']


def test_custom_imports_in_an_mmdet_config(tmp_path):
    pytest.importorskip('mmdet')
    config = tmp_path / 'soft_tiny_mmdet.py'
    config.write_text("default_scope = 'mmdet'\n" + CONFIG)
    out = run_fresh_python(f"""
        import sys
        from mmengine.config import Config
        from mmengine.registry import DefaultScope
        from mmdet.registry import MODELS
        assert 'soft_mm' not in sys.modules
        cfg = Config.fromfile({str(config)!r})
        model = MODELS.build(cfg.model)
        print(type(model).__module__, type(model).__name__, model.out_channels)
        # as the Runner does: the root registry under the config's default scope
        from mmengine.registry import MODELS as ROOT
        with DefaultScope.overwrite_default_scope(cfg.default_scope):
            print(type(ROOT.build(cfg.model)).__name__)
    """)
    assert out.split() == ['soft_mm.models.backbone', 'SOFT', '[128,', '320,', '512]', 'SOFT']


def test_datasets_are_registered_from_the_datasets_list():
    """One list of the demo dataset classes (soft_mm.datasets.DATASET_CLASSES): ``import soft_mm`` registers each in
    mmengine's root DATASETS as a factory that imports its module on first build."""
    from mmengine.registry import DATASETS

    from soft_mm.datasets import DATASET_CLASSES
    from soft_mm.registry import LAZY_DATASETS

    assert LAZY_DATASETS is DATASET_CLASSES
    assert sorted(DATASET_CLASSES) == ['SyntheticClassesDataset', 'SyntheticShapesDataset', 'SyntheticShapesSegDataset']
    for name in DATASET_CLASSES:
        factory = DATASETS.get(name)
        assert factory.__name__ == name and factory.generates_missing_data is True


def test_importing_the_datasets_imports_no_framework():
    """``import soft_mm.datasets`` registers nothing of its own and imports neither mmdet, mmseg nor mmpretrain; a
    dataset class is imported (with its framework) on first use."""
    out = run_fresh_python("""
        import sys
        import soft_mm.datasets
        print(sorted(m for m in ('mmdet', 'mmseg', 'mmpretrain') if m in sys.modules) or 'none')
    """, TORCH_ONLY)
    assert out.split() == ['none']
