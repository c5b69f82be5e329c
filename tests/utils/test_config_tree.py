"""soft_mm.utils.config_tree: the walk reaches every dict of a config tree, and pipeline_steps gives the steps
themselves (a change through them is a change of the config)."""
from soft_mm.utils.config_tree import config_dicts, pipeline_steps, pretrained_inits


def test_pipeline_steps_finds_steps_of_nested_datasets_in_order_and_they_are_the_configs_own():
    resize = {'type': 'Resize', 'scale': (1333, 800)}
    inner = {'type': 'mmcv.Resize', 'scale': (640, 640)}
    loader = {'dataset': {'type': 'ConcatDataset', 'pipeline': [{'type': 'LoadImageFromFile'}, resize, 'not a step'],
                          'datasets': [{'pipeline': ({'type': 'RandomFlip'}, inner)}]}}
    steps = list(pipeline_steps(loader, ('Resize', 'mmcv.Resize')))
    assert steps == [resize, inner] and steps[0] is resize and steps[1] is inner
    steps[0]['scale'] = (320, 320)
    assert loader['dataset']['pipeline'][1]['scale'] == (320, 320)
    assert list(pipeline_steps(loader, ('Pad',))) == []
    assert list(pipeline_steps({'pipeline': None}, ('Resize',))) == []


def test_config_dicts_and_pretrained_inits_name_the_keys_that_lead_there():
    model = {'backbone': {'init_cfg': {'type': 'Pretrained', 'checkpoint': 'a.pth'}},
             'neck': [{'init_cfg': {'type': 'Pretrained', 'checkpoint': ''}}]}
    keys = [k for k, _ in config_dicts(model)]
    assert keys == [(), ('backbone',), ('backbone', 'init_cfg'), ('neck', 0), ('neck', 0, 'init_cfg')]
    assert [(k, node['checkpoint']) for k, node in pretrained_inits(model)] == [(('backbone',), 'a.pth')]
