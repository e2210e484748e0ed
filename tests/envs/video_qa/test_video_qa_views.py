from collections import Counter

import numpy as np
import pytest

from troupe.envs.video_qa import (
    DEFAULT_TABLE,
    VIEWS,
    BehaviorTable,
    SymbolicFrames,
    VideoQATask,
    ViewUnavailable,
    apply_view,
    render_symbolic,
    select_views,
)
from troupe.envs.video_qa.pixels import BACKGROUNDS
from troupe.platform.errors import DataError


@pytest.fixture(scope="module")
def task():
    return VideoQATask()


@pytest.fixture(scope="module")
def items(task):
    return task.sample_items(100, "train", np.random.default_rng(0))


def of_type(items, qtype, **kw):
    return next(it for it in items if it.qtype == qtype and all(getattr(it, k) == v for k, v in kw.items()))


def existence_no(items):
    return next(it for it in items if it.qtype == "existence" and it.support is None)


def lines(item):
    return [ln.split(": ", 1)[1] for ln in render_symbolic(item.frames).splitlines()]


def both(task, item):
    return item, task.render_pixels(item)


def test_shuffle_permutes_and_is_never_identity(task, items):
    rng = np.random.default_rng(0)
    for it in items[:20]:
        for x in both(task, it):
            v = apply_view(x, "shuffle", rng)
            perm = v.meta["perm"]
            assert sorted(perm) == list(range(8)) and perm != list(range(8))
            if isinstance(x.frames, SymbolicFrames):
                assert Counter(lines(v)) == Counter(lines(x))
                assert lines(v) == [lines(x)[i] for i in perm]
            else:
                assert np.array_equal(v.frames, x.frames[perm])
                assert sorted(map(bytes, v.frames)) == sorted(map(bytes, x.frames))
            assert v.meta["view"] == "shuffle" and v.support is None
            assert (v.question, v.options, v.answer) == (x.question, x.options, x.answer)
            if x.support is not None:
                s, e = x.support
                assert sorted(perm[j] for j in v.meta["support_frames"]) == list(range(s, e + 1))
    # two frames: the only non-identity permutation, every time
    it2 = items[0].replace(frames=SymbolicFrames(items[0].frames.frames[:2]), support=None)
    assert all(apply_view(it2, "shuffle", rng).meta["perm"] == [1, 0] for _ in range(20))


def test_reverse(task, items):
    it = of_type(items, "action_direction")
    for x in both(task, it):
        v = apply_view(x, "reverse")
        s, e = x.support
        assert v.support == (7 - e, 7 - s) and v.meta["perm"] == list(range(7, -1, -1))
        if isinstance(x.frames, SymbolicFrames):
            assert lines(v) == lines(x)[::-1]
        else:
            assert np.array_equal(v.frames, x.frames[::-1]) and np.array_equal(v.boxes, x.boxes[::-1], equal_nan=True)


def test_mask_blanks_the_support_only(task, items):
    for it in items:
        if it.support is None:
            continue
        s, e = it.support
        sym, px = (apply_view(x, "mask") for x in both(task, it))
        assert sym.num_frames == px.num_frames == 8 and sym.meta["view"] == "mask"
        for t in range(8):
            if s <= t <= e:
                assert sym.frames.frames[t] == [] and (px.frames[t] == BACKGROUNDS["mean"]).all()
            else:
                assert sym.frames.frames[t] == it.frames.frames[t]
        if it.target is not None:
            assert np.isnan(px.boxes[s:e + 1]).all()
            assert not any(o.name == it.target for f in sym.frames.frames for o in f)  # evidence gone


def test_occlude_hides_the_target_everywhere(task, items):
    for it in items:
        if it.target is None:
            continue
        sym = apply_view(it, "occlude")
        for f0, f1 in zip(it.frames.frames, sym.frames.frames, strict=True):
            assert len(f0) == len(f1)
            for o0, o1 in zip(f0, f1, strict=True):
                assert o1.occluded == (o0.name == it.target)
                assert o1.render() == ("?" if o1.occluded else o0.render())
        assert it.target not in render_symbolic(sym.frames)
        px = task.render_pixels(it)
        pv = apply_view(px, "occlude")
        for t, box in enumerate(px.boxes):
            if np.isnan(box).any():
                assert np.array_equal(pv.frames[t], px.frames[t])
                continue
            x0, y0, x1, y1 = box.astype(int)
            patch = pv.frames[t, y0:y1, x0:x1].reshape(-1, 3)
            assert (patch == patch[0]).all()  # one flat colour ...
            outside = px.frames[t].copy()
            outside[y0:y1, x0:x1] = 0
            rest = pv.frames[t].copy()
            rest[y0:y1, x0:x1] = 0
            assert np.array_equal(rest, outside)  # ... and the other objects untouched


def test_blank_frames_take_the_renderings_background(items):
    # On the former black rendering a blank frame is black; where an item names no background
    # (a real video) it is the normalisation's mean, about zero to the model.
    black = VideoQATask(pixel_background="black").render_pixels(items[3])
    assert black.meta["background"] == "black" and not apply_view(black, "null").frames.any()
    unset = black.replace(meta={k: v for k, v in black.meta.items() if k != "background"})
    assert (apply_view(unset, "null").frames == BACKGROUNDS["mean"]).all()


def test_null_frames_are_identical_and_empty(task, items):
    for x in both(task, items[3]):
        v = apply_view(x, "null")
        assert v.support is None and v.num_frames == 8
        if isinstance(x.frames, SymbolicFrames):
            assert lines(v) == ["-"] * 8
        else:
            assert (v.frames == BACKGROUNDS["mean"]).all() and np.isnan(v.boxes).all()


def test_views_commute_with_pixel_rendering(task, items):
    for it in items[:25]:
        for view in VIEWS:
            if view in ("mask", "occlude") and (it.support is None or it.target is None):
                continue
            a = task.render_pixels(apply_view(it, view, np.random.default_rng(5)))
            b = apply_view(task.render_pixels(it), view, np.random.default_rng(5))
            assert np.array_equal(a.frames, b.frames), (it.item_id, view)
            assert (a.boxes is None and b.boxes is None) or np.array_equal(a.boxes, b.boxes, equal_nan=True)
            assert a.support == b.support and a.meta == b.meta


def test_view_errors(items):
    with pytest.raises(DataError, match=r"unknown view 'blur'.*shuffle, reverse, mask"):
        apply_view(items[0], "blur")
    no = existence_no(items)
    with pytest.raises(ViewUnavailable, match=rf"{no.item_id}.*'mask' needs support"):
        apply_view(no, "mask")
    with pytest.raises(ViewUnavailable, match=rf"{no.item_id}.*'occlude' needs target"):
        apply_view(no, "occlude")
    order = of_type(items, "temporal_order")
    with pytest.raises(ViewUnavailable, match="target"):
        apply_view(order, "occlude")
    assert issubclass(ViewUnavailable, DataError)


def test_behavior_table_default_and_validation():
    t = BehaviorTable()
    assert t.rows == DEFAULT_TABLE
    assert [t.label("temporal_order", v) for v in VIEWS[1:]] == ["SENS", "SENS", "SENS", None, "ABST"]
    assert [t.label("action_direction", v) for v in VIEWS[1:]] == ["SENS"] * 4 + ["ABST"]
    for q in ("action", "object_attribute", "counting", "existence"):
        assert [t.label(q, v) for v in VIEWS[1:]] == ["STAB", "STAB", "SENS", "SENS", "ABST"]
    assert [t.label("causal", v) for v in VIEWS[1:]] == ["SENS", "SENS", "SENS", None, "ABST"]
    assert t.label("counting", "orig") is None

    m = BehaviorTable.from_dict({"counting": {"shuffle": "sens", "occlude": None}})
    assert m.label("counting", "shuffle") == "SENS" and m.label("counting", "occlude") is None
    assert m.label("existence", "shuffle") == "STAB"  # other rows keep the default
    only = BehaviorTable.from_dict({"counting": {"null": "ABST"}}, merge=False)
    assert only.row("counting") == {"null": "ABST"} and only.row("existence") == {}

    with pytest.raises(DataError, match=r"unknown question type 'sport'.*temporal_order"):
        BehaviorTable.from_dict({"sport": {"null": "ABST"}})
    with pytest.raises(DataError, match=r"unknown view 'blur'.*shuffle"):
        BehaviorTable.from_dict({"counting": {"blur": "SENS"}})
    with pytest.raises(DataError, match="FLIP applies to the reverse view only"):
        BehaviorTable.from_dict({"temporal_order": {"shuffle": "FLIP"}})
    with pytest.raises(DataError, match=r"unknown label 'KEEP'.*STAB, SENS, ABST"):
        BehaviorTable.from_dict({"counting": {"mask": "KEEP"}})
    with pytest.raises(DataError, match="unknown view 'orig'"):
        BehaviorTable({"counting": {"orig": "STAB"}})
    with pytest.raises(DataError, match="unknown question type"):
        t.label("sport", "null")
    with pytest.raises(DataError, match="unknown view"):
        t.label("counting", "blur")


def test_flip_on_reverse_for_two_option_items_only(items):
    t, rng = BehaviorTable.from_dict({"temporal_order": {"reverse": "FLIP"}, "counting": {"reverse": "FLIP"}}), \
        np.random.default_rng(0)
    drawn = set()
    for _ in range(20):
        sel, skipped = select_views(of_type(items, "temporal_order"), t, 3, rng)
        assert skipped == 0 and sel[2] == ("null", "ABST") and dict(sel).get("reverse", "FLIP") == "FLIP"
        drawn |= set(sel)
        # Counting has three answer options: its FLIP cell is never drawn.
        sel, skipped = select_views(of_type(items, "counting"), t, 3, rng)
        assert "reverse" not in dict(sel) and skipped == 1  # counted, like any view an item cannot have
    assert ("reverse", "FLIP") in drawn


def test_select_views_composition(items):
    t, rng = BehaviorTable(), np.random.default_rng(0)
    for _ in range(20):
        sel, skipped = select_views(of_type(items, "object_attribute"), t, 3, rng)
        assert skipped == 0 and len({v for v, _ in sel}) == 3
        assert sel[0][1] in ("STAB", "SENS") and sel[1][1] == "SENS" and sel[2] == ("null", "ABST")
        sel, skipped = select_views(of_type(items, "temporal_order"), t, 3, rng)
        assert skipped == 0 and [lab for _, lab in sel] == ["SENS", "SENS", "ABST"]
        assert len({v for v, _ in sel}) == 3 and "occlude" not in dict(sel)


def test_select_views_slot_offset_rotates_small_packs(items):
    t, rng = BehaviorTable(), np.random.default_rng(3)
    item = of_type(items, "object_attribute")
    # One view: offset 0 keeps the STAB-or-SENS slot (never ABST); offsets 1, 2 reach SENS and ABST.
    assert {select_views(item, t, 1, rng)[0][0][1] for _ in range(30)} <= {"STAB", "SENS"}
    assert [select_views(item, t, 1, rng, slot_offset=k)[0][0][1] for k in (1, 2, 5)] == ["SENS", "ABST", "ABST"]
    labels = [lab for _, lab in select_views(item, t, 2, rng, slot_offset=2)[0]]
    assert labels[0] == "ABST" and labels[1] in ("STAB", "SENS")
    # A full pack holds every slot: the offset changes nothing.
    a = select_views(item, t, 3, np.random.default_rng(4), slot_offset=1)
    assert a == select_views(item, t, 3, np.random.default_rng(4))


def test_select_views_skips_unavailable_and_falls_back(items):
    no, rng = existence_no(items), np.random.default_rng(1)
    sel, skipped = select_views(no, BehaviorTable(), 3, rng)
    assert skipped == 2  # mask (no support) and occlude (no target)
    assert sorted(sel) == [("null", "ABST"), ("reverse", "STAB"), ("shuffle", "STAB")]
    sel, skipped = select_views(no, BehaviorTable(), 5, rng)  # only 3 candidates: repeats, still 5 views
    assert skipped == 2 and len(sel) == 5 and {v for v, _ in sel} == {"shuffle", "reverse", "null"}
    with pytest.raises(DataError, match="no usable view"):
        select_views(no, BehaviorTable.from_dict({"existence": {"mask": "SENS"}}, merge=False), 3, rng)


def test_select_random_views_keeps_table_labels(items):
    t, rng = BehaviorTable(), np.random.default_rng(2)
    seen = Counter()
    for _ in range(300):
        sel, skipped = select_views(of_type(items, "temporal_order"), t, 3, rng, random_views=True)
        assert skipped == 0 and len({v for v, _ in sel}) == 3
        assert all(lab == t.label("temporal_order", v) for v, lab in sel)
        seen.update(v for v, _ in sel)
    assert set(seen) == {"shuffle", "reverse", "mask", "null"}  # never the unlabelled occlude
    assert min(seen.values()) > 150  # ~225 each: uniform
    sel, _ = select_views(existence_no(items), t, 3, rng, random_views=True)
    assert all(lab == t.label("existence", v) for v, lab in sel)


def test_select_views_places_first_views_before_the_draw(items):
    t, rng = BehaviorTable(), np.random.default_rng(3)
    for _ in range(30):
        sel, _ = select_views(of_type(items, "temporal_order"), t, 3, rng, first=("reverse",))
        assert ("reverse", "SENS") in sel and sel[2] == ("null", "ABST")  # the SENS slot keeps reverse
        sel, _ = select_views(of_type(items, "object_attribute"), t, 3, rng, first=("reverse",))
        assert sel[0] == ("reverse", "STAB") and sel[1][1] == "SENS"  # STAB fits the first slot only
    # A first view the item lacks (no support: no mask) is skipped; random views ignore ``first``.
    sel, _ = select_views(existence_no(items), t, 3, rng, first=("mask",))
    assert "mask" not in dict(sel)
    drawn = {v for _ in range(40) for v, _ in select_views(of_type(items, "temporal_order"), t, 1, rng,
                                                           random_views=True, first=("reverse",))[0]}
    assert len(drawn) > 1
