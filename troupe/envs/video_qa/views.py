"""Counterfactual view operators, the behaviour table and per-item view selection (ALGORITHMS.md §A.2).

Every operator works on both renderings (``SymbolicFrames`` or ``uint8 [F, H, W, 3]``) and
keeps question, options and answer. What follows each view:

* ``shuffle``: frames permuted (never the identity); ``meta["perm"][i]`` is the original index
  of view frame ``i``. ``support`` becomes None (it is no longer a contiguous range) and
  ``meta["support_frames"]`` lists where its frames went; ``boxes`` follow the permutation.
* ``reverse``: support mirrored to ``(F-1-e, F-1-s)``; boxes reversed; ``meta["perm"]`` set.
* ``mask``: frames in ``support`` blank (symbolic: no objects; pixels: black); support kept,
  boxes NaN there (the target is gone).
* ``occlude``: the target hidden in every frame (symbolic: ``occluded=True``, renders "?";
  pixels: its box filled with the frame's mean colour outside the box). Boxes kept.
* ``null``: every frame blank; support None, boxes all NaN.

``meta["view"]`` names the view. A view applies to an original item; views of views are
not needed by the algorithm and not supported for ``mask`` after ``shuffle``/``null``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from troupe.envs.video_qa.items import QTYPES, SymbolicFrames, SymObject, VideoItem
from troupe.envs.video_qa.pixels import background, fill_box
from troupe.platform.errors import DataError

VIEWS = ("orig", "shuffle", "reverse", "mask", "occlude", "null")
# FLIP is not in §A.2's table: on a reversed clip a two-option order or direction question
# must take the *other* option (SENS accepts any move off a*, abstaining included).
LABELS = ("STAB", "SENS", "ABST", "FLIP")
_EMPTY = (None, "", "-", "—")  # a cell the view is not used for

_DEFAULT_ROWS = {
    "temporal_order": ("SENS", "SENS", "SENS", None, "ABST"),
    "action_direction": ("SENS", "SENS", "SENS", "SENS", "ABST"),
    "action": ("STAB", "STAB", "SENS", "SENS", "ABST"),  # direction-insensitive
    "object_attribute": ("STAB", "STAB", "SENS", "SENS", "ABST"),
    "counting": ("STAB", "STAB", "SENS", "SENS", "ABST"),
    "existence": ("STAB", "STAB", "SENS", "SENS", "ABST"),
    "causal": ("SENS", "SENS", "SENS", None, "ABST"),
}
DEFAULT_TABLE = {q: {v: lab for v, lab in zip(VIEWS[1:], row, strict=True) if lab}
                 for q, row in _DEFAULT_ROWS.items()}


class ViewUnavailable(DataError):
    """A view needs a field the item lacks (``mask`` without support, ``occlude`` without target)."""


def unavailable_field(item: VideoItem, view: str) -> str | None:
    """The field ``view`` needs and ``item`` lacks, or None when the view applies."""
    if view == "mask" and item.support is None:
        return "support"
    if view == "occlude":
        if item.target is None:
            return "target"
        if isinstance(item.frames, np.ndarray) and item.boxes is None:
            return "boxes"
    if view == "shuffle" and item.num_frames < 2:
        return "frames (shuffle needs at least 2)"
    return None


def _check_view(view: str) -> None:
    if view not in VIEWS:
        raise DataError(f"unknown view {view!r}; known views: {', '.join(VIEWS)}")


def _permute(item: VideoItem, perm: np.ndarray, view: str) -> VideoItem:
    f = item.frames
    frames = SymbolicFrames([f.frames[i] for i in perm]) if isinstance(f, SymbolicFrames) else f[perm]
    boxes = None if item.boxes is None else item.boxes[perm]
    meta = {**item.meta, "view": view, "perm": [int(i) for i in perm]}
    support = None
    if item.support is not None:
        s, e = item.support
        where = sorted(int(j) for j, i in enumerate(perm) if s <= i <= e)
        meta["support_frames"] = where
        if view == "reverse":
            support = (where[0], where[-1])
    return item.replace(frames=frames, boxes=boxes, support=support, meta=meta)


def apply_view(item: VideoItem, view: str, rng: np.random.Generator | None = None) -> VideoItem:
    """``item`` under ``view`` (see the module doc); ``rng`` draws the shuffle permutation."""
    _check_view(view)
    missing = unavailable_field(item, view)
    if missing:
        raise ViewUnavailable(f"item {item.item_id!r}: view {view!r} needs {missing}, which the item lacks")
    if item.frames is None:
        raise DataError(f"item {item.item_id!r}: has no frames")
    n = item.num_frames
    if view == "orig":
        return item.replace(meta={**item.meta, "view": "orig"})
    if view == "shuffle":
        rng = np.random.default_rng() if rng is None else rng
        perm = rng.permutation(n)
        while np.array_equal(perm, np.arange(n)):  # the identity is no counterfactual
            perm = rng.permutation(n)
        return _permute(item, perm, view)
    if view == "reverse":
        return _permute(item, np.arange(n)[::-1], view)

    sym = isinstance(item.frames, SymbolicFrames)
    frames = SymbolicFrames([list(f) for f in item.frames.frames]) if sym else item.frames.copy()
    boxes = None if item.boxes is None else item.boxes.copy()
    support = item.support
    if view in ("mask", "null"):
        blank = range(support[0], support[1] + 1) if view == "mask" else range(n)
        for t in blank:
            if sym:
                frames.frames[t] = []
            else:
                frames[t] = background(item)
            if boxes is not None:
                boxes[t] = np.nan
        if view == "null":
            support = None
    else:  # occlude
        if sym:
            frames = SymbolicFrames([[SymObject(o.name, o.x, o.y, o.action, True) if o.name == item.target else o
                                      for o in f] for f in frames.frames])
        else:
            for t, box in enumerate(boxes):
                if not np.isnan(box).any():
                    fill_box(frames[t], box)
    return item.replace(frames=frames, boxes=boxes, support=support, meta={**item.meta, "view": view})


class BehaviorTable:
    """``rows[qtype][view] -> "STAB" | "SENS" | "ABST" | "FLIP"``; an absent cell means the view is
    unused. FLIP is for ``reverse`` only (the view whose answer is known to swap).

    ``BehaviorTable()`` is §A.2's default. ``BehaviorTable.from_dict(section)`` reads a config
    section ``{qtype: {view: label}}``; with ``merge=True`` (default) each given row is laid
    cell by cell over the default row, and a cell set to null/"-" removes it.
    """

    def __init__(self, rows: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.rows: dict[str, dict[str, str]] = {}
        for qtype, row in (DEFAULT_TABLE if rows is None else rows).items():
            if qtype not in QTYPES:
                raise DataError(f"behaviour table: unknown question type {qtype!r}; allowed: {', '.join(QTYPES)}")
            if not isinstance(row, Mapping):
                raise DataError(f"behaviour table: row {qtype!r} must map views to labels, got {row!r}")
            clean = {}
            for view, label in row.items():
                if view not in VIEWS[1:]:
                    raise DataError(f"behaviour table: unknown view {view!r} in row {qtype!r}; "
                                    f"allowed: {', '.join(VIEWS[1:])}")
                if label in _EMPTY:
                    continue
                lab = str(label).upper()
                if lab not in LABELS:
                    raise DataError(f"behaviour table: unknown label {label!r} at ({qtype}, {view}); "
                                    f"allowed: {', '.join(LABELS)} or null")
                if lab == "FLIP" and view != "reverse":
                    raise DataError(f"behaviour table: FLIP at ({qtype}, {view}); FLIP applies to the reverse "
                                    f"view only, where the answer of an order or direction question swaps")
                clean[view] = lab
            self.rows[qtype] = clean

    @classmethod
    def from_dict(cls, section: Mapping[str, Mapping[str, Any]] | None, merge: bool = True) -> BehaviorTable:
        if not merge:
            return cls(section or {})
        rows: dict[str, dict[str, Any]] = {q: dict(r) for q, r in DEFAULT_TABLE.items()}
        for qtype, row in (section or {}).items():
            if not isinstance(row, Mapping):
                raise DataError(f"behaviour table: row {qtype!r} must map views to labels, got {row!r}")
            rows.setdefault(qtype, {}).update(row)
        return cls(rows)

    def label(self, qtype: str, view: str) -> str | None:
        """The behaviour ``view`` demands of ``qtype``, or None when the view is unused for it."""
        if qtype not in QTYPES:
            raise DataError(f"unknown question type {qtype!r}; allowed: {', '.join(QTYPES)}")
        _check_view(view)
        return self.rows.get(qtype, {}).get(view)

    def row(self, qtype: str) -> dict[str, str]:
        if qtype not in QTYPES:
            raise DataError(f"unknown question type {qtype!r}; allowed: {', '.join(QTYPES)}")
        return dict(self.rows.get(qtype, {}))

    def to_dict(self) -> dict[str, dict[str, str]]:
        return {q: dict(r) for q, r in self.rows.items()}


def select_views(item: VideoItem, table: BehaviorTable, m: int = 3, rng: np.random.Generator | None = None,
                 random_views: bool = False, first: Sequence[str] = (),
                 slot_offset: int = 0) -> tuple[list[tuple[str, str]], int]:
    """Pick ``m`` (view, label) pairs for ``item`` (§A.2 step 2) and count skipped views.

    Candidates are the type's labelled views that apply to the item; each labelled view that
    does not apply (mask without support, occlude without target) counts as one skip.
    Default composition, in this order: one STAB-or-SENS, one SENS, one ABST, then any
    others; a slot whose label has no candidate left takes any unused candidate. Views repeat
    only when fewer than ``m`` candidates exist (so every prompt yields ``m`` views; budget
    matching). ``random_views=True`` draws ``m`` candidates uniformly instead (§A.3 baseline 5);
    views unlabelled for the type are never drawn, so each keeps its table label.
    ``first`` names views placed before the draw, each in the scarcest slot its label fits,
    where it applies to the item (BPO puts ``reverse`` in every temporal pack this way: the one
    view that flips the order and keeps every other statistic); ``random_views`` ignores it.
    A pack of fewer than three views holds only the first slots; ``slot_offset`` starts the
    slot cycle further on (offset 2 with ``m=1``: the ABST slot), so prompts given offsets
    0, 1, 2, ... in turn cover every slot across a batch.
    """
    if m < 1:
        raise DataError(f"select_views: m={m}; expected at least 1")
    rng = np.random.default_rng() if rng is None else rng
    row = table.row(item.qtype)
    # FLIP needs exactly two answer options (plus the abstain option) to name "the other one".
    cands = {v: lab for v, lab in row.items() if unavailable_field(item, v) is None
             and (lab != "FLIP" or len(item.options) == 3)}
    skipped = len(row) - len(cands)
    if not cands:
        raise DataError(f"item {item.item_id!r}: no usable view for question type {item.qtype!r} "
                        f"(table row {row}, {skipped} unavailable)")
    views = list(cands)

    def draw(pool: list[str]) -> str:
        return pool[int(rng.integers(len(pool)))]

    if random_views:
        picked = [views[i] for i in rng.permutation(len(views))[:m]]
    else:
        # Fill the scarce slots first so the STAB-or-SENS slot cannot steal the only SENS view.
        cycle: list[tuple[str, ...]] = [("STAB", "SENS", "FLIP"), ("SENS", "FLIP"), ("ABST",)]
        k = slot_offset % 3 if m < 3 else 0  # a full pack holds every slot: nothing to rotate
        slots = (cycle[k:] + cycle[:k])[:m] + [tuple(LABELS)] * max(0, m - 3)
        picked_at: dict[int, str] = {}
        order = sorted(range(len(slots)), key=lambda i: (len(slots[i]), i))
        for v in first:
            fits = [i for i in order if i not in picked_at and v in cands and cands[v] in slots[i]]
            if fits and v not in picked_at.values():
                picked_at[fits[0]] = v
        for i in order:
            if i in picked_at:
                continue
            unused = [v for v in views if v not in picked_at.values()]
            pool = [v for v in unused if cands[v] in slots[i]] or unused
            if pool:
                picked_at[i] = draw(pool)
        picked = [picked_at[i] for i in sorted(picked_at)]
    while len(picked) < m:  # fewer candidates than m: repeat some
        picked.append(draw(views))
    return [(v, cands[v]) for v in picked], skipped
