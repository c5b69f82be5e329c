"""A small synthetic image-classification dataset in the class-folder layout (``root/{train,val}/<class>/*.png``).

The ImageNet demo config pretrains SOFT-Tiny on it in minutes on a CPU with no download. Its ten classes differ only
in spatial structure: every image draws its foreground and background colours at random (with a minimum contrast, on
a noisy gradient), so no class can be told by colour; textures vary in period, phase and a small tilt, shapes in
position, size and rotation::

    hstripes  near-horizontal stripes     vstripes  near-vertical stripes     diagonal  stripes at +-45 degrees
    plaid     a grid of thin lines        checker   tilted checkerboard       target    concentric rings
    dots      4-8 small disks scattered   disk      filled circle             ring      circle outline
    cross     rotated plus sign

Every class is unchanged by a horizontal flip (diagonal stripes of either direction are one class), so the recipe's
random flip keeps the labels right.

Class indices follow mmpretrain's ``CustomDataset`` rule, the sorted folder names: :data:`CLASS_NAMES` is that sorted
tuple.

Only numpy and OpenCV are needed; mmpretrain is not imported here.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np

from .synthetic_shapes import _background, _contrasting_colour, _publish_atomically, _with_defaults, shape_polygon

SPLITS = ('train', 'val')
Colour = tuple[int, int, int]


def _centre_radius(rng: np.random.Generator, size: int) -> tuple[tuple[float, float], float]:
    radius = rng.uniform(0.28, 0.42) * size
    centre = rng.uniform(radius + 1, size - radius - 1, size=2)
    return (float(centre[0]), float(centre[1])), float(radius)


def _thickness(radius: float) -> int:
    return max(2, round(radius * 0.22))


def _draw_polygon(image: np.ndarray, rng: np.random.Generator, kind: str, colour: Colour, filled: bool) -> None:
    centre, radius = _centre_radius(rng, image.shape[0])
    polygon = np.round(shape_polygon(kind, centre, radius, rng.uniform(0, 2 * np.pi))).astype(np.int32)
    if filled:
        cv2.fillPoly(image, [polygon], colour, lineType=cv2.LINE_AA)
    else:
        cv2.polylines(image, [polygon], True, colour, _thickness(radius), lineType=cv2.LINE_AA)


def _disk(image: np.ndarray, rng: np.random.Generator, colour: Colour) -> None:
    _draw_polygon(image, rng, 'circle', colour, filled=True)


def _ring(image: np.ndarray, rng: np.random.Generator, colour: Colour) -> None:
    _draw_polygon(image, rng, 'circle', colour, filled=False)


def _cross(image: np.ndarray, rng: np.random.Generator, colour: Colour) -> None:
    (cx, cy), radius = _centre_radius(rng, image.shape[0])
    half_width = max(1.5, 0.2 * radius)
    angle = rng.uniform(0, np.pi / 2)
    for theta in (angle, angle + np.pi / 2):  # two perpendicular bars through the centre
        along = np.array([np.cos(theta), np.sin(theta)])
        across = np.array([-along[1], along[0]])
        corners = [np.array([cx, cy]) + sa * radius * along + sc * half_width * across
                   for sa, sc in ((-1, -1), (1, -1), (1, 1), (-1, 1))]
        cv2.fillPoly(image, [np.round(corners).astype(np.int32)], colour, lineType=cv2.LINE_AA)


def _stripe_field(rng: np.random.Generator, size: int, tilt: float) -> np.ndarray:
    """``(size, size)`` bool: stripes of period 6-12 px (at 64 px) whose normal is at ``tilt`` (radians) from y."""
    period = rng.uniform(6, 12) * size / 64
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float64)
    coordinate = ys * np.cos(tilt) + xs * np.sin(tilt) + rng.uniform(0, period)
    return (coordinate % period) < period / 2


def _small_tilt(rng: np.random.Generator) -> float:
    return rng.uniform(-np.pi / 12, np.pi / 12)


def _hstripes(image: np.ndarray, rng: np.random.Generator, colour: Colour) -> None:
    image[_stripe_field(rng, image.shape[0], _small_tilt(rng))] = colour


def _vstripes(image: np.ndarray, rng: np.random.Generator, colour: Colour) -> None:
    image[_stripe_field(rng, image.shape[0], np.pi / 2 + _small_tilt(rng))] = colour


def _diagonal(image: np.ndarray, rng: np.random.Generator, colour: Colour) -> None:
    direction = np.pi / 4 if rng.random() < 0.5 else -np.pi / 4
    image[_stripe_field(rng, image.shape[0], direction + _small_tilt(rng))] = colour


def _plaid(image: np.ndarray, rng: np.random.Generator, colour: Colour) -> None:
    size = image.shape[0]
    tilt = _small_tilt(rng)
    period = rng.uniform(7, 12) * size / 64
    width = max(1.0, period / 4)
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float64)
    u = xs * np.cos(tilt) - ys * np.sin(tilt) + rng.uniform(0, period)
    v = xs * np.sin(tilt) + ys * np.cos(tilt) + rng.uniform(0, period)
    image[((u % period) < width) | ((v % period) < width)] = colour


def _target(image: np.ndarray, rng: np.random.Generator, colour: Colour) -> None:
    size = image.shape[0]
    centre = rng.uniform(0.25 * size, 0.75 * size, size=2)
    period = rng.uniform(7, 12) * size / 64
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float64)
    image[(np.hypot(xs - centre[0], ys - centre[1]) % period) < period / 2] = colour


def _checker(image: np.ndarray, rng: np.random.Generator, colour: Colour) -> None:
    size = image.shape[0]
    tilt = _small_tilt(rng)
    cell = rng.uniform(6, 11) * size / 64
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float64)
    u = xs * np.cos(tilt) - ys * np.sin(tilt) + rng.uniform(0, 2 * cell)
    v = xs * np.sin(tilt) + ys * np.cos(tilt) + rng.uniform(0, 2 * cell)
    image[(np.floor(u / cell) + np.floor(v / cell)) % 2 == 0] = colour


def _dots(image: np.ndarray, rng: np.random.Generator, colour: Colour) -> None:
    size = image.shape[0]
    radius = max(2.0, rng.uniform(0.05, 0.08) * size)
    wanted = int(rng.integers(4, 9))
    centres: list[np.ndarray] = []
    for _ in range(wanted * 30):
        if len(centres) == wanted:
            break
        centre = rng.uniform(radius + 1, size - radius - 1, size=2)
        if all(np.hypot(*(centre - c)) > 3 * radius for c in centres):
            centres.append(centre)
    for centre in centres:
        cv2.circle(image, tuple(round(v) for v in centre), round(radius), colour, -1, cv2.LINE_AA)


_DRAWERS: dict[str, Callable[[np.ndarray, np.random.Generator, Colour], None]] = {
    'checker': _checker, 'cross': _cross, 'diagonal': _diagonal, 'disk': _disk, 'dots': _dots, 'hstripes': _hstripes,
    'plaid': _plaid, 'ring': _ring, 'target': _target, 'vstripes': _vstripes}
# Class names in mmpretrain's CustomDataset order (sorted folder names): index i is CLASS_NAMES[i].
CLASS_NAMES = tuple(sorted(_DRAWERS))


def draw_class_image(rng: np.random.Generator, class_name: str, size: int = 32) -> np.ndarray:
    """One ``(size, size, 3)`` BGR uint8 image of ``class_name`` (one of :data:`CLASS_NAMES`)."""
    if class_name not in _DRAWERS:
        raise ValueError(f'class_name must be one of {CLASS_NAMES}, got {class_name!r}')
    image, background = _background(rng, size)
    _DRAWERS[class_name](image, rng, _contrasting_colour(rng, background))
    return image


def write_classes_dataset(root: str | os.PathLike, num_train_per_class: int = 200, num_val_per_class: int = 50,
                          image_size: int = 32, seed: int = 0) -> None:
    """Write ``root/{train,val}/<class>/<index>.png`` for every class of :data:`CLASS_NAMES`.

    Args:
        root: the dataset folder (created if needed; existing files are overwritten).
        num_train_per_class, num_val_per_class: images per class in each split (balanced classes).
        image_size: side of the square images in pixels (at least 32).
        seed: the same seed always writes the same files; the val split uses a different stream than train.
    """
    for name, value, minimum in (('num_train_per_class', num_train_per_class, 1),
                                 ('num_val_per_class', num_val_per_class, 1), ('image_size', image_size, 32)):
        if not isinstance(value, int) or value < minimum:
            raise ValueError(f'{name} must be an int >= {minimum}, got {value!r}')
    root = Path(root)
    for split, per_class, split_seed in (('train', num_train_per_class, seed),
                                         ('val', num_val_per_class, seed + 1_000_003)):
        rng = np.random.default_rng(split_seed)
        for class_name in CLASS_NAMES:
            folder = root / split / class_name
            folder.mkdir(parents=True, exist_ok=True)
            for index in range(per_class):
                path = folder / f'{index:05d}.png'
                if not cv2.imwrite(str(path), draw_class_image(rng, class_name, image_size)):
                    raise OSError(f'could not write {path}')


def ensure_classes_dataset(root: str | os.PathLike, **generator_kwargs) -> bool:
    """Write the dataset to ``root`` unless ``root`` exists; return whether it was written here.

    Written into a temporary sibling folder renamed to ``root`` in one step (as the shapes data), so several
    processes (e.g. distributed ranks) may call this at once. ``generator_kwargs`` go to
    :func:`write_classes_dataset`.
    """
    counts = _with_defaults(write_classes_dataset, generator_kwargs)
    return _publish_atomically(Path(root), lambda folder: write_classes_dataset(folder, **generator_kwargs),
                               f"the synthetic classes data set ({len(CLASS_NAMES)} classes of "
                               f"{counts['num_train_per_class']} train and {counts['num_val_per_class']} val images)")
