# SOFT-Medium on ImageNet-1k: 45M parameters, published top-1 82.9; the authors' recipe (see _base_/soft_in1k.py).
#   bash tools/dist_train.sh configs/soft_medium_in1k.py 8
_base_ = ['./_base_/soft_in1k.py']

model = dict(model_name='soft_medium')
