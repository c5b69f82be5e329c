"""mmengine's own checkpoints load with torch's safe loader (``weights_only=True``) once soft_mm.utils is imported."""
import pickle

import numpy as np
import pytest
import torch

pytest.importorskip('mmengine')
from mmengine.logging import HistoryBuffer, MessageHub

from soft_mm.utils import allow_mmengine_checkpoint_globals
from soft_mm.utils.checkpoint import history_buffer_getattr


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
    loaded = torch.load(path, map_location='cpu', weights_only=True)
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
        torch.load(path, weights_only=True)


def test_checkpoint_loads_in_a_fresh_process(tmp_path):
    """No HistoryBuffer exists yet in a new process (as in tools/test.py): the statistics names still resolve."""
    import subprocess
    import sys

    hub = MessageHub.get_instance('soft_mm_checkpoint_fresh')
    hub.update_scalar('train/lr', 0.1)
    torch.save(dict(message_hub=hub.state_dict()), tmp_path / 'hub.pth')
    code = ('import sys, torch; from soft_mm.utils import allow_mmengine_checkpoint_globals; '
            'allow_mmengine_checkpoint_globals(); '
            "print(torch.load(sys.argv[1], weights_only=True)['message_hub']['log_scalars']['train/lr'].current())")
    proc = subprocess.run([sys.executable, '-c', code, str(tmp_path / 'hub.pth')], capture_output=True, text=True,
                          check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout.strip()) == pytest.approx(0.1)
