"""Pixel rendering of symbolic frames: filled shapes on a plain background, one grid cell per object.

The pixel video is a pure function of the ``SymbolicFrames`` (names and grid positions), so
rendering a symbolic view gives exactly the pixel view of the rendered original
(``render_pixels(apply_view(it, v)) == apply_view(render_pixels(it), v)``; tested). An
occluded ``SymObject`` renders as its cell filled with the frame's mean colour *outside*
that cell, which is also what the pixel ``occlude`` view writes (the mean outside, so the
hidden object's own colour does not leak into the fill).

Boxes are ``(x0, y0, x1, y1)`` in pixels with exclusive ends (slice ``[y0:y1, x0:x1]``),
NaN in frames where the object is absent.

The background is CLIP's mean colour by default (``task.pixel_background="mean"``), which the
Qwen2.5-VL normalisation maps to about zero: an empty cell then adds nothing to a vision token,
and the tiny model's SFT learns to read the objects. On black (``"black"``, the former
rendering), which normalises to about -1.8 per channel, empty cells dominate every token, and
in most seeds the SFT never reads the frames (docs/bpo.md). Blank frames (the null and mask
views) are the background too, as is any item's whose ``meta["background"]`` is unset.
"""

from __future__ import annotations

import functools

import numpy as np

from troupe.envs.video_qa.items import SymbolicFrames, VideoItem
from troupe.platform.errors import DataError

RGB = {
    "red": (220, 40, 40),
    "green": (40, 190, 60),
    "blue": (50, 90, 230),
    "yellow": (230, 210, 40),
    "purple": (150, 60, 200),
    "orange": (240, 140, 30),
    "white": (235, 235, 235),
    "cyan": (40, 210, 220),
}
SHAPES = ("circle", "square", "triangle")
BACKGROUNDS = {"mean": (122, 117, 104), "black": (0, 0, 0)}  # "mean": CLIP's mean, 0.481/0.458/0.408 × 255


def background(item: VideoItem) -> np.ndarray:
    """The RGB a blank frame of ``item`` takes: its rendering's background (real videos: "mean")."""
    return np.array(BACKGROUNDS[item.meta.get("background", "mean")], np.uint8)


@functools.lru_cache(maxsize=32)
def shape_mask(shape: str, cell: int) -> np.ndarray:
    """Boolean ``[cell, cell]`` mask of a filled shape with a 1-pixel margin."""
    c = np.arange(cell) + 0.5
    yy, xx = np.meshgrid(c, c, indexing="ij")
    lo, hi = 1.0, cell - 1.0
    mid, r = cell / 2, (hi - lo) / 2
    if shape == "circle":
        m = (xx - mid) ** 2 + (yy - mid) ** 2 <= r * r
    elif shape == "square":
        m = (xx >= lo) & (xx <= hi) & (yy >= lo) & (yy <= hi)
    elif shape == "triangle":  # apex up: half-width grows linearly from the top row to the base
        m = (yy >= lo) & (yy <= hi) & (np.abs(xx - mid) <= (yy - lo) / (hi - lo) * r)
    else:
        raise DataError(f"unknown shape {shape!r}; known shapes: {', '.join(SHAPES)}")
    return m


def cell_box(x: int, y: int, size: int, grid: int) -> tuple[int, int, int, int]:
    """Pixel box ``(x0, y0, x1, y1)`` (exclusive ends) of grid cell ``(x, y)``; the grid is centred."""
    cell = size // grid
    off = (size - cell * grid) // 2
    return off + x * cell, off + y * cell, off + (x + 1) * cell, off + (y + 1) * cell


def _parse_name(name: str) -> tuple[tuple[int, int, int], str]:
    colour, _, shape = name.partition(" ")
    if colour not in RGB or shape not in SHAPES:
        raise DataError(f"object {name!r}: expected '<colour> <shape>' with colour in {', '.join(RGB)} "
                        f"and shape in {', '.join(SHAPES)}")
    return RGB[colour], shape


def fill_box(frame: np.ndarray, box) -> None:
    """Occlude in place: the box takes the median colour of the frame outside it (the background
    here), so the fill itself does not mark where the object was (§A.2 allows mean colour or blur;
    a mean over a mostly black frame still leaves a visible grey square)."""
    x0, y0, x1, y1 = (int(v) for v in box)
    inside = np.zeros(frame.shape[:2], bool)
    inside[y0:y1, x0:x1] = True
    outside = frame[~inside]
    frame[inside] = np.median(outside, axis=0).astype(np.uint8) if len(outside) else 0


def render_frames(frames: SymbolicFrames, size: int = 56, grid: int = 5, bg: str = "mean") -> np.ndarray:
    """``uint8 [F, size, size, 3]``: each object a filled shape in its cell, on the ``bg`` background."""
    cell = size // grid
    if cell < 4:
        raise DataError(f"pixel size {size} is too small for a {grid}x{grid} grid (need >= 4 px per cell)")
    if bg not in BACKGROUNDS:
        raise DataError(f"pixel background {bg!r}: expected one of {', '.join(BACKGROUNDS)}")
    out = np.empty((len(frames), size, size, 3), np.uint8)
    out[:] = BACKGROUNDS[bg]
    for t, objs in enumerate(frames.frames):
        for o in objs:
            if not o.occluded:
                rgb, shape = _parse_name(o.name)
                x0, y0, x1, y1 = cell_box(o.x, o.y, size, grid)
                out[t, y0:y1, x0:x1][shape_mask(shape, cell)] = rgb
        for o in objs:  # after drawing the rest, so the fill's mean matches the pixel occlude view
            if o.occluded:
                fill_box(out[t], cell_box(o.x, o.y, size, grid))
    return out


def target_boxes(frames: SymbolicFrames, target: str | None, size: int = 56, grid: int = 5) -> np.ndarray | None:
    """``float [F, 4]`` cell boxes of ``target`` (occluded or not), NaN where absent; None without a target."""
    if target is None:
        return None
    boxes = np.full((len(frames), 4), np.nan)
    for t, objs in enumerate(frames.frames):
        for o in objs:
            if o.name == target:
                boxes[t] = cell_box(o.x, o.y, size, grid)
    return boxes


def render_pixels(item: VideoItem, size: int = 56, grid: int = 5, bg: str = "mean") -> VideoItem:
    """The pixel rendering of a symbolic item (orig or any view); a pixel item is returned as is.

    Question, options, answer, support, target and meta carry over; ``boxes`` are the target's
    cells; ``meta["rendering"]`` becomes ``"pixels"`` and ``meta["background"]`` ``bg``.
    """
    if isinstance(item.frames, np.ndarray):
        return item
    if not isinstance(item.frames, SymbolicFrames):
        raise DataError(f"item {item.item_id!r}: has no frames to render")
    return item.replace(
        frames=render_frames(item.frames, size, grid, bg),
        boxes=target_boxes(item.frames, item.target, size, grid),
        meta={**item.meta, "rendering": "pixels", "background": bg},
    )
