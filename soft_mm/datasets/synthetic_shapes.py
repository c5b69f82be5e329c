"""A small synthetic COCO-format detection / instance-segmentation dataset of coloured shapes.

The demo configs train on it so that the whole detection pipeline (data, model, training, ``CocoMetric``
evaluation, inference) runs in minutes on a CPU with no download. Every object is drawn from the same polygon that
is stored as its COCO segmentation, and its box and area are measured on the drawn pixels, so boxes and masks are
exact. Objects do not overlap, so no mask is occluded.

Layout written under ``root`` (the standard mmdet COCO layout with split names ``train`` and ``val``)::

    root/annotations/instances_train.json
    root/annotations/instances_val.json
    root/train/000000.png ...
    root/val/000000.png ...

Only numpy and OpenCV are needed; mmdet is not imported here.
"""
from __future__ import annotations

import inspect
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np

SHAPE_CLASSES = ('circle', 'square', 'triangle')
SPLITS = ('train', 'val')


def shape_polygon(kind: str, center: tuple[float, float], radius: float, angle: float) -> np.ndarray:
    """Vertices (K×2, x then y, float) of a shape inscribed in the circle of ``radius`` around ``center``.

    ``angle`` (radians) rotates squares and triangles; a circle is a 48-gon.
    """
    num_vertices = {'circle': 48, 'square': 4, 'triangle': 3}.get(kind)
    if num_vertices is None:
        raise ValueError(f'kind must be one of {SHAPE_CLASSES}, got {kind!r}')
    theta = angle + np.arange(num_vertices) * (2 * np.pi / num_vertices)
    return np.stack([center[0] + radius * np.cos(theta), center[1] + radius * np.sin(theta)], axis=1)


BACKGROUNDS = ('gradient', 'texture')


def _background(rng: np.random.Generator, size: int, style: str = 'gradient') -> tuple[np.ndarray, np.ndarray]:
    """A background (size×size×3 uint8) and its mean colour: ``'gradient'``, a noisy linear colour gradient, or
    ``'texture'``, see :func:`_texture`."""
    if style == 'texture':
        return _texture(rng, size)
    start, end = rng.uniform(0, 255, size=(2, 3))
    ramp = np.linspace(0.0, 1.0, size)
    ramp = ramp[:, None] if rng.random() < 0.5 else ramp[None, :]
    image = start + (end - start) * ramp[..., None]
    image = image + rng.normal(0, 8, size=(size, size, 3))
    return np.clip(image, 0, 255).astype(np.uint8), (start + end) / 2


def _texture(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """A cluttered natural-looking texture: colour noise at three scales (blobs of about size/4, size/12 and
    size/32 pixels, like fields, bushes and foliage seen from above), unlabelled distractor ellipses and per-pixel
    noise. Returns the image and its mean colour."""
    base = rng.uniform(40, 200, size=3)
    image = np.broadcast_to(base, (size, size, 3)).astype(np.float64)
    for cells, amplitude in ((4, 45.0), (12, 30.0), (32, 20.0)):
        noise = rng.normal(0, amplitude, size=(cells, cells, 3))
        image = image + cv2.resize(noise, (size, size), interpolation=cv2.INTER_CUBIC)
    for _ in range(int(rng.integers(size // 16, size // 8 + 1))):  # distractors: blobs that are not objects
        center = tuple(int(c) for c in rng.uniform(0, size, size=2))
        axes = tuple(int(a) for a in rng.uniform(2, size / 16, size=2))
        colour = tuple(float(c) for c in np.clip(base + rng.normal(0, 50, size=3), 0, 255))
        cv2.ellipse(image, center, axes, float(rng.uniform(0, 180)), 0, 360, colour, -1)
    image = image + rng.normal(0, 10, size=(size, size, 3))
    return np.clip(image, 0, 255).astype(np.uint8), base


def _contrasting_colour(rng: np.random.Generator, background: np.ndarray, min_contrast: float = 120
                        ) -> tuple[int, int, int]:
    """A random colour at least ``min_contrast`` (summed over channels) away from the background's mean colour."""
    while True:
        colour = rng.uniform(0, 255, size=3)
        if np.abs(colour - background).sum() >= min_contrast:
            return tuple(int(c) for c in colour)


def draw_image(rng: np.random.Generator, size: int, max_objects: int, radius_range: tuple[float, float],
               min_objects: int = 1, background: str = 'gradient', min_contrast: float = 120
               ) -> tuple[np.ndarray, list[dict]]:
    """One image (size×size×3 BGR uint8) and its objects as COCO annotation dicts without ids.

    Objects are placed by rejection sampling so that their boxes (plus a 2-pixel gap) do not overlap.
    """
    image, background_colour = _background(rng, size, background)
    objects: list[dict] = []
    taken: list[tuple[float, float, float, float]] = []
    num_objects = int(rng.integers(min_objects, max_objects + 1))
    for _ in range(num_objects * 20):
        if len(objects) == num_objects:
            break
        radius = rng.uniform(*radius_range)
        center = rng.uniform(radius, size - radius, size=2)
        box = (center[0] - radius - 2, center[1] - radius - 2, center[0] + radius + 2, center[1] + radius + 2)
        if any(box[0] < t[2] and t[0] < box[2] and box[1] < t[3] and t[1] < box[3] for t in taken):
            continue
        label = int(rng.integers(len(SHAPE_CLASSES)))
        polygon = shape_polygon(SHAPE_CLASSES[label], tuple(center), radius, rng.uniform(0, 2 * np.pi))
        polygon = np.round(polygon).astype(np.int32)  # the drawn vertices are the stored ones
        mask = np.zeros((size, size), np.uint8)
        cv2.fillPoly(mask, [polygon], 1)
        ys, xs = np.nonzero(mask)
        if len(xs) == 0:
            continue
        image[mask.astype(bool)] = _contrasting_colour(rng, background_colour, min_contrast)
        x0, y0 = int(xs.min()), int(ys.min())
        objects.append(dict(
            category_id=label + 1,
            bbox=[x0, y0, int(xs.max()) + 1 - x0, int(ys.max()) + 1 - y0],
            area=len(xs),
            segmentation=[polygon.reshape(-1).tolist()],
            iscrowd=0))
        taken.append(box)
    return image, objects


def write_shapes_dataset(root: str | os.PathLike, num_train: int = 800, num_val: int = 100, image_size: int = 128,
                         max_objects: int = 4, radius_range: tuple[float, float] = (10.0, 30.0),
                         seed: int = 0, min_objects: int = 1, background: str = 'gradient',
                         min_contrast: float = 120) -> None:
    """Write both splits of the dataset under ``root`` (created if needed; existing files are overwritten).

    The defaults are the shapes demo (few large shapes on smooth gradients); ``background='texture'`` with many
    small shapes and a low ``min_contrast`` is the dense demo (``configs/_base_/datasets/demo_dense_detection.py``),
    which looks like aerial imagery: many small objects on cluttered ground.

    Args:
        root: the dataset folder.
        num_train, num_val: images per split.
        image_size: side of the square images in pixels.
        max_objects: each image holds ``min_objects`` to ``max_objects`` shapes (fewer when they do not fit).
        radius_range: range of the shapes' circumradius in pixels.
        seed: the same seed always writes the same files.
        min_objects: the fewest shapes an image is drawn with (>= 1).
        background: one of :data:`BACKGROUNDS`.
        min_contrast: the least colour distance (summed over the channels) of a shape from the background's mean.
    """
    if image_size < 2 * radius_range[1] + 4:
        raise ValueError(f'image_size={image_size} is too small for shapes of radius up to {radius_range[1]}')
    if background not in BACKGROUNDS:
        raise ValueError(f'background must be one of {BACKGROUNDS}, got {background!r}')
    if not 1 <= min_objects <= max_objects:
        raise ValueError(f'min_objects must be in [1, max_objects={max_objects}], got {min_objects!r}')
    root = Path(root)
    (root / 'annotations').mkdir(parents=True, exist_ok=True)
    categories = [dict(id=i + 1, name=name, supercategory='shape') for i, name in enumerate(SHAPE_CLASSES)]
    for split, num_images, split_seed in (('train', num_train, seed), ('val', num_val, seed + 1_000_003)):
        rng = np.random.default_rng(split_seed)
        (root / split).mkdir(exist_ok=True)
        images, annotations = [], []
        for image_id in range(1, num_images + 1):
            image, objects = draw_image(rng, image_size, max_objects, radius_range, min_objects, background,
                                        min_contrast)
            file_name = f'{image_id:06d}.png'
            cv2.imwrite(str(root / split / file_name), image)
            images.append(dict(id=image_id, file_name=file_name, height=image_size, width=image_size))
            for obj in objects:
                annotations.append(dict(id=len(annotations) + 1, image_id=image_id, **obj))
        coco = dict(info=dict(description=f'soft_mm synthetic shapes, {split} split, seed {seed}'),
                    images=images, annotations=annotations, categories=categories)
        (root / 'annotations' / f'instances_{split}.json').write_text(json.dumps(coco))


def ensure_shapes_dataset(root: str | os.PathLike, **generator_kwargs) -> bool:
    """Write the dataset to ``root`` unless ``root`` exists; return whether it was written here.

    The files are written to a temporary sibling folder that is then renamed to ``root`` in one step, so a reader
    never sees a half-written dataset and several processes (e.g. two distributed ranks) may call this at once: the
    first rename wins and the others discard their copy.
    ``generator_kwargs`` go to :func:`write_shapes_dataset`.
    """
    counts = _with_defaults(write_shapes_dataset, generator_kwargs)
    return _publish_atomically(Path(root), lambda folder: write_shapes_dataset(folder, **generator_kwargs),
                               f"the synthetic shapes data set ({counts['num_train']} train and "
                               f"{counts['num_val']} val images)")


def write_semantic_labels(root: str | os.PathLike, split: str, out_dir: str | os.PathLike | None = None) -> int:
    """Render the semantic label map of every image of ``split`` from ``root/annotations/instances_{split}.json``.

    Each map is a single-channel uint8 PNG of the image's size with the image's file name: 0 is background and
    ``i + 1`` is ``SHAPE_CLASSES[i]``. Every object is filled with ``cv2.fillPoly`` on its stored (integer) vertices in
    annotation order, exactly as :func:`draw_image` painted it, so a class's pixels are the union of its objects'
    COCO masks and their count is the sum of the objects' ``area``.

    Args:
        root: a dataset folder written by :func:`write_shapes_dataset`.
        split: one of :data:`SPLITS`.
        out_dir: where the maps go (created if needed); ``root/semantic/{split}`` by default.

    Returns:
        The number of label maps written.
    """
    if split not in SPLITS:
        raise ValueError(f'split must be one of {SPLITS}, got {split!r}')
    root = Path(root)
    coco = json.loads((root / 'annotations' / f'instances_{split}.json').read_text())
    label_of_category = {}
    for category in coco['categories']:
        if category['name'] not in SHAPE_CLASSES:
            raise ValueError(f'category {category["name"]!r} of {split} is not one of {SHAPE_CLASSES}')
        label_of_category[category['id']] = SHAPE_CLASSES.index(category['name']) + 1
    polygons_of_image: dict[int, list[tuple[int, list[np.ndarray]]]] = {image['id']: [] for image in coco['images']}
    for ann in sorted(coco['annotations'], key=lambda a: a['id']):
        polygons = [np.asarray(p, np.int32).reshape(-1, 2) for p in ann['segmentation']]
        polygons_of_image[ann['image_id']].append((label_of_category[ann['category_id']], polygons))
    out_dir = Path(out_dir) if out_dir is not None else root / 'semantic' / split
    out_dir.mkdir(parents=True, exist_ok=True)
    for image in coco['images']:
        label_map = np.zeros((image['height'], image['width']), np.uint8)
        for label, polygons in polygons_of_image[image['id']]:
            cv2.fillPoly(label_map, polygons, label)
        if not cv2.imwrite(str(out_dir / image['file_name']), label_map):
            raise OSError(f'could not write {out_dir / image["file_name"]}')
    return len(coco['images'])


def ensure_semantic_labels(root: str | os.PathLike, **generator_kwargs) -> bool:
    """Render ``root/semantic/{train,val}`` unless ``root/semantic`` exists; return whether it was rendered here.

    When ``root`` itself is missing, the whole dataset is first written by :func:`ensure_shapes_dataset` with
    ``generator_kwargs``; an existing dataset (e.g. one the detection demo wrote) only gains its label maps. Like
    ``ensure_shapes_dataset``, the maps of both splits are rendered into a temporary sibling folder that is renamed
    to ``root/semantic`` in one step, so several processes may call this at once.
    """
    root = Path(root)
    ensure_shapes_dataset(root, **generator_kwargs)

    def render_splits(folder: Path) -> None:
        for split in SPLITS:
            write_semantic_labels(root, split, folder / split)

    return _publish_atomically(root / 'semantic', render_splits, 'the label maps of the segmentation demo')


def _with_defaults(function: Callable, kwargs: dict) -> dict:
    """``kwargs`` completed with the defaults of ``function``'s signature (what a call with ``kwargs`` uses)."""
    defaults = {name: p.default for name, p in inspect.signature(function).parameters.items()
                if p.default is not inspect.Parameter.empty}
    return {**defaults, **kwargs}


def _publish_atomically(target: Path, write: Callable[[Path], None], what: str) -> bool:
    """Unless ``target`` exists, run ``write`` on a fresh temporary sibling folder and rename it to ``target``,
    saying what it writes (``what``) before and how long it took after, on stderr as progress goes (stdout keeps a
    run's results): a demo run's first start spends seconds on it, and the user sees why.

    Returns whether ``target`` was published by this call: when several processes race, the first rename wins and
    the others discard their copy.
    """
    if target.exists():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f'.{target.name}.partial-', dir=target.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the data is not
    print(f'writing {what} to {target} (once: later runs read it) ...', file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        write(tmp)
        print(f'wrote {target} in {time.perf_counter() - start:.1f} s', file=sys.stderr, flush=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.exists():
                raise
            return False
        return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
