# SOFT-Tiny on ImageNet-1k: 13M parameters, published top-1 79.3; the authors' recipe (see _base_/soft_in1k.py).
#   bash tools/dist_train.sh configs/soft_tiny_in1k.py 8
_base_ = ['./_base_/soft_in1k.py']

model = dict(model_name='soft_tiny')
