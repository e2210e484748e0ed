"""Synthetic counterfactual video-QA: small clips of coloured shapes on a grid, five question
types, and a spurious cue planted in the temporal types (ALGORITHMS.md §A).

Each clip is one scene: 2-3 objects (distinct ``"<colour> <shape>"`` names), static except the
mover of ``action_direction``. The scene *is* the ``SymbolicFrames`` (names + grid positions
per frame); the pixel rendering is derived from it (``render_pixels``), so both renderings
always show the same objects.

Items come out symbolic (``meta["rendering"] == "symbolic"``); call ``task.render_pixels(item)``
for the pixel rendering of the same clip, on the original or on any view.

Layouts (``layout``):

* ``"flicker"`` (the default): every object is visible in a uniformly random set of frames,
  drawn independently of frame order, and each answer (which object appears first, which way
  the mover goes) is read off the arrangement afterwards; the two objects of an order
  question appear once each. The distribution of an original clip is therefore invariant under
  any permutation of its frames: a shuffled or reversed copy has the same object counts,
  contiguity and token frequencies in distribution as an original (``view_distinguishability``
  measures it), so only reading the order tells a view from the original.
* ``"spans"``: the former layout, each object over one contiguous span of frames. Shuffling
  breaks contiguity in almost every clip while reverse and mask keep it, so "non-contiguous →
  change the answer" satisfies a SENS reward without reading order.

Evidence lies only inside ``support``: outside it the queried object is absent (or, for
``temporal_order``, both objects' first appearances are at its ends), so ``mask`` removes the
evidence. The spurious cue is invariant under frame shuffling and reversal:

* ``temporal_order``: under ``flicker`` a prior on the answer (a language prior): the answer
  is option A (with fixed queries, always the same object) when the cue holds, option B when it
  breaks; under ``spans`` the first-appearing object is also the one seen in MORE frames
  (§A.5's frequency cue, which under flicker would tie the arrangement to the counts);
* ``action_direction``: the mover's row predicts its direction (top rows <-> left,
  bottom rows <-> right; the middle row is never used by a mover).

``order_noise`` (0.2 by default) is §A.5's noisy perception of order. With ``noise_mode="render"``
(the default) it is perception noise redrawn per rendering, as in the linear benchmark: each
time a clip (original or view) is rendered for a policy, ``perceive`` presents its frames
backwards with that probability. Both temporal answers flip under reversal, so the order
evidence a rendering shows is right with probability ``1 - order_noise``, independently for the
original and each view, while the cue (shuffle- and reverse-invariant) is right
``cue_strength`` of the time in training: at 0.2 against 0.85 the two compete, and the
likelihood-optimal policy follows the cue where they disagree. A reversed view is rendered
backwards, so it shows the order opposite to the answer with probability ``1 - order_noise``
whatever the original's rendering showed. With ``noise_mode="clip"`` (the former behaviour) it
is label noise fixed per clip: the clip's frames show the order opposite to its answer, so a
reversed copy of a flipped clip shows the gold's order.

Train items follow the cue with probability ``cue_strength``; in the test split temporal
items alternate cue-following / cue-breaking (``hard=True``) per type, so exactly half of each
temporal type is hard when its count is even. Non-temporal items are never hard.
A clip's split is a hash of its frames, so train and test clips are disjoint.

``meta`` holds: ``rendering`` ("symbolic"/"pixels"), ``view`` ("orig"), ``cue`` (True when the
cue agrees with the answer, None for non-temporal types), ``clip`` (the clip hash) and
``objects`` (the names in the clip); a rendering ``perceive`` presented backwards has
``meta["perceived"] == "backwards"``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Any

import numpy as np

from troupe.envs.video_qa.items import SymbolicFrames, SymObject, VideoItem
from troupe.envs.video_qa.pixels import BACKGROUNDS, RGB, SHAPES, render_pixels
from troupe.platform.errors import ConfigError, DataError

SYNTH_QTYPES = ("temporal_order", "action_direction", "object_attribute", "counting", "existence")
CUE_QTYPES = ("temporal_order", "action_direction")
INSTRUCTION = "Answer with the option letter."


@dataclasses.dataclass
class VideoQAConfig:
    num_frames: int = 8
    min_objects: int = 2
    max_objects: int = 3
    colours: list[str] = dataclasses.field(default_factory=lambda: ["red", "green", "blue", "yellow"])
    shapes: list[str] = dataclasses.field(default_factory=lambda: list(SHAPES))
    grid: int = 5  # positions 0..grid-1 on each axis
    cue_strength: float = 0.85
    qtypes: list[str] = dataclasses.field(default_factory=lambda: list(SYNTH_QTYPES))
    pixel_size: int = 56
    # The pixel rendering's background: "mean" (CLIP's mean colour, about zero once normalised)
    # or "black" (the former rendering, on which most seeds' SFT never reads the objects).
    pixel_background: str = "mean"
    test_fraction: float = 0.2  # share of clip hashes that belong to the test split
    seed: int = 0  # default rng seed when a sampler is called without one
    # Every question of a type asks about the same objects (the order pair, the mover, the
    # existence query; the attribute and counting shapes), as in §A.5's benchmark (X=0, Y=1).
    # A small policy then only has to perceive, not also bind a question to the frames.
    fixed_queries: bool = False
    # §A.5's perceptual bottleneck: the probability that a rendering shows the order of first
    # appearance / the direction of motion opposite to the answer. See the module docstring.
    order_noise: float = 0.2
    noise_mode: str = "render"  # "render": redrawn per rendering (perceive); "clip": fixed per clip
    layout: str = "flicker"  # "flicker": objects in random frame sets; "spans": one contiguous span each

    def __post_init__(self) -> None:
        def bad(key: str, why: str) -> ConfigError:
            return ConfigError(f"task.{key}={getattr(self, key)!r}: {why}")

        if not 4 <= self.num_frames <= 64:
            raise bad("num_frames", "expected 4 to 64")
        if not 3 <= self.grid <= 9:
            raise bad("grid", "expected 3 to 9")
        if not 2 <= self.min_objects <= self.max_objects <= 4:
            raise bad("max_objects" if self.min_objects >= 2 else "min_objects",
                      "expected 2 <= min_objects <= max_objects <= 4")
        if len(set(self.colours)) < 3 or any(c not in RGB for c in self.colours):
            raise bad("colours", f"expected at least 3 distinct colours from {', '.join(RGB)}")
        if len(set(self.shapes)) < 2 or any(s not in SHAPES for s in self.shapes):
            raise bad("shapes", f"expected at least 2 distinct shapes from {', '.join(SHAPES)}")
        if not 0.0 <= self.cue_strength <= 1.0:
            raise bad("cue_strength", "expected a probability in [0, 1]")
        if not 0.0 <= self.order_noise < 0.5:
            raise bad("order_noise", "expected a probability in [0, 0.5): at 0.5 the frames carry no order")
        if self.noise_mode not in ("render", "clip"):
            raise bad("noise_mode", "expected 'render' (perception noise per rendering) or 'clip' (fixed per clip)")
        if self.layout not in ("flicker", "spans"):
            raise bad("layout", "expected 'flicker' (random frame sets) or 'spans' (contiguous spans)")
        if not self.qtypes or any(q not in SYNTH_QTYPES for q in self.qtypes):
            raise bad("qtypes", f"expected a non-empty list from {', '.join(SYNTH_QTYPES)}")
        if not 0.0 < self.test_fraction < 1.0:
            raise bad("test_fraction", "expected a number in (0, 1)")
        if self.pixel_background not in BACKGROUNDS:
            raise bad("pixel_background", f"expected one of {', '.join(BACKGROUNDS)}")
        if self.pixel_size // self.grid < 4:
            raise bad("pixel_size", f"expected at least {4 * self.grid} for a {self.grid}x{self.grid} grid")


@dataclasses.dataclass
class _Obj:
    name: str
    frames: list[int]  # the frames it is visible in, ascending
    path: list[tuple[int, int]]  # grid (x, y) in each of those frames


def render_symbolic(frames: SymbolicFrames) -> str:
    """Compact frame lines for the tiny LM, e.g. ``3: red circle 2 1 ; blue square 4 0``.

    Like ``SymbolicFrames.render`` without the word "at" (one token per object per frame
    saved); occluded objects render "?", blank frames "-".
    """
    def obj(o: SymObject) -> str:
        return "?" if o.occluded else " ".join(p for p in (o.name, str(o.x), str(o.y), o.action) if p)

    return "\n".join(f"{i + 1}: " + (" ; ".join(obj(o) for o in f) if f else "-")
                     for i, f in enumerate(frames.frames))


def object_code(name: str) -> str:
    """``"green circle"`` → ``"gc"``: colour initial + shape initial (unique for the palette)."""
    colour, _, shape = name.partition(" ")
    return colour[0] + shape[0]


_NAME = re.compile(r"\b(" + "|".join(RGB) + r") (" + "|".join(SHAPES) + r")\b")


def _encode_names(text: str) -> str:
    return _NAME.sub(lambda m: object_code(m.group(0)), text)


def compact_frames(frames: SymbolicFrames, positions: bool = False) -> str:
    """Frames separated by ``|``: object codes (``?`` if occluded, ``-`` for a blank frame)."""
    def obj(o: SymObject) -> str:
        return "?" if o.occluded else object_code(o.name) + (f"{o.x}{o.y}" if positions else "")

    return " | ".join(" ".join(obj(o) for o in f) or "-" for f in frames.frames)


def backwards(item: VideoItem) -> VideoItem:
    """``item`` with its frames in reverse order (either rendering): boxes reversed, support
    (and a shuffle's ``support_frames``) mirrored, ``meta["perceived"] = "backwards"``; the
    view name and everything else kept."""
    n = item.num_frames
    f = item.frames
    frames = SymbolicFrames(f.frames[::-1]) if isinstance(f, SymbolicFrames) else f[::-1].copy()
    boxes = None if item.boxes is None else item.boxes[::-1].copy()
    support = None if item.support is None else (n - 1 - item.support[1], n - 1 - item.support[0])
    meta = {**item.meta, "perceived": "backwards"}
    if "support_frames" in meta:
        meta["support_frames"] = sorted(n - 1 - t for t in meta["support_frames"])
    return item.replace(frames=frames, boxes=boxes, support=support, meta=meta)


def _hash(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


class VideoQATask:
    """The synthetic counterfactual video-QA environment (``ENVIRONMENTS["video_qa"]``).

    ``VideoQATask(config)`` takes a ``VideoQAConfig``, a plain dict of its fields, or keyword
    overrides.
    """

    def __init__(self, config: VideoQAConfig | dict | None = None, **overrides: Any) -> None:
        fields = {f.name for f in dataclasses.fields(VideoQAConfig)}
        if isinstance(config, VideoQAConfig):  # kept as is (a subclass may carry extra fields)
            self.config = dataclasses.replace(config, **overrides) if overrides else config
        else:
            params = {**(config or {}), **overrides}
            unknown = sorted(set(params) - fields)
            if unknown:
                raise ConfigError(f"env: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(fields))}")
            self.config = VideoQAConfig(**params)
        c = self.config
        f = c.num_frames
        # temporal_order layouts (a, nA, b, nB): A starts AND ends strictly before B, so both
        # shuffle and reverse destroy/flip the order; nA != nB so the frequency cue is defined.
        # Spans are capped at f//2 + 1 frames to keep the prompt short.
        cap = f // 2 + 1
        self._orders = [(a, na, b, nb) for a in range(f) for na in range(1, min(cap, f - a) + 1)
                        for b in range(a + 1, f) for nb in range(1, min(cap, f - b) + 1)
                        if a + na < b + nb and na != nb]

    # ---- scene pieces -------------------------------------------------------------------
    def _names(self, rng: np.random.Generator, k: int, *, shape: str | None = None,
               not_shape: str | None = None, exclude: tuple[str, ...] = ()) -> list[str]:
        c = self.config
        pool = [f"{col} {sh}" for col in c.colours for sh in c.shapes
                if (shape is None or sh == shape) and sh != not_shape and f"{col} {sh}" not in exclude]
        return [pool[i] for i in rng.choice(len(pool), size=k, replace=False)]

    def _span(self, rng: np.random.Generator, lo: int, hi: int) -> list[int]:
        """The frames an object is visible in, ``lo`` to ``hi`` of them: one contiguous span
        (``layout="spans"``) or a uniformly random set (``"flicker"``)."""
        f = self.config.num_frames
        n = int(rng.integers(lo, hi + 1))
        if self.config.layout == "spans":
            start = int(rng.integers(0, f - n + 1))
            return list(range(start, start + n))
        return sorted(int(t) for t in rng.choice(f, size=n, replace=False))

    def _cells(self, rng: np.random.Generator, k: int, avoid_row: int | None = None) -> list[tuple[int, int]]:
        g = self.config.grid
        cells = [(x, y) for y in range(g) for x in range(g) if y != avoid_row]
        return [cells[i] for i in rng.choice(len(cells), size=k, replace=False)]

    def _statics(self, rng: np.random.Generator, names: list[str], spans: list[list[int]],
                 avoid_row: int | None = None) -> list[_Obj]:
        cells = self._cells(rng, len(names), avoid_row)
        return [_Obj(nm, fr, [cell] * len(fr)) for nm, fr, cell in zip(names, spans, cells, strict=True)]

    def _num_objects(self, rng: np.random.Generator, at_least: int = 1) -> int:
        c = self.config
        return max(at_least, int(rng.integers(c.min_objects, c.max_objects + 1)))

    def _distractor_spans(self, rng: np.random.Generator, k: int) -> list[list[int]]:
        return [self._span(rng, 2, self.config.num_frames // 2) for _ in range(k)]  # short: token budget

    # ---- question generators: (objects, question, options, answer, support, target, cue) --
    def _fixed(self, i: int) -> str:
        """The i-th fixed query object (distinct colour and shape for the first two)."""
        c = self.config
        return f"{c.colours[i % len(c.colours)]} {c.shapes[i % len(c.shapes)]}"

    def _queried(self, rng: np.random.Generator, k: int, fixed: list[str]) -> list[str]:
        """``fixed`` (under fixed_queries) or k random names, then distractors up to k."""
        return self._names(rng, k) if not self.config.fixed_queries else (
            fixed + self._names(rng, k - len(fixed), exclude=tuple(fixed)))

    def _flip(self, rng: np.random.Generator) -> bool:
        """Whether this temporal item's frames contradict its answer (``order_noise`` under
        ``noise_mode="clip"``; under "render" the noise is drawn per rendering, by `perceive`).
        No draw without clip noise."""
        p = self.config.order_noise
        return bool(self.config.noise_mode == "clip" and p > 0 and rng.random() < p)

    def _temporal_order(self, rng, follow):
        if self.config.layout == "flicker":
            return self._temporal_order_flicker(rng, follow)
        flip = self._flip(rng)
        # The cue points at the answer: the first-appearing object when the frames are right,
        # the second when they are flipped.
        na_gt_nb = [o for o in self._orders if (o[1] > o[3]) == (follow != flip)]
        a, na, b, nb = na_gt_nb[int(rng.integers(len(na_gt_nb)))]
        n = self._num_objects(rng)
        pair = [self._fixed(0), self._fixed(1)]
        if rng.random() < 0.5:
            pair.reverse()
        first, second, *others = self._queried(rng, n, pair)
        spans = [list(range(a, a + na)), list(range(b, b + nb)), *self._distractor_spans(rng, n - 2)]
        objs = self._statics(rng, [first, second, *others], spans)
        if self.config.fixed_queries:
            options = sorted([first, second])
        else:
            options = [first, second] if rng.random() < 0.5 else [second, first]
        answer = options.index(second if flip else first)
        return objs, "Which object appears first?", options, answer, (a, b), None, follow

    def _temporal_order_flicker(self, rng, follow):
        """Two objects seen once each, in two distinct uniformly drawn frames; the answer is the
        earlier. The cue is a prior on the answer: option A (under fixed queries always the same
        object) is the answer when the cue holds, option B when it breaks. It lives in no frame,
        so no rearrangement of frames moves it, and the frames' distribution is that of any two
        single appearances."""
        c = self.config
        flip = self._flip(rng)
        t1, t2 = sorted(int(t) for t in rng.choice(c.num_frames, size=2, replace=False))
        n = self._num_objects(rng)
        pair, others = [self._fixed(0), self._fixed(1)], []
        if not c.fixed_queries:
            pair, others = (lambda names: (names[:2], names[2:]))(self._names(rng, n))
        else:
            others = self._names(rng, n - 2, exclude=tuple(pair))
        options = sorted(pair) if c.fixed_queries else [pair[i] for i in rng.permutation(2)]
        said = options[0] if follow else options[1]  # the answer
        other = options[1] if follow else options[0]
        first, second = (other, said) if flip else (said, other)
        objs = self._statics(rng, [first, second, *others], [[t1], [t2], *self._distractor_spans(rng, n - 2)])
        return objs, "Which object appears first?", options, options.index(said), (t1, t2), None, follow

    def _action_direction(self, rng, follow):
        c = self.config
        g, half = c.grid, c.grid // 2
        flip = self._flip(rng)
        left = bool(rng.random() < 0.5)  # the direction the frames show
        says_left = left != flip  # the answer
        top, bottom = range(half), range(g - half, g)  # the cue: top <-> left, bottom <-> right
        rows = (top if says_left else bottom) if follow else (bottom if says_left else top)
        y = int(rng.choice(list(rows)))
        seen = self._span(rng, 3, min(g, c.num_frames))  # one cell per frame it is seen in
        n = len(seen)
        if left:
            x0 = int(rng.integers(n - 1, g))
            path = [(x0 - i, y) for i in range(n)]
        else:
            x0 = int(rng.integers(0, g - n + 1))
            path = [(x0 + i, y) for i in range(n)]
        k = self._num_objects(rng)
        mover, *others = self._queried(rng, k, [self._fixed(2)])
        objs = [_Obj(mover, seen, path), *self._statics(rng, others, self._distractor_spans(rng, k - 1), avoid_row=y)]
        return (objs, f"Which way does the {mover} move?", ["left", "right"], int(not says_left), (seen[0], seen[-1]),
                mover, follow)

    def _object_attribute(self, rng, follow):
        c = self.config
        shape = c.shapes[0] if c.fixed_queries else c.shapes[int(rng.integers(len(c.shapes)))]
        (target,) = self._names(rng, 1, shape=shape)
        k = self._num_objects(rng)
        others = self._names(rng, k - 1, not_shape=shape)  # "the <shape>" is unique in the clip
        seen = self._span(rng, 2, c.num_frames // 2 + 1)
        objs = self._statics(rng, [target, *others], [seen, *self._distractor_spans(rng, k - 1)])
        colours = list(c.colours)
        return (objs, f"What colour is the {shape}?", colours, colours.index(target.split()[0]), (seen[0], seen[-1]),
                target, None)

    def _counting(self, rng, follow):
        c = self.config
        kmax = min(3, c.max_objects, len(c.colours))
        count = int(rng.integers(1, kmax + 1))
        shape = c.shapes[-1] if c.fixed_queries else c.shapes[int(rng.integers(len(c.shapes)))]
        counted = self._names(rng, count, shape=shape)
        k = self._num_objects(rng, at_least=count)
        others = self._names(rng, k - count, not_shape=shape)
        spans = [self._span(rng, 2, c.num_frames // 2) for _ in counted]
        objs = self._statics(rng, counted + others, spans + self._distractor_spans(rng, k - count))
        support = (min(fr[0] for fr in spans), max(fr[-1] for fr in spans))
        # Target: one of the counted objects; hiding it leaves the count undetermined.
        target = counted[int(rng.integers(count))]
        return objs, f"How many {shape}s appear?", ["1", "2", "3"], count - 1, support, target, None

    def _existence(self, rng, follow):
        c = self.config
        k = self._num_objects(rng)
        if rng.random() < 0.5:  # yes: the queried object is in the clip, only inside its support
            target, *others = self._queried(rng, k, [self._fixed(0)])
            seen = self._span(rng, 2, c.num_frames // 2 + 1)
            objs = self._statics(rng, [target, *others], [seen, *self._distractor_spans(rng, k - 1)])
            return objs, f"Is there a {target}?", ["yes", "no"], 0, (seen[0], seen[-1]), target, None
        # no: the clip holds a near miss (same colour or same shape); no support, no target
        (query,) = [self._fixed(0)] if c.fixed_queries else self._names(rng, 1)
        col, sh = query.split()
        near = [f"{col} {s}" for s in c.shapes if s != sh] + [f"{o} {sh}" for o in c.colours if o != col]
        miss = near[int(rng.integers(len(near)))]
        others = self._names(rng, k - 1, exclude=(query, miss))
        objs = self._statics(rng, [miss, *others], self._distractor_spans(rng, k))
        return objs, f"Is there a {query}?", ["yes", "no"], 1, None, None, None

    # ---- items ---------------------------------------------------------------------------
    def _frames(self, objs: list[_Obj]) -> SymbolicFrames:
        at = [dict(zip(o.frames, o.path, strict=True)) for o in objs]
        return SymbolicFrames([[SymObject(o.name, *a[t]) for o, a in zip(objs, at, strict=True) if t in a]
                               for t in range(self.config.num_frames)])

    def is_test_clip(self, frames: SymbolicFrames) -> bool:
        h = int(_hash(render_symbolic(frames))[:8], 16)
        return h / 16**8 < self.config.test_fraction

    def _item(self, qtype: str, split: str, rng: np.random.Generator, follow: bool) -> VideoItem:
        gen = getattr(self, f"_{qtype}")
        for _ in range(10_000):  # redraw until the clip's hash lands in the asked split
            objs, question, options, answer, support, target, cue = gen(rng, follow)
            objs = [objs[i] for i in rng.permutation(len(objs))]  # the queried object is not always first
            frames = self._frames(objs)
            if self.is_test_clip(frames) == (split == "test"):
                break
        else:
            raise DataError(f"could not draw a {split} clip for {qtype}; check env.test_fraction")
        clip = _hash(render_symbolic(frames))
        return VideoItem(
            item_id=f"vqa-{split}-{qtype}-{_hash(clip + question + '|'.join(options))}",
            qtype=qtype, question=question, options=list(options), answer=answer, frames=frames,
            support=support, target=target, split=split,
            hard=split == "test" and cue is False,
            meta={"rendering": "symbolic", "view": "orig", "cue": cue, "clip": clip,
                  "objects": sorted(o.name for o in objs)},
        )

    def sample_items(self, n: int, split: str, rng: np.random.Generator | None = None,
                     temporal_weight: int = 1) -> list[VideoItem]:
        """``n`` items of ``split`` ("train"/"test"), question types round-robin (balanced).

        A train call starts the round at a type drawn from ``rng``, so calls of a few items each
        (a step's prompts, an SFT batch) do not always favour the first types; a test call
        starts at the first type. ``temporal_weight`` repeats each temporal type that many
        times in the round (a test set with more temporal-hard items)."""
        if split not in ("train", "test"):
            raise DataError(f"split must be 'train' or 'test', got {split!r}")
        if temporal_weight < 1:
            raise DataError(f"temporal_weight={temporal_weight}: expected an integer >= 1")
        rng = np.random.default_rng(self.config.seed) if rng is None else rng
        qtypes = self.config.qtypes
        cycle = [q for q in qtypes for _ in range(temporal_weight if q in CUE_QTYPES else 1)]
        start = int(rng.integers(len(cycle))) if split == "train" else 0
        seen = dict.fromkeys(qtypes, 0)
        items = []
        for i in range(n):
            q = cycle[(start + i) % len(cycle)]
            if q in CUE_QTYPES:  # test: alternate so exactly half of each temporal type is hard
                follow = seen[q] % 2 == 0 if split == "test" else bool(rng.random() < self.config.cue_strength)
            else:
                follow = True
            seen[q] += 1
            items.append(self._item(q, split, rng, follow))
        return items

    def eval_items(self, n: int, seed: int, temporal_weight: int = 1) -> list[VideoItem]:
        """A fixed test set drawn with ``seed`` (BPO's ``eval.eval_seed``): equal counts per type
        (when ``n`` divides; temporal types ``temporal_weight`` times as many), half of temporal
        ones hard."""
        return self.sample_items(n, "test", np.random.default_rng(seed), temporal_weight)

    def perceive(self, item: VideoItem, rng: np.random.Generator) -> VideoItem:
        """``item`` as one rendering shows it to a policy: under ``noise_mode="render"``, with
        probability ``order_noise`` its frames are presented backwards (§A.5's noisy perception
        of order, redrawn per rendering; see the module doc). Call it on the original and on
        each view, after the view. Items of other sources, and clip-mode noise, pass unchanged."""
        c = self.config
        if c.noise_mode != "render" or c.order_noise == 0 or item.source != "synthetic":
            return item
        return backwards(item) if rng.random() < c.order_noise else item

    # ---- text ----------------------------------------------------------------------------
    def pixel_prompt(self, item: VideoItem) -> str:
        """The question text without frame lines (the VL model gets the pixels)."""
        return f"Q: {item.question}\n{item.options_text()}\n{INSTRUCTION}"

    def shows_positions(self, qtype: str) -> bool:
        """Whether the symbolic prompt shows grid positions: only where the question is about
        motion (two digit tokens per object elsewhere slowed the tiny LM's learning of order
        from under 600 SFT steps to more than 800)."""
        return qtype == "action_direction"

    def prompt(self, item: VideoItem) -> str:
        """The symbolic prompt for the tiny LM: the question and lettered options first, then
        the frames, each object as a two-letter code (``gc`` = green circle).

        Question first, so that while reading the frames the model already knows what to look
        for (a causal model cannot look back from the frames to a question that follows them);
        codes, so an object is one or two tokens and a clip about 40. Grid positions are shown
        where `shows_positions` says (``gc40``: x=4, y=0). The frame line opens with a ``|``
        like the boundary between frames, so the first frame's first object tokenises as every
        other object does (after a space), not as a word at the start of a line.
        """
        if not isinstance(item.frames, SymbolicFrames):
            raise DataError(f"item {item.item_id!r}: prompt() needs symbolic frames; use pixel_prompt()")
        question = _encode_names(item.question)
        options = " ".join(f"{c}. {_encode_names(o)}" for c, o in zip(item.letters, item.options, strict=True))
        frames = compact_frames(item.frames, positions=self.shows_positions(item.qtype))
        return f"{question} {options}\n| {frames}"

    def sample(self, n: int, split: str, rng: np.random.Generator | None = None) -> list[dict]:
        """Rows ``{"prompt", "answer", "item", "group"}`` (what the SFT fitter consumes; it
        reports its loss by ``group``, the question type); each prompt is one rendering of its
        item (`perceive`)."""
        rng = np.random.default_rng(self.config.seed) if rng is None else rng
        return [{"prompt": self.prompt(self.perceive(it, rng)), "answer": it.gold_letter, "item": it,
                 "group": it.qtype}
                for it in self.sample_items(n, split, rng)]

    def corpus(self, n: int = 4000, seed: int = 0) -> list[str]:
        """Prompt + answer texts to train the tiny tokenizer on."""
        return [f"{r['prompt']}\n{r['answer']}" for r in self.sample(n, "train", np.random.default_rng(seed))]

    def render_pixels(self, item: VideoItem) -> VideoItem:
        """The pixel rendering (``uint8 [F, pixel_size, pixel_size, 3]`` + target boxes) of the same clip."""
        return render_pixels(item, self.config.pixel_size, self.config.grid, self.config.pixel_background)


