"""The video-QA item every source produces (synthetic clips, TempCompass, MVBench, NExT-QA)
and the answer parser every reward uses.

An item is a multiple-choice question over ``F`` frames. Its options always end with the
explicit abstain option ("Cannot be determined from the video"); the gold answer is never
that option. Frames come in one of two renderings:

* ``SymbolicFrames``: a few tokens per frame, for the tiny causal LM on CPU;
* a ``numpy`` array ``[F, H, W, 3]`` of ``uint8`` pixels, for a vision-language model.
"""

from __future__ import annotations

import dataclasses
import re
import string
from typing import Any

import numpy as np

from troupe.platform.errors import DataError

# Question types. The behaviour table (views.py) says what each view demands of each type.
QTYPES = ("temporal_order", "action_direction", "action", "object_attribute", "counting", "existence", "causal")
TEMPORAL_QTYPES = ("temporal_order", "action_direction", "causal")
ABSTAIN_OPTION = "Cannot be determined from the video"
LETTERS = string.ascii_uppercase

ABST = -1  # parsed answer: abstained
INVALID = -2  # parsed answer: no option letter found


@dataclasses.dataclass
class SymObject:
    """One object in one symbolic frame."""

    name: str  # e.g. "red circle"
    x: int
    y: int
    action: str = ""  # e.g. "moves left"; empty when still
    occluded: bool = False

    def render(self) -> str:
        if self.occluded:
            return "?"
        return " ".join(p for p in (self.name, f"at {self.x} {self.y}", self.action) if p)


@dataclasses.dataclass
class SymbolicFrames:
    """Frames as lists of objects; an empty list is a blank (black) frame."""

    frames: list[list[SymObject]]

    def __len__(self) -> int:
        return len(self.frames)

    def render(self) -> str:
        return "\n".join(f"{i + 1}: " + (" ; ".join(o.render() for o in f) if f else "-")
                         for i, f in enumerate(self.frames))


@dataclasses.dataclass
class VideoItem:
    """One question over one clip.

    ``options`` holds the answer texts without letters; the last is always ``ABSTAIN_OPTION``.
    ``support`` is the inclusive frame range ``(start, end)`` holding the evidence, or None
    when the source has none (then the ``mask`` view is skipped and counted). ``target`` names
    the object the question is about; ``boxes`` ``[F, 4]`` (x0, y0, x1, y1, NaN where absent)
    locate it in pixel frames. ``hard`` marks a test item whose spurious cue is broken.
    """

    item_id: str
    qtype: str
    question: str
    options: list[str]
    answer: int
    frames: SymbolicFrames | np.ndarray | None
    support: tuple[int, int] | None = None
    target: str | None = None
    boxes: np.ndarray | None = None
    split: str = "test"
    hard: bool = False
    source: str = "synthetic"
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"item {self.item_id!r}"
        if self.qtype not in QTYPES:
            raise DataError(f"{where}: question type {self.qtype!r} is not one of {', '.join(QTYPES)}")
        if not self.options or self.options[-1] != ABSTAIN_OPTION:
            self.options = [o for o in self.options if o != ABSTAIN_OPTION] + [ABSTAIN_OPTION]
        if len(self.options) > len(LETTERS):
            raise DataError(f"{where}: {len(self.options)} options; at most {len(LETTERS)} are supported")
        if not 0 <= self.answer < len(self.options) - 1:
            raise DataError(f"{where}: answer index {self.answer} is outside its {len(self.options) - 1} options")
        n = self.num_frames
        if self.support is not None:
            s, e = self.support
            if not (0 <= s <= e < n):
                raise DataError(f"{where}: support segment {self.support} is outside its {n} frames")

    @property
    def num_frames(self) -> int:
        return 0 if self.frames is None else len(self.frames)

    @property
    def abstain_index(self) -> int:
        return len(self.options) - 1

    @property
    def letters(self) -> str:
        return LETTERS[: len(self.options)]

    @property
    def gold_letter(self) -> str:
        return LETTERS[self.answer]

    def options_text(self) -> str:
        return "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(self.options))

    def replace(self, **changes: Any) -> VideoItem:
        return dataclasses.replace(self, **changes)


_ABSTAIN_PHRASES = re.compile(
    r"cannot be determined|can ?not be determined|can't be determined|cannot determine|can't (?:tell|determine)"
    r"|cannot tell|not enough (?:information|evidence)|insufficient (?:information|evidence)|unanswerable"
    r"|\bunknown\b|no evidence",
    re.IGNORECASE,
)


def parse_answer(text: str, num_options: int) -> int:
    """The option index a response chose, ``ABST`` or ``INVALID``.

    Rules, in order: an explicit abstain phrase is ``ABST``; otherwise the first standalone
    option letter (``B``, ``(B)``, ``B.``, ``answer: B``) decides, and the last option's
    letter is the abstain option; no letter is ``INVALID``.
    """
    if _ABSTAIN_PHRASES.search(text):
        return ABST
    letters = LETTERS[:num_options]
    m = re.search(rf"(?<![A-Za-z])([{letters}])(?![A-Za-z])", text)
    if m is None:
        return INVALID
    idx = letters.index(m.group(1))
    return ABST if idx == num_options - 1 else idx
