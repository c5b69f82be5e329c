"""``import soft_mm`` registers with the frameworks that are installed: with mmengine and timm present or absent, in
every combination, it imports and registers what their presence allows; on a bare GPU machine (torch, triton, timm; no
mm* package, no OpenCV) the op layer, the models, the precision rule and the benchmarks' harness import, and where
timm is missing too the op layer still imports and runs (``soft_mm.ops`` needs torch alone). Each runs in a child
process in which the missing packages cannot be imported (tests/helpers/tool_process.py's blocker), from a folder
outside the checkout."""
import subprocess
import sys

import pytest
from helpers.repo import ROOT
from helpers.tool_process import BARE_GPU_MACHINE_LACKS, blocked_imports_env


def run_blocked(tmp_path, code: str, blocked: tuple[str, ...]) -> str:
    env = blocked_imports_env(tmp_path / 'site', blocked)
    env['PYTHONPATH'] += f':{ROOT}:{ROOT / "benchmarks"}'
    proc = subprocess.run([sys.executable, '-c', code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          check=False, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split()


def test_torch_alone_imports_and_runs_the_op_layer(tmp_path):
    code = ('import sys, torch, soft_mm, soft_mm.ops, soft_mm.testing, soft_mm.utils.sizes\n'
            'from soft_mm.ops import soft_attention\n'
            'q = torch.randn(1, 2, 30, 8, dtype=torch.float64)\n'
            'out = soft_attention(q, q[:, :, :30], q, num_iters=40, ridge=0.0, backend="reference")\n'
            'exact = torch.exp(-0.5 * torch.cdist(q, q) ** 2) @ q\n'
            'print(soft_mm.HAS_MMENGINE, soft_mm.HAS_TIMM, (out - exact).abs().max().item() < 1e-6,\n'
            '      sorted(m for m in sys.modules if m.split(".")[0] in ("mmengine", "timm", "cv2", "mmcv")))\n'
            'try:\n'
            '    soft_mm.SOFT\n'
            'except ImportError as err:\n'
            '    print(str(err).split()[:3])\n')
    # m = N landmarks: the Nystrom approximation is the full kernel's S @ v
    assert run_blocked(tmp_path, code, (*BARE_GPU_MACHINE_LACKS, 'timm')) == [
        'False', 'False', 'True', '[]', "['soft_mm.SOFT',", "'needs',", "'mmengine']"]


def test_without_mm_packages_the_timm_models_register_and_the_backbone_says_what_it_needs(tmp_path):
    code = ('import sys, soft_mm, timm, soft_mm.testing, harness\n'
            'from soft_mm.models import SoftPyramid, SoftVisionTransformer\n'
            'print(soft_mm.HAS_MMENGINE, soft_mm.HAS_TIMM, "soft_norm_small" in timm.list_models("soft_*"),\n'
            '      soft_mm.SoftVisionTransformer is SoftVisionTransformer)\n'
            'try:\n'
            '    from soft_mm.models import SOFT\n'
            'except ModuleNotFoundError as err:\n'
            '    print(err.name)\n')
    assert run_blocked(tmp_path, code, BARE_GPU_MACHINE_LACKS) == ['False', 'True', 'True', 'True', 'mmengine']


_REGISTERED = """
import soft_mm
print(soft_mm.HAS_MMENGINE, soft_mm.HAS_TIMM)
if soft_mm.HAS_MMENGINE:  # the hooks and datasets always; the backbone with timm
    from mmengine.registry import DATASETS, HOOKS, MODELS
    print(type(HOOKS.build(dict(type='AttentionHealthHook'))).__name__,
          DATASETS.get('SyntheticShapesDataset') is not None, MODELS.get('SOFT') is not None,
          MODELS.get('SoftTimmClassifier') is not None)
if soft_mm.HAS_TIMM:
    import timm
    print('soft_norm_small' in timm.list_models('soft_*'))
try:
    print(soft_mm.SOFT.__name__)
except ImportError as err:
    print(str(err).split(' (')[0].replace(' ', '_'))
"""


_NEEDS = 'soft_mm.SOFT_needs_mmengine_and_timm'


@pytest.mark.parametrize(('mmengine', 'timm', 'expected'), [
    (True, True, ['True', 'True', 'AttentionHealthHook', 'True', 'True', 'True', 'True', 'SOFT']),
    (True, False, ['True', 'False', 'AttentionHealthHook', 'True', 'False', 'False', _NEEDS]),
    (False, True, ['False', 'True', 'True', _NEEDS]),
    (False, False, ['False', 'False', _NEEDS]),
], ids=['mmengine-timm', 'mmengine-no-timm', 'timm-no-mmengine', 'neither'])
def test_import_soft_mm_with_mmengine_and_timm_present_or_absent(tmp_path, mmengine, timm, expected):
    """The package-import matrix: each combination imports, registering the hooks and datasets with mmengine, the
    backbone and the classifiers only with timm too, the timm models with timm; ``soft_mm.SOFT`` says what it needs."""
    blocked = (() if mmengine else BARE_GPU_MACHINE_LACKS) + (() if timm else ('timm',))
    assert run_blocked(tmp_path, _REGISTERED, blocked) == expected
