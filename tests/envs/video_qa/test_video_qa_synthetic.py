import numpy as np
import pytest

from troupe.algorithms.bpo.config import BPOEvalConfig
from troupe.envs.video_qa import (
    ABST,
    ABSTAIN_OPTION,
    SYNTH_QTYPES,
    SymbolicFrames,
    VideoQAConfig,
    VideoQATask,
    parse_answer,
)
from troupe.envs.video_qa.pixels import BACKGROUNDS, RGB, cell_box
from troupe.envs.video_qa.synthetic import backwards
from troupe.platform.errors import ConfigError, DataError
from troupe.platform.registry import ENVIRONMENTS

EVAL_SEED = BPOEvalConfig().eval_seed  # the test items BPO evaluates on


@pytest.fixture(scope="module")
def task():
    return VideoQATask()


@pytest.fixture(scope="module")
def items(task):
    return task.sample_items(400, "train", np.random.default_rng(0))


def visible(item, name):
    return [t for t, f in enumerate(item.frames.frames) if any(o.name == name for o in f)]


def first_seen(item, name):
    return visible(item, name)[0]


def gold_from_frames(item):
    """The answer recomputed from the frames alone."""
    q = item.question
    if item.qtype == "temporal_order":
        return min(range(2), key=lambda i: first_seen(item, item.options[i]))
    if item.qtype == "action_direction":
        xs = [o.x for f in item.frames.frames for o in f if o.name == item.target]
        return 0 if xs[-1] < xs[0] else 1
    names = {o.name for f in item.frames.frames for o in f}
    if item.qtype == "object_attribute":
        shape = q.split()[-1].rstrip("?")
        (name,) = [n for n in names if n.endswith(shape)]
        return item.options.index(name.split()[0])
    if item.qtype == "counting":
        shape = q.split()[2][:-1]
        return sum(n.endswith(shape) for n in names) - 1
    return 0 if q[len("Is there a "):-1] in names else 1


def rows_of(item, name):
    (y,) = {o.y for f in item.frames.frames for o in f if o.name == name}
    return y


def cue_agrees(item, layout="flicker"):
    """The spurious cue, computed from shuffle-invariant features only."""
    if item.qtype == "temporal_order":
        gold = item.options[item.answer]
        other = item.options[1 - item.answer]
        if layout == "flicker":  # a prior on the answer: option A
            return item.answer == 0
        return len(visible(item, gold)) > len(visible(item, other))
    return (rows_of(item, item.target) < 2) == (item.options[item.answer] == "left")


def test_registered_and_config_errors():
    assert ENVIRONMENTS.get("video_qa") is VideoQATask
    assert VideoQATask({"num_frames": 10}).config.num_frames == 10
    with pytest.raises(ConfigError, match="env: unknown key.*frames"):
        VideoQATask(frames=8)
    with pytest.raises(ConfigError, match="task.qtypes"):
        VideoQATask(qtypes=["causal"])
    with pytest.raises(ConfigError, match="task.cue_strength"):
        VideoQAConfig(cue_strength=1.5)
    with pytest.raises(DataError, match="split"):
        VideoQATask().sample_items(2, "val")


def test_items_are_well_formed_and_answers_follow_from_frames(items):
    for it in items:
        assert it.options[-1] == ABSTAIN_OPTION and it.answer < it.abstain_index
        assert isinstance(it.frames, SymbolicFrames) and it.num_frames == 8
        assert it.meta["rendering"] == "symbolic" and it.meta["view"] == "orig"
        assert 2 <= len(it.meta["objects"]) <= 3
        assert gold_from_frames(it) == it.answer, it.item_id
        assert not it.hard and it.split == "train"


def test_balanced_types_and_answers(task):
    its = task.sample_items(1000, "train", np.random.default_rng(1))
    counts = {q: sum(it.qtype == q for it in its) for q in SYNTH_QTYPES}
    assert set(counts.values()) == {200}
    for q in SYNTH_QTYPES:  # every non-abstain option is gold for some item, and none dominates
        of_q = [it for it in its if it.qtype == q]
        shares = np.bincount([it.answer for it in of_q]) / len(of_q)
        if q == "temporal_order":  # its cue is a prior on the answer: option A at cue_strength
            assert abs(shares[0] - task.config.cue_strength) < 0.06, shares
            continue
        assert len(shares) == len(of_q[0].options) - 1 and shares.min() > 0.5 / len(shares), (q, shares)


def test_evidence_lies_only_in_support(items):
    for it in items:
        if it.support is None:
            assert it.qtype == "existence" and it.answer == 1 and it.target is None
            continue
        s, e = it.support
        inside = set(range(s, e + 1))
        if it.qtype == "temporal_order":
            a, b = sorted(first_seen(it, o) for o in it.options[:2])
            assert (a, b) == (s, e) and it.target is None
            assert all(len(visible(it, o)) == 1 for o in it.options[:2])  # each seen once
        elif it.qtype == "counting":
            shape = it.question.split()[2][:-1]
            counted = {n for n in it.meta["objects"] if n.endswith(shape)}
            assert it.target in counted
            assert {t for n in counted for t in visible(it, n)} <= inside
        else:  # flickering: seen in some frames of its support, at both ends
            vis = visible(it, it.target)
            assert set(vis) <= inside and (vis[0], vis[-1]) == (s, e), it.item_id


@pytest.mark.parametrize("layout", ["flicker", "spans"])
def test_temporal_order_reverse_flips_first_appearance(layout):
    # A starts and ends before B, so the reversed clip has the other object first.
    task = VideoQATask(layout=layout)
    for it in task.sample_items(200, "train", np.random.default_rng(0)):
        if it.qtype == "temporal_order":
            gold, other = it.options[it.answer], it.options[1 - it.answer]
            assert visible(it, gold)[-1] < visible(it, other)[-1]


def test_spans_layout_keeps_the_former_contiguous_clips():
    """``layout=spans``: every object over one contiguous span, the frequency cue on order."""
    task = VideoQATask(layout="spans", order_noise=0.0)
    its = task.sample_items(400, "train", np.random.default_rng(0))
    for it in its:
        for name in it.meta["objects"]:
            vis = visible(it, name)
            assert vis == list(range(vis[0], vis[-1] + 1))
        assert gold_from_frames(it) == it.answer
    order = [it for it in its if it.qtype == "temporal_order"]
    assert np.mean([cue_agrees(it, "spans") for it in order]) > 0.75


def test_flicker_objects_are_often_not_contiguous(items):
    runs = [sum(1 for i, t in enumerate(v) if i == 0 or t != v[i - 1] + 1)
            for it in items for v in (visible(it, n) for n in it.meta["objects"]) if len(v) > 1]
    assert 0.5 < np.mean([r > 1 for r in runs]) < 0.95


def test_deterministic_given_seed(task):
    a = task.sample_items(20, "train", np.random.default_rng(7))
    b = task.sample_items(20, "train", np.random.default_rng(7))
    assert [task.prompt(x) for x in a] == [task.prompt(x) for x in b]
    fresh = VideoQATask()
    assert [x.item_id for x in task.eval_items(10, EVAL_SEED)] == [x.item_id for x in fresh.eval_items(10, EVAL_SEED)]


def test_train_and_test_clips_are_disjoint(task):
    train = {it.meta["clip"] for it in task.sample_items(1000, "train", np.random.default_rng(2))}
    test = {it.meta["clip"] for it in task.eval_items(250, EVAL_SEED)}
    assert train and test and not train & test


@pytest.mark.parametrize("layout", ["flicker", "spans"])
def test_cue_rate_in_train_matches_cue_strength(layout):
    task = VideoQATask(qtypes=["temporal_order", "action_direction"], cue_strength=0.85, layout=layout)
    its = task.sample_items(6000, "train", np.random.default_rng(3))
    for q in ("temporal_order", "action_direction"):
        agree = [cue_agrees(it, layout) for it in its if it.qtype == q]
        assert [it.meta["cue"] for it in its if it.qtype == q] == agree
        assert abs(np.mean(agree) - 0.85) < 0.03, (q, np.mean(agree))


def test_test_split_half_of_temporal_items_break_the_cue(task):
    its = task.eval_items(200, EVAL_SEED)
    assert {q: sum(it.qtype == q for it in its) for q in SYNTH_QTYPES} == dict.fromkeys(SYNTH_QTYPES, 40)
    for q in ("temporal_order", "action_direction"):
        tq = [it for it in its if it.qtype == q]
        assert sum(it.hard for it in tq) == len(tq) // 2
        assert all(it.hard == (not cue_agrees(it)) for it in tq)
    assert not any(it.hard for it in its if it.qtype not in ("temporal_order", "action_direction"))


def test_prompts_and_rows(task, items):
    it = next(x for x in items if x.qtype == "existence" and x.support is not None)
    p = task.prompt(it)
    question, frames = p.splitlines()
    # Question first, object names as codes, then one "|"-separated entry per frame.
    code = it.target.split()[0][0] + it.target.split()[1][0]
    assert question.startswith(it.question.replace(it.target, code)) and "A. yes B. no C. Cannot be" in question
    assert len(frames.split(" | ")) == it.num_frames and code in frames.split()
    mover = next(x for x in items if x.qtype == "action_direction")
    assert any(tok[2:].isdigit() and len(tok) == 4 for tok in task.prompt(mover).splitlines()[1].split())
    pp = task.pixel_prompt(it)
    assert it.question in pp and it.options_text() in pp and "|" not in pp
    rows = task.sample(40, "train", np.random.default_rng(0))
    assert all(set(r) == {"prompt", "answer", "item", "group"} and r["answer"] == r["item"].gold_letter
               and r["group"] == r["item"].qtype for r in rows)
    # Each prompt is one rendering: the clip as it is, or backwards (order_noise).
    shown = [r["prompt"] == task.prompt(r["item"]) for r in rows]
    assert all(s or r["prompt"] == task.prompt(backwards(r["item"])) for s, r in zip(shown, rows, strict=True))
    assert 0 < shown.count(False) < len(rows) / 2


def test_every_object_code_tokenises_the_same_wherever_it_stands(task, items):
    """The first frame's first object is not a word at the start of a line: its token is the
    one every other occurrence of the code has (so "which appears first" is no one-token lookup)."""
    from troupe.actors.models import train_tokenizer

    tok = train_tokenizer(task.corpus(2000), 384)
    for it in items[:60]:
        ids = tok(task.prompt(it))["input_ids"]
        frames = task.prompt(it).splitlines()[1]
        first = next((o for o in it.frames.frames[0]), None)
        if first is None:
            continue
        code = frames.split()[1]  # after the opening "|"
        (want,) = tok(" " + code[:2], add_special_tokens=False)["input_ids"]
        assert want in ids and frames.startswith("| " + code)


def test_parse_answer_round_trip(items):
    for it in items[:50]:
        n = len(it.options)
        assert parse_answer(it.gold_letter, n) == it.answer
        assert parse_answer(f"Answer: ({it.gold_letter})", n) == it.answer
        assert parse_answer(it.letters[-1], n) == ABST


def test_prompt_token_budget(task):
    from troupe.actors.models import train_tokenizer

    tok = train_tokenizer(task.corpus(4000), 384)
    its = task.sample_items(1000, "train", np.random.default_rng(4)) + task.eval_items(250, EVAL_SEED)
    lengths = [len(tok(task.prompt(it))["input_ids"]) for it in its]
    assert max(lengths) <= 80, max(lengths)


def test_pixel_rendering_agrees_with_symbolic(task, items):
    cell = 56 // 5
    for it in items[:60]:
        px = task.render_pixels(it)
        assert px.frames.shape == (8, 56, 56, 3) and px.frames.dtype == np.uint8
        assert px.meta["rendering"] == "pixels" and px.question == it.question and px.answer == it.answer
        for t, objs in enumerate(it.frames.frames):
            frame = px.frames[t]
            drawn = np.zeros((56, 56), bool)
            for o in objs:  # the object's colour at its cell centre, nowhere else unexpected
                x0, y0, x1, y1 = cell_box(o.x, o.y, 56, 5)
                assert tuple(frame[y0 + cell // 2, x0 + cell // 2]) == RGB[o.name.split()[0]]
                drawn[y0:y1, x0:x1] = True
            assert (frame[~drawn] == BACKGROUNDS["mean"]).all()  # the background outside the objects' cells
        if it.target is None:
            assert px.boxes is None
        else:
            vis = visible(it, it.target)
            assert [t for t in range(8) if not np.isnan(px.boxes[t]).any()] == vis


def test_pixel_background_is_a_flag_and_a_bad_one_names_the_choices(items):
    black = VideoQATask(pixel_background="black").render_pixels(items[0])
    mean = VideoQATask().render_pixels(items[0])
    empty = (mean.frames == BACKGROUNDS["mean"]).all(-1)
    assert empty.any() and not black.frames[empty].any()  # the same empty pixels, black
    assert np.array_equal(black.frames[~empty], mean.frames[~empty])  # the objects unchanged
    with pytest.raises(ConfigError, match="pixel_background='grey'.*mean, black"):
        VideoQATask(pixel_background="grey")


def test_fixed_queries_ask_about_the_same_objects():
    task = VideoQATask(fixed_queries=True)
    items = task.sample_items(200, "train", np.random.default_rng(3))
    order = [it for it in items if it.qtype == "temporal_order"]
    assert {tuple(it.options[:2]) for it in order} == {("green square", "red circle")}
    assert {it.answer for it in order} == {0, 1}  # either object may come first
    assert {it.question for it in items if it.qtype == "existence"} == {"Is there a red circle?"}
    assert {it.target for it in items if it.qtype == "action_direction"} == {"blue triangle"}
    assert {it.question for it in items if it.qtype == "object_attribute"} == {"What colour is the circle?"}
    assert {it.question for it in items if it.qtype == "counting"} == {"How many triangles appear?"}
    # The cue still follows cue_strength and the test split still has half hard temporal items.
    test = task.eval_items(100, EVAL_SEED)
    temporal = [it for it in test if it.qtype in ("temporal_order", "action_direction")]
    assert sum(it.hard for it in temporal) == len(temporal) // 2


def test_type_round_robin_does_not_restart_on_every_call(task):
    """Calls of 8 items each: every type gets its share over calls (a call no longer starts
    at the first type), while a test set still has equal counts per type."""
    rng = np.random.default_rng(0)
    counts = {q: 0 for q in SYNTH_QTYPES}
    for _ in range(200):
        for it in task.sample_items(8, "train", rng):
            counts[it.qtype] += 1
    assert all(abs(v / 1600 - 0.2) < 0.03 for v in counts.values()), counts
    weighted = task.eval_items(180, EVAL_SEED, temporal_weight=3)
    got = {q: sum(it.qtype == q for it in weighted) for q in SYNTH_QTYPES}
    assert got == {"temporal_order": 60, "action_direction": 60, "object_attribute": 20, "counting": 20,
                   "existence": 20}
    assert sum(it.hard for it in weighted) == 60


def test_render_noise_is_redrawn_per_rendering_and_flips_the_shown_order():
    """``noise_mode=render``: the clip's frames always show its answer; each rendering
    (`perceive`) is backwards with probability ``order_noise``, which flips both temporal
    answers and leaves every other answer, the cue and the frame multiset as they were."""
    task = VideoQATask(qtypes=list(SYNTH_QTYPES), order_noise=0.2)
    its = task.sample_items(1000, "train", np.random.default_rng(4))
    assert all(gold_from_frames(it) == it.answer for it in its)
    rng = np.random.default_rng(0)
    flips = {q: [] for q in SYNTH_QTYPES}
    for it in its:
        for _ in range(4):  # several renderings of one clip differ
            shown = task.perceive(it, rng)
            back = shown.meta.get("perceived") == "backwards"
            assert sorted(map(str, shown.frames.frames)) == sorted(map(str, it.frames.frames))
            assert back == (shown.frames.frames != it.frames.frames) or it.frames.frames == it.frames.frames[::-1]
            if it.qtype in ("temporal_order", "action_direction"):
                assert (gold_from_frames(shown) != it.answer) == back
                assert cue_agrees(shown) == it.meta["cue"]
            else:
                assert gold_from_frames(shown) == it.answer
            flips[it.qtype].append(back)
    assert all(abs(np.mean(v) - 0.2) < 0.04 for v in flips.values()), {q: np.mean(v) for q, v in flips.items()}
    quiet = VideoQATask(order_noise=0.0)
    assert all(quiet.perceive(it, rng) is it for it in its[:50])
    clip_mode = VideoQATask(order_noise=0.2, noise_mode="clip")
    assert all(clip_mode.perceive(it, rng) is it for it in its[:50])


def test_order_noise_flips_what_the_frames_show_not_the_cue():
    """``noise_mode=clip`` (the former noise): frames contradict the answer at ``order_noise``,
    fixed per clip, in both splits; the cue (shuffle-invariant) still agrees at
    ``cue_strength`` and half the test temporal items still break it."""
    with pytest.raises(ConfigError, match="task.order_noise"):
        VideoQAConfig(order_noise=0.5)
    with pytest.raises(ConfigError, match="task.noise_mode"):
        VideoQAConfig(noise_mode="frames")
    with pytest.raises(ConfigError, match="task.layout"):
        VideoQAConfig(layout="grid")
    task = VideoQATask(qtypes=["temporal_order", "action_direction"], order_noise=0.2, noise_mode="clip")
    train = task.sample_items(6000, "train", np.random.default_rng(4))
    test = task.eval_items(2000, EVAL_SEED)
    for its in (train, test):
        for q in ("temporal_order", "action_direction"):
            tq = [it for it in its if it.qtype == q]
            flipped = np.mean([gold_from_frames(it) != it.answer for it in tq])
            assert abs(flipped - 0.2) < 0.03, (q, flipped)
            assert [it.meta["cue"] for it in tq] == [cue_agrees(it) for it in tq]
    for q in ("temporal_order", "action_direction"):
        assert abs(np.mean([cue_agrees(it) for it in train if it.qtype == q]) - 0.85) < 0.03
        tq = [it for it in test if it.qtype == q]
        assert sum(it.hard for it in tq) == len(tq) // 2
        assert all(it.hard == (not cue_agrees(it)) for it in tq)
    # Without clip noise no extra draw is made: the clips are those of a task without noise.
    plain = VideoQATask().sample_items(50, "train", np.random.default_rng(5))
    zero = VideoQATask(order_noise=0.0, noise_mode="clip").sample_items(50, "train", np.random.default_rng(5))
    assert [it.item_id for it in plain] == [it.item_id for it in zero]
