# The RetinaNet demo (retinanet_soft_tiny_demo.py) with each backbone stage compiled by torch.compile (inductor) on its
# first forward, the neck, head and losses eager: the backbone switch `compile_stages` (soft_mm/models/compiled.py).
#   python tools/train.py configs/retinanet_soft_tiny_compiled_demo.py
# Every demo batch is 128x128, so the stages compile for that one size (dynamic=False: a graph per stage for training
# and one for evaluation). For COCO's varying sizes, compile_stages=dict(dynamic=True), or pad every batch to one size
# (mmdet's BatchFixedSizePad, as large-scale-jitter recipes do) and keep dynamic=False; on a GPU,
# dict(mode='reduce-overhead') adds a CUDA graph per size, and pad_size_divisor=256 with it pads the backbone's input
# to a few size buckets (one graph each), the maps cropped back to the batch's own size.
_base_ = './retinanet_soft_tiny_demo.py'

model = dict(backbone=dict(compile_stages=dict(dynamic=False)))
