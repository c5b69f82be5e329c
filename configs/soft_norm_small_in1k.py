# SOFT-Norm-Small on ImageNet-1k: 24M parameters, published top-1 82.4; the authors' recipe (see _base_/soft_in1k.py).
#   bash tools/dist_train.sh configs/soft_norm_small_in1k.py 8
_base_ = ['./_base_/soft_in1k.py']

model = dict(model_name='soft_norm_small')
