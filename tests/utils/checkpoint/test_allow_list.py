"""mmengine's own checkpoints load with torch's safe loader (``weights_only=True``) once soft_mm.utils is imported, and
with soft_mm's ``safe_load`` on every torch (its own allow-list where torch has none, < 2.4)."""
import pickle

import numpy as np
import pytest
import torch

pytest.importorskip('mmengine')
from mmengine.logging import HistoryBuffer, MessageHub

from soft_mm.ops.compat import HAS_SAFE_GLOBALS
from soft_mm.utils import allow_mmengine_checkpoint_globals
from soft_mm.utils.checkpoint import history_buffer_getattr, safe_load


def test_runner_style_checkpoint_loads_with_weights_only(tmp_path):
    hub = MessageHub.get_instance('soft_mm_checkpoint_test')
    for step in range(3):
        hub.update_scalar('train/loss', np.float64(1.0 / (step + 1)))
    hub.update_info('iter', np.int64(3))
    checkpoint = dict(meta=dict(epoch=1, iter=np.int64(3), seed=np.int32(7), dataset_meta=dict(classes=('a', 'b'))),
                      state_dict={'w': torch.ones(2)}, message_hub=hub.state_dict())
    path = tmp_path / 'epoch_1.pth'
    torch.save(checkpoint, path)
    allow_mmengine_checkpoint_globals()
    loaded = safe_load(path, map_location='cpu')
    if HAS_SAFE_GLOBALS:  # torch's own loader reads it the same
        assert torch.load(path, map_location='cpu', weights_only=True).keys() == loaded.keys()
    buffer = loaded['message_hub']['log_scalars']['train/loss']
    assert isinstance(buffer, HistoryBuffer)
    assert buffer.mean() == pytest.approx((1 + 1 / 2 + 1 / 3) / 3) and buffer.current() == pytest.approx(1 / 3)
    assert loaded['meta']['iter'] == 3 and loaded['meta']['seed'] == 7
    assert torch.equal(loaded['state_dict']['w'], torch.ones(2))


def test_getattr_is_limited_to_history_buffer_statistics():
    assert history_buffer_getattr(HistoryBuffer, 'mean') is HistoryBuffer.mean
    with pytest.raises(pickle.UnpicklingError, match='refusing getattr'):
        history_buffer_getattr(HistoryBuffer, '__init__')
    with pytest.raises(pickle.UnpicklingError, match='refusing getattr'):
        history_buffer_getattr(torch, 'load')


class _Payload:
    def __reduce__(self):
        return (getattr, (HistoryBuffer, '__init__'))


def test_other_getattr_payloads_stay_refused(tmp_path):
    path = tmp_path / 'evil.pth'
    torch.save({'x': _Payload()}, path)
    allow_mmengine_checkpoint_globals()
    with pytest.raises(pickle.UnpicklingError, match='refusing getattr'):
        safe_load(path)
    if HAS_SAFE_GLOBALS:
        with pytest.raises(pickle.UnpicklingError, match='refusing getattr'):
            torch.load(path, weights_only=True)


def test_checkpoint_loads_in_a_fresh_process(tmp_path):
    """No HistoryBuffer exists yet in a new process (as in tools/test.py): the statistics names still resolve."""
    import subprocess
    import sys

    hub = MessageHub.get_instance('soft_mm_checkpoint_fresh')
    hub.update_scalar('train/lr', 0.1)
    torch.save(dict(message_hub=hub.state_dict()), tmp_path / 'hub.pth')
    code = ('import sys; from soft_mm.utils.checkpoint import safe_load; '
            "print(safe_load(sys.argv[1])['message_hub']['log_scalars']['train/lr'].current())")
    proc = subprocess.run([sys.executable, '-c', code, str(tmp_path / 'hub.pth')], capture_output=True, text=True,
                          check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout.strip()) == pytest.approx(0.1)


@pytest.fixture(params=['safe_load', 'allow_list_unpickler'])
def loader(request):
    """soft_mm's safe loader as this torch runs it, and its allow-list unpickler (torch < 2.4's) on any torch."""
    if request.param == 'safe_load':
        return safe_load
    from soft_mm.utils.checkpoint.allow_list import _ALLOW_LIST_PICKLE

    return lambda path, **kwargs: torch.load(path, pickle_module=_ALLOW_LIST_PICKLE, weights_only=False, **kwargs)


@pytest.mark.parametrize('legacy_format', [False, True])
def test_both_loaders_read_runner_checkpoints_and_refuse_other_objects(tmp_path, loader, legacy_format):
    hub = MessageHub.get_instance('soft_mm_checkpoint_loaders')
    hub.update_scalar('train/loss', np.float64(0.5))
    state = {'w': torch.arange(6.0).reshape(2, 3), 'b': torch.ones(3, dtype=torch.bfloat16), 'i': torch.tensor([7])}
    path = tmp_path / 'epoch_1.pth'
    torch.save(dict(meta=dict(iter=np.int64(3)), state_dict=state, message_hub=hub.state_dict()), path,
               _use_new_zipfile_serialization=not legacy_format)
    loaded = loader(path, map_location='cpu')
    assert all(torch.equal(loaded['state_dict'][k], v) and loaded['state_dict'][k].dtype == v.dtype
               for k, v in state.items())
    assert loaded['meta']['iter'] == 3
    assert loaded['message_hub']['log_scalars']['train/loss'].current() == pytest.approx(0.5)
    torch.save({'x': _Payload()}, tmp_path / 'getattr.pth')
    with pytest.raises(pickle.UnpicklingError, match='refusing getattr'):
        loader(tmp_path / 'getattr.pth')
    torch.save({'x': torch.nn.Identity()}, tmp_path / 'module.pth')
    with pytest.raises(pickle.UnpicklingError, match=r'GLOBAL torch\.nn\.modules\.linear\.Identity'):
        loader(tmp_path / 'module.pth')
