"""soft_mm/models/settings.py: a misspelled argument of a SOFT model or attention layer is answered with the closest
name first ("did you mean") and the model's own arguments apart from the attention settings, in one sentence."""
from __future__ import annotations

import pytest
import timm

from soft_mm.models import SOFT, SoftVisionTransformer
from soft_mm.models.attention import SoftAttention
from soft_mm.models.settings import FIELDS, UnknownArgumentError, attention_settings, constructor_arguments

SETTINGS = 'landmark_mode, landmark_grid, newton_iters, newton_ridge, newton_backward'
SOFT_ARGUMENTS = ('arch, soft_norm, in_channels, out_indices, frozen_stages, norm_eval, with_cp, drop_path_rate, '
                  'soft_block_norm, qk_init_std, compile_stages, norm_cfg, init_cfg, partial_pretrained')


@pytest.mark.parametrize(('keyword', 'closest'), [
    ('arhc', 'arch'), ('softnorm', 'soft_norm'), ('out_indice', 'out_indices'), ('frozen_stage', 'frozen_stages'),
    ('landmark_gird', 'landmark_grid'), ('newton_iter', 'newton_iters')])
def test_a_misspelled_backbone_argument_names_the_closest_and_both_lists(keyword, closest):
    with pytest.raises(TypeError) as error:
        SOFT(**{keyword: 1})
    assert isinstance(error.value, UnknownArgumentError)
    assert str(error.value) == (f"SOFT() got an unexpected keyword argument '{keyword}' (did you mean '{closest}'?): "
                                f'its arguments are {SOFT_ARGUMENTS}, and its attention settings {SETTINGS}')


def test_the_lists_are_read_from_the_signature_and_the_settings():
    assert ', '.join(constructor_arguments(SOFT)) == SOFT_ARGUMENTS
    assert ', '.join(FIELDS) == SETTINGS


def test_several_unknown_arguments_and_one_with_no_close_name():
    with pytest.raises(UnknownArgumentError, match=r"^SOFT\(\) got unexpected keyword arguments 'arhc' \(did you mean "
                                                   r"'arch'\?\) and 'zzz': its arguments are arch, "):
        SOFT(zzz=1, arhc='tiny')


def test_the_timm_classifier_names_its_own_arguments():
    with pytest.raises(UnknownArgumentError, match=r"^SoftVisionTransformer\(\) got an unexpected keyword argument "
                                                   r"'num_clases' \(did you mean 'num_classes'\?\): its arguments are "
                                                   r'arch, soft_norm, in_chans, num_classes, .*, and its attention '
                                                   rf'settings {SETTINGS}$'):
        timm.create_model('soft_tiny', num_clases=10)
    with pytest.raises(UnknownArgumentError, match=r"'in_channel' \(did you mean 'in_chans'\?\)"):
        SoftVisionTransformer(in_channel=1)


def test_an_attention_layer_names_the_closest_setting():
    with pytest.raises(UnknownArgumentError, match=rf"^unknown SOFT attention setting 'landmark_gird' \(did you mean "
                                                   rf"'landmark_grid'\?\); allowed: {SETTINGS}$"):
        SoftAttention(64, 2, landmark_gird=3)
    with pytest.raises(UnknownArgumentError, match=r"^unknown SOFT attention settings 'a' and 'b'; allowed"):
        attention_settings(b=1, a=2)


def test_known_settings_still_apply():
    model = SOFT('tiny', landmark_mode='avg', landmark_grid=5, newton_iters=3)
    assert (model.attention_settings.landmark_mode, model.attention_settings.landmark_grid,
            model.attention_settings.newton_iters) == ('avg', 5, 3)
