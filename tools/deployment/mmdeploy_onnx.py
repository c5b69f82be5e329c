"""Deploy a whole soft_mm detector or segmenter to onnxruntime with mmdeploy, and score both models the same way.

    python tools/deployment/mmdeploy_onnx.py CONFIG CHECKPOINT [--work-dir DIR] [--eval [--eval-size HxW ...]]
    python tools/deployment/mmdeploy_onnx.py configs/retinanet_soft_tiny_demo.py \\
        work_dirs/retinanet_soft_tiny_demo/epoch_4.pth --eval --eval-size 192x192

Writes ``DIR/end2end.onnx`` (default DIR: ``work_dirs/deploy/<config name>``): the backbone, neck and head with their
post-processing (a detector's box decoding and NMS, a segmenter's argmax), batch, height and width dynamic, through
mmdeploy 1.3.1's Python API (``torch2onnx``) with the deploy config written here (:func:`deploy_config`), so the
mmdeploy repository is not needed. ``bash tools/install.sh`` installs mmdeploy (``SOFT_MM_WITH_MMDEPLOY=0`` skips it).

The export runs torch's TorchScript-based exporter (``torch.onnx.export(..., dynamo=False)``): since torch 2.9 the
default is the dynamo exporter, which mmdeploy's rewriters predate (every model then fails with "Detected mismatch
between the structure of `inputs` and `dynamic_shapes`").

``--eval`` scores the PyTorch checkpoint and the ONNX model with mmdeploy's own test runner (``build_test_runner``:
the config's test set, pipeline and evaluator) at the config's test size and at every ``--eval-size`` (the test
pipeline's ``Resize`` scale, both models alike), prints one line per size and metric and writes ``DIR/scores.json``.
Detectors with box outputs (RetinaNet, FCOS, ...) and segmenters are covered; instance masks (Mask R-CNN) are not.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import inspect
import json
import numbers
import os.path as osp
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from mmengine.config import Config, DictAction

from soft_mm.cli import check_data_paths
from soft_mm.cli.config_loading import load_config, use_checked_image_loading
from soft_mm.cli.errors import DEBUG_HELP, ConfigError, one_sentence_errors
from soft_mm.cli.runner import check_model_checkpoint, read_model_checkpoint
from soft_mm.utils.config_tree import pipeline_steps
from soft_mm.utils.sizes import size_arg

ONNX_FILE = 'end2end.onnx'
RESIZE = ('Resize', 'mmcv.Resize')  # the test pipeline's step whose scale --eval-size sets
OPSET = 17
MMDEPLOY_VERSION = '1.3.1'
INSTALL_HINT = (f'bash tools/install.sh (or pip install --no-deps mmdeploy=={MMDEPLOY_VERSION} '
                'aenum multiprocess dill: mmdeploy pins protobuf<=3.20.2, which onnx and tensorboard here outgrew)')
BACKENDS = ('pytorch', 'onnxruntime')


def _require_mmdeploy() -> None:
    try:
        import mmdeploy
    except ImportError:
        raise SystemExit(f'mmdeploy is not installed: {INSTALL_HINT}.') from None
    if mmdeploy.__version__ != MMDEPLOY_VERSION:
        raise SystemExit(f'mmdeploy {mmdeploy.__version__} is installed; this tool is written for '
                         f'{MMDEPLOY_VERSION}: {INSTALL_HINT}.')


def _has_mask_head(model_cfg: Any) -> bool:
    roi_head = model_cfg.get('roi_head') if isinstance(model_cfg, dict) else None
    return isinstance(roi_head, dict) and roi_head.get('mask_head') is not None


def deploy_config(cfg: Config, config_path: str = 'the config') -> Config:
    """mmdeploy's deploy config for ``cfg`` (an mmdet detector with box outputs or an mmseg segmenter), onnxruntime
    backend, dynamic batch, height and width. A detector's post-processing takes the model's ``test_cfg`` (score
    threshold, NMS IoU, boxes kept), so the ONNX model keeps what the PyTorch model keeps."""
    scope = cfg.get('default_scope')
    dynamic_input = {'input': {0: 'batch', 2: 'height', 3: 'width'}}
    if scope == 'mmdet':
        if _has_mask_head(cfg.model):
            raise ConfigError(f'{config_path} is an instance segmenter (roi_head.mask_head): this tool deploys '
                              'detectors with box outputs and segmenters; export its backbone with '
                              'tools/deployment/export_onnx.py')
        test_cfg = cfg.model.get('test_cfg') or {}
        nms = test_cfg.get('nms') or {}
        post_processing = {'score_threshold': float(test_cfg.get('score_thr', 0.05)), 'confidence_threshold': 0.005,
                           'iou_threshold': float(nms.get('iou_threshold', 0.5)), 'max_output_boxes_per_class': 200,
                           'pre_top_k': 5000, 'keep_top_k': int(test_cfg.get('max_per_img', 100)),
                           'background_label_id': -1}
        codebase = {'type': 'mmdet', 'task': 'ObjectDetection', 'model_type': 'end2end',
                    'post_processing': post_processing}
        outputs = {'dets': {0: 'batch', 1: 'num_dets'}, 'labels': {0: 'batch', 1: 'num_dets'}}
    elif scope == 'mmseg':
        codebase = {'type': 'mmseg', 'task': 'Segmentation', 'with_argmax': True}
        outputs = {'output': {0: 'batch', 2: 'height', 3: 'width'}}
    else:
        raise ConfigError(f"{config_path} has default_scope={scope!r}: this tool deploys mmdet detectors and mmseg "
                          "segmenters (default_scope 'mmdet' or 'mmseg')")
    onnx_config = {'type': 'onnx', 'export_params': True, 'keep_initializers_as_inputs': False,
                   'opset_version': OPSET, 'save_file': ONNX_FILE, 'input_names': ['input'],
                   'output_names': list(outputs), 'input_shape': None, 'optimize': False,
                   'dynamic_axes': {**dynamic_input, **outputs}}
    return Config({'onnx_config': onnx_config, 'codebase_config': codebase,
                   'backend_config': {'type': 'onnxruntime'}})


_REWRITERS_REGISTERED = False


def register_rewriters() -> None:
    """Register soft_mm's mmdeploy rewriters (once): for onnxruntime, ``F.adaptive_avg_pool2d`` to any size as
    :func:`~soft_mm.ops.functional.pooling.adaptive_avg_pool2d_matmul` (PyTorch's bins, sizes kept symbolic).

    mmdeploy's own rewrite turns it into ``avg_pool2d`` with ``kernel = stride = int(in / out)`` read at the export
    size: frozen there, so another input size pools the wrong windows, and it fails outright (a zero stride) on a map
    smaller than the output, as UperNet's pyramid pooling (scales 1, 2, 3, 6) meets on the 4x4 stage-4 map of a
    128x128 image.
    """
    global _REWRITERS_REGISTERED
    if _REWRITERS_REGISTERED:
        return
    from mmdeploy.core import FUNCTION_REWRITER
    from torch.nn.modules.utils import _pair

    from soft_mm.ops.functional.pooling import adaptive_avg_pool2d_matmul

    @FUNCTION_REWRITER.register_rewriter(func_name='torch.nn.functional.adaptive_avg_pool2d', backend='onnxruntime')
    def adaptive_avg_pool2d__onnxruntime(input: torch.Tensor, output_size) -> torch.Tensor:
        output_size = _pair(output_size)
        if tuple(output_size) == (1, 1):
            return FUNCTION_REWRITER.get_context().origin_func(input, output_size)
        return adaptive_avg_pool2d_matmul(input, output_size)

    _REWRITERS_REGISTERED = True


@contextlib.contextmanager
def legacy_onnx_exporter() -> Iterator[None]:
    """``torch.onnx.export`` defaults to ``dynamo=False`` inside the block (mmdeploy calls it without the argument);
    unchanged on torch < 2.5, whose exporter is only the TorchScript-based one."""
    export = torch.onnx.export
    if 'dynamo' not in inspect.signature(export).parameters:
        yield
        return
    torch.onnx.export = functools.partial(export, dynamo=False)
    try:
        yield
    finally:
        torch.onnx.export = export


def _test_resize(cfg: Config) -> dict:
    for step in pipeline_steps(cfg.test_dataloader.dataset, RESIZE):
        return step
    raise ConfigError('the test pipeline has no Resize step: --eval-size sets its scale')


def _sample_image(cfg: Config) -> np.ndarray:
    """A random image of the test pipeline's scale (what the graph is recorded on; its sizes stay dynamic)."""
    width, height = _test_resize(cfg).get('scale', (224, 224))
    return np.random.default_rng(0).integers(0, 256, (int(height), int(width), 3), dtype=np.uint8)


def task_processor(cfg: Config, deploy_cfg: Config | None = None):
    """mmdeploy's task processor of ``cfg`` (on the CPU): builds the PyTorch and the ONNX model, their inputs and the
    test runner."""
    from mmdeploy.apis import build_task_processor

    return build_task_processor(cfg, deploy_cfg or deploy_config(cfg), 'cpu')


def convert(cfg: Config, checkpoint: str, work_dir: str | Path, config_path: str = 'the config') -> Path:
    """Write ``work_dir/end2end.onnx`` (and ``deploy_config.py``) for the model of ``cfg`` with ``checkpoint``."""
    _require_mmdeploy()
    from mmdeploy.apis import torch2onnx

    deploy_cfg = deploy_config(cfg, config_path)
    state_dict = read_model_checkpoint(checkpoint)  # a missing, truncated or foreign file: one sentence
    check_model_checkpoint(task_processor(cfg, deploy_cfg).build_pytorch_model(None), state_dict, checkpoint)
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    deploy_cfg.dump(str(work_dir / 'deploy_config.py'))
    register_rewriters()
    with legacy_onnx_exporter():
        torch2onnx(_sample_image(cfg), str(work_dir), ONNX_FILE, deploy_cfg, cfg, checkpoint, 'cpu')
    return work_dir / ONNX_FILE


def with_test_size(cfg: Config, size: Sequence[int] | None) -> Config:
    """A copy of ``cfg`` whose test pipeline resizes to ``size`` (H, W), or ``cfg`` itself for None: the test
    loader's, and the top-level ``test_pipeline`` that mmdeploy builds single inputs with."""
    if size is None:
        return cfg
    cfg = copy.deepcopy(cfg)
    scale = (int(size[1]), int(size[0]))  # mmcv's Resize takes (width, height)
    _test_resize(cfg)['scale'] = scale
    for step in pipeline_steps({'pipeline': cfg.get('test_pipeline') or []}, RESIZE):
        step['scale'] = scale
    return cfg


def evaluate(cfg: Config, checkpoint: str, onnx_file: str | Path, work_dir: str | Path,
             size: Sequence[int] | None = None) -> dict[str, dict[str, float]]:
    """``{'pytorch': metrics, 'onnxruntime': metrics}``: both models scored by mmdeploy's test runner on the config's
    test set, with the test pipeline resized to ``size`` (H, W) when given."""
    _require_mmdeploy()
    cfg = with_test_size(cfg, size)
    processor = task_processor(cfg)
    scores = {}
    for backend in BACKENDS:
        model = (processor.build_pytorch_model(checkpoint) if backend == 'pytorch' else
                 processor.build_backend_model([str(onnx_file)], processor.update_data_preprocessor))
        runner = processor.build_test_runner(model, osp.join(str(work_dir), f'eval_{backend}'))
        scores[backend] = {name: float(value) for name, value in runner.test().items()
                           if isinstance(value, numbers.Real)}  # (numpy scalars too; not the copy-paste strings)
    return scores


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='an mmdet detector or mmseg segmenter config')
    parser.add_argument('checkpoint', help='its trained checkpoint')
    parser.add_argument('--work-dir', help='where end2end.onnx goes (default: work_dirs/deploy/<config name>)')
    parser.add_argument('--eval', action='store_true',
                        help="score the checkpoint and the ONNX model with mmdeploy's test runner on the test set")
    parser.add_argument('--eval-size', type=size_arg, nargs='*', default=[],
                        help='further test sizes HxW for --eval (the test Resize scale; the config\'s own is always '
                             'scored)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config entries')
    parser.add_argument('--debug', action='store_true', help=DEBUG_HELP)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with one_sentence_errors(args.debug):
        _require_mmdeploy()
        cfg = load_config(args.config, args.cfg_options)
        use_checked_image_loading(cfg)
        if args.eval:
            check_data_paths(cfg, ('test',))
        work_dir = Path(args.work_dir or osp.join('work_dirs', 'deploy', Path(args.config).stem))
        onnx_file = convert(cfg, args.checkpoint, work_dir, args.config)
        print(f'wrote {onnx_file} (onnxruntime; batch, height and width dynamic)')
        if not args.eval:
            return 0
        width, height = _test_resize(cfg).get('scale')
        results = []
        for size in [None, *args.eval_size]:
            scores = evaluate(cfg, args.checkpoint, onnx_file, work_dir, size)
            label = f'{height}x{width}' if size is None else f'{size[0]}x{size[1]}'
            results.append({'size': label, **scores})
            for metric, value in scores['pytorch'].items():
                onnx_value = scores['onnxruntime'].get(metric, float('nan'))
                print(f'{label} {metric}: pytorch {value:.4f} | onnxruntime {onnx_value:.4f}')
        (work_dir / 'scores.json').write_text(json.dumps(results, indent=1))
    return 0


if __name__ == '__main__':
    sys.exit(main())
