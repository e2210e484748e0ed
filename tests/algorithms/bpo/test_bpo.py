"""BPO as an algorithm: pack building and budget matching, evaluation metrics, config errors,
and the smoke preset end to end on a local Ray cluster."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from troupe import Run
from troupe.algorithms.bpo.algorithm import (
    BPO,
    NullPriorSFT,
    PixelSFTTask,
    advantage_shares,
    call_advantage,
    claim_check,
    report_sections,
)
from troupe.algorithms.bpo.behavior import ar_cf, pack_rms_normalise
from troupe.algorithms.bpo.config import ARMS, BPOConfig, BPOSettings
from troupe.algorithms.bpo.evaluation import (
    accuracy_by_type,
    answer_shares,
    behaviour_metrics,
    bootstrap,
    hard_by_type,
    item_record,
)
from troupe.cli import main
from troupe.envs.video_qa import BehaviorTable, VideoQATask
from troupe.envs.video_qa.items import ABST, TEMPORAL_QTYPES
from troupe.envs.video_qa.pixels import BACKGROUNDS
from troupe.platform.config import resolve
from troupe.platform.errors import ConfigError
from troupe.platform.metrics import read_metrics
from troupe.platform.registry import ADVANTAGES


def _algo(**bpo) -> BPO:
    """A BPO with its task and table but no model or actors (enough to build packs)."""
    algo = BPO.__new__(BPO)
    algo.config = BPOConfig(bpo=BPOSettings(**bpo))
    algo.task = VideoQATask()
    algo.table = BehaviorTable()
    algo.pixels = False
    algo.train_items = None
    return algo


def test_train_metrics_count_the_groups_whose_responses_all_scored_alike():
    from troupe.algorithms.rollout import RolloutResult

    algo = _algo(prompts_per_step=2)
    items = algo.task.sample_items(2, "train", np.random.default_rng(0))
    pack = algo.build_pack(ARMS["grpo"], items, np.random.default_rng(1))  # two groups of five
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    gold = torch.tensor([float(r["gold"]) for r in pack.rows])
    answers = gold.clone()
    answers[6] = gold[6] + 1  # one wrong answer in the second group
    scored = RolloutResult([], rewards, {"answer": answers}, [], 0, 0.0, 0.0)
    out = algo.train_metrics("grpo", pack, scored, torch.zeros(10))
    assert out["zero_std_groups/grpo"] == 0.5 and out["reward/grpo"] == pytest.approx(0.9)
    first, second = pack.rows[0]["qtype"], pack.rows[5]["qtype"]
    assert first != second  # the round-robin deals two types
    assert out[f"train_acc_{first}/grpo"] == 1.0 and out[f"train_acc_{second}/grpo"] == 0.8


@pytest.mark.parametrize("anchors,num_views,per_view", [(2, 3, 1), (1, 1, 1), (1, 3, 1), (2, 2, 3)])
def test_budget_matching_bpo_and_grpo_generate_the_same_number_of_responses(anchors, num_views, per_view):
    algo = _algo(anchors=anchors, num_views=num_views, per_view=per_view, prompts_per_step=8)
    items = algo.task.sample_items(8, "train", np.random.default_rng(0))
    sizes = {name: len(algo.build_pack(ARMS[name], items, np.random.default_rng(1)).prompts)
             for name in ("bpo", "grpo", "aug_grpo", "bpo_random", "bpo_ar_literal", "bpo_flip", "bpo_temporal_views", "aug_grpo_temporal_views")}
    want = 8 * (anchors + num_views * per_view)
    assert set(sizes.values()) == {want}
    assert len(algo.build_pack(ARMS["grpo_2x"], items, np.random.default_rng(1)).prompts) == 2 * want


def test_bpo_pack_structure_and_aug_grpo_labels():
    algo = _algo()
    items = algo.task.sample_items(5, "train", np.random.default_rng(3))
    pack = algo.build_pack(ARMS["bpo"], items, np.random.default_rng(4))
    assert pack.group_ids.tolist() == [j for j in range(5) for _ in range(5)]
    assert pack.is_anchor.tolist() == [True, True, False, False, False] * 5
    for j, item in enumerate(items):
        labels = pack.labels[5 * j: 5 * j + 5]
        assert labels[:2] == ["ORIG", "ORIG"]
        assert "ABST" in labels and "SENS" in labels  # one SENS and one ABST view per prompt (§A.2)
        for lab, row in zip(labels[2:], pack.rows[5 * j + 2: 5 * j + 5], strict=True):
            assert algo.table.label(item.qtype, row["view"]) == lab
    assert all(" | " in p for p in pack.prompts)  # the frames are in every prompt
    aug = algo.build_pack(ARMS["aug_grpo"], items, np.random.default_rng(4))
    # Augmentation: every view rewarded for the original answer, as STAB (the linear benchmark's
    # label; ORIG would add the format bonus on views too); the anchors stay ORIG.
    assert aug.labels == [("ORIG" if a else "STAB") for a in aug.is_anchor.tolist()]
    assert [r["view"] for r in aug.rows] == [r["view"] for r in pack.rows]
    assert pack.letters[0] == items[0].letters
    # bpo_flip trains with FLIP on reversed order/direction clips; its other cells are the run's.
    items = algo.task.sample_items(40, "train", np.random.default_rng(5))
    flip = algo.build_pack(ARMS["bpo_flip"], items, np.random.default_rng(6))
    by_view = {(it.qtype, r["view"]): r["label"] for it, r in zip([i for i in items for _ in range(5)], flip.rows,
                                                                 strict=True)}
    assert by_view[("temporal_order", "reverse")] == by_view[("action_direction", "reverse")] == "FLIP"
    assert {lab for (q, v), lab in by_view.items() if v == "reverse" and q not in TEMPORAL_QTYPES} <= {"SENS", "STAB"}


def test_temporal_views_arm_trains_other_types_on_the_original_alone():
    algo = _algo()
    items = algo.task.sample_items(20, "train", np.random.default_rng(3))
    pack = algo.build_pack(ARMS["bpo_temporal_views"], items, np.random.default_rng(4))
    assert pack.group_ids.tolist() == [j for j in range(20) for _ in range(5)]
    assert {it.qtype for it in items} - set(TEMPORAL_QTYPES)  # both kinds of pack are dealt
    for j, item in enumerate(items):
        rows, labels = pack.rows[5 * j: 5 * j + 5], pack.labels[5 * j: 5 * j + 5]
        if item.qtype in TEMPORAL_QTYPES:
            assert labels[:2] == ["ORIG", "ORIG"] and "SENS" in labels and "ABST" in labels
        else:  # five responses on the original, every one an anchor
            assert labels == ["ORIG"] * 5 and {r["view"] for r in rows} == {"orig"}
            assert pack.is_anchor[5 * j: 5 * j + 5].all()
    aug = algo.build_pack(ARMS["aug_grpo_temporal_views"], items, np.random.default_rng(4))
    assert [r["view"] for r in aug.rows] == [r["view"] for r in pack.rows]  # the same packs, STAB-rewarded
    assert aug.labels == [("ORIG" if a else "STAB") for a in aug.is_anchor.tolist()]
    # AR-cf on an all-anchor group is each response's reward minus the others' mean.
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0])
    adv = ar_cf(rewards, torch.zeros(5, dtype=torch.long), is_anchor=torch.ones(5, dtype=torch.bool),
                cf_baseline=torch.full((5,), math.nan))
    assert adv.tolist() == pytest.approx([1.0, -0.25, -0.25, -0.25, -0.25])


def test_pack_rms_gives_every_pack_unit_mass_and_grpo_on_anchor_groups():
    gids = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 2, 2])
    adv = torch.tensor([1.0, -0.25, -0.25, -0.25, -0.25, 0.3, -0.1, 0.0, 0.0, 0.0])
    out = pack_rms_normalise(adv, gids)
    # The first pack is AR-cf on five anchors (r = 1, 0, 0, 0, 0): GRPO's (r - 0.2) / 0.4.
    assert out[:5].tolist() == pytest.approx([2.0, -0.5, -0.5, -0.5, -0.5], abs=1e-3)
    rms = math.sqrt((0.3**2 + 0.1**2) / 3)  # unit mass, but for the 1e-4 that guards a near-flat pack
    assert float((out[5:8] ** 2).mean()) == pytest.approx((rms / (rms + 1e-4)) ** 2, rel=1e-5)
    assert out[8:].tolist() == [0.0, 0.0]  # a flat pack stays flat


def test_advantage_shares_split_the_update_by_question_type():
    shares = advantage_shares(["counting", "counting", "existence", "temporal_order"],
                              torch.tensor([0.5, -0.5, 0.0, -3.0]))
    assert shares == pytest.approx({"counting": 0.25, "existence": 0.0, "temporal_order": 0.75})
    assert advantage_shares(["counting"], torch.zeros(1)) == {}


def test_rotate_slots_gives_one_view_packs_the_null_view():
    items = _algo().task.sample_items(30, "train", np.random.default_rng(7))

    def labels(**bpo) -> list[str]:
        pack = _algo(anchors=1, num_views=1, per_view=1, **bpo).build_pack(ARMS["bpo"], items,
                                                                          np.random.default_rng(8))
        return [lab for lab, a in zip(pack.labels, pack.is_anchor.tolist(), strict=True) if not a]

    assert "ABST" not in labels()  # §A.2's first slot only: STAB, SENS or FLIP
    rotated = labels(rotate_slots=True)
    # prompts 2, 5, 8, ... start the cycle at the ABST slot (the null view applies to every item);
    # another prompt gets it only where its slot has no candidate (the documented fallback)
    abst = {j for j, lab in enumerate(rotated) if lab == "ABST"}
    assert set(range(2, 30, 3)) <= abst and len(abst) < 15


def test_a_steps_pack_is_rebuilt_the_same_so_a_rollout_generated_ahead_resumes_exactly():
    # run.staleness > 0: a pack built when its rollout started ahead (before a checkpoint) and
    # the one built again by the resumed run must be the same rows, labels and groups.
    algo, resumed = _algo(prompts_per_step=4), _algo(prompts_per_step=4)
    a, again = algo.step_pack("bpo", 7), resumed.step_pack("bpo", 7)
    assert a.prompts == again.prompts and a.rows == again.rows and a.labels == again.labels
    assert a.group_ids.tolist() == again.group_ids.tolist() and a.letters == again.letters
    assert algo.step_pack("bpo", 8).prompts != a.prompts  # and it does depend on the step
    grpo = algo.step_pack("grpo", 7)  # every arm gets the same prompts' clips
    assert {r["item_id"] for r in grpo.rows} == {r["item_id"] for r in a.rows}


def test_call_advantage_passes_pack_fields_only_to_estimators_that_take_them():
    r, g = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 0, 0])
    a = torch.tensor([True, True, False, False])
    kw = {"is_anchor": a, "cf_baseline": torch.tensor([math.nan, math.nan, 1.0, 0.5])}
    assert call_advantage(ADVANTAGES.get("dr_grpo"), r, g, kw).tolist() == pytest.approx([0.25, -0.75, 0.25, 0.25])
    assert call_advantage(ADVANTAGES.get("ar_cf"), r, g, kw).tolist() == pytest.approx([1.0, -1.0, 0.0, 0.5])


class _Item:
    def __init__(self, qtype, answer=0, hard=False):
        self.item_id, self.qtype, self.answer, self.hard = "x", qtype, answer, hard


def test_every_temporal_pack_holds_the_reverse_view():
    algo = _algo()
    items = algo.task.sample_items(60, "train", np.random.default_rng(3))
    pack = algo.build_pack(ARMS["bpo"], items, np.random.default_rng(4))
    temporal = [[r["view"] for r in pack.rows[5 * j: 5 * j + 5]] for j, it in enumerate(items)
                if it.qtype in ("temporal_order", "action_direction")]
    assert temporal and all("reverse" in views and "null" in views for views in temporal)
    drawn = _algo(reverse_in_temporal_packs=False).build_pack(ARMS["bpo"], items, np.random.default_rng(4))
    without = [[r["view"] for r in drawn.rows[5 * j: 5 * j + 5]] for j, it in enumerate(items)
               if it.qtype in ("temporal_order", "action_direction")]
    assert not all("reverse" in views for views in without)  # §A.2's slots alone: about two thirds


def test_report_warns_when_a_view_is_distinguishable_by_nontemporal_features():
    from troupe.envs.video_qa.distinguishability import view_distinguishability

    ci = {"value": 0.5, "lo": 0.4, "hi": 0.6}
    arms = {"bpo": {"step": 1, "responses_per_prompt": 5, "metrics": dict.fromkeys(("macro_acc",), ci)}}
    spans = view_distinguishability(VideoQATask(layout="spans", order_noise=0.0), n=300, seed=0)
    (text,) = report_sections(BPOConfig(), {"arms": arms, "view_check": spans})
    head = text.split("Held-out")[0]
    assert "**Warning:**" in head and "shuffle view can be told from the original" in head
    flicker = view_distinguishability(VideoQATask(), n=300, seed=0)
    (text,) = report_sections(BPOConfig(), {"arms": arms, "view_check": flicker})
    assert "Warning" not in text and "- shuffle: held-out accuracy" in text



def test_report_shows_every_question_type_beside_the_temporal_hard_ones():
    # The five-type macro can fall on one type (measured: GRPO's counting); the report shows which.
    ci = {"value": 0.5, "lo": 0.4, "hi": 0.6}
    arms = {"grpo": {"step": 400, "responses_per_prompt": 5, "metrics": {"macro_acc": ci},
                     "by_type": {"counting": {"value": 0.633, "n": 150}, "temporal_order": {"value": 0.5, "n": 4}},
                     "hard_by_type": {"temporal_order": {"value": 0.0, "n": 2}}}}
    summary = {"arms": arms, "sft_by_type": {"counting": {"value": 0.767, "n": 150}},
               "sft_hard_by_type": {"temporal_order": {"value": 0.5, "n": 2}}}
    (text,) = report_sections(BPOConfig(), summary)
    every = text.split("Accuracy by question type, every item (items):")[1].split("Temporal-hard accuracy")[0]
    assert "| policy | counting | temporal_order |" in every
    assert "| SFT | 0.767 (150) | – |" in every and "| grpo | 0.633 (150) | 0.500 (4) |" in every
    hard = text.split("Temporal-hard accuracy by question type (items):")[1]
    assert "| SFT | 0.500 (2) |" in hard and "| grpo | 0.000 (2) |" in hard


def test_report_shows_each_policys_answers_beside_the_gold():
    # A collapsed type (measured: BPO's counting never answering the middle count) shows as options left out.
    arms = {"bpo": {"step": 400, "responses_per_prompt": 5, "metrics": {},
                    "answers": {"counting": {"A": 0.52, "C": 0.48}}}}
    summary = {"arms": arms, "gold_answers": {"counting": {"A": 0.34, "B": 0.33, "C": 0.33}},
               "sft_answers": {"counting": {"A": 0.46, "B": 0.17, "C": 0.37}}}
    (text,) = report_sections(BPOConfig(), summary)
    table = text.split("Answers by question type")[1]
    assert "| question type | gold | SFT | bpo |" in table
    assert "| counting | A 0.34 · B 0.33 · C 0.33 | A 0.46 · B 0.17 · C 0.37 | A 0.52 · C 0.48 |" in table


def test_report_gives_the_sampled_abstention_rate_when_abstention_f1_does_not_separate():
    from troupe.algorithms.bpo.algorithm import late_abstain_rates

    history = [{"step": s, "train_abstain/bpo": 0.5 if s < 10 else 0.01, "train_abstain/grpo": 0.0} for s in range(60)]
    assert late_abstain_rates(history, ["bpo", "grpo", "aug_grpo"]) == {"bpo": pytest.approx(0.01), "grpo": 0.0}

    ci = lambda v: {"value": v, "lo": v - 0.05, "hi": v + 0.05}  # noqa: E731
    arm = lambda th, f1: {"step": 400, "responses_per_prompt": 5,  # noqa: E731
                          "metrics": {"temporal_hard_acc": ci(th), "abstain_f1": ci(f1), "macro_acc": ci(0.7)}}
    arms = {"grpo": arm(0.2, 0.0), "bpo": arm(0.4, 0.0)}
    summary = {"arms": arms, "claim": claim_check(arms), "train_abstain_end": {"bpo": 0.004}}
    (text,) = report_sections(BPOConfig(), summary)
    assert "abstained 0.4% of the time over its last 50 steps" in text
    arms["bpo"] = arm(0.4, 0.8)  # separated: nothing to explain
    (text,) = report_sections(BPOConfig(), {**summary, "arms": arms, "claim": claim_check(arms)})
    assert "abstained" not in text


def test_macro_groups_is_the_three_group_mean():
    conf = np.array([0.9, 0.05, 0.05])
    recs = [item_record(_Item("temporal_order", 0, hard=True), 1, conf, ABST, []),  # hard: wrong
            item_record(_Item("temporal_order", 0), 0, conf, ABST, []),  # cue-consistent: right
            item_record(_Item("action_direction", 0), 0, conf, ABST, []),
            item_record(_Item("counting", 2), 2, conf, ABST, []),  # non-temporal: 1 of 2
            item_record(_Item("existence", 0), 1, conf, ABST, [])]
    m = behaviour_metrics(recs)
    assert m["macro_groups"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert m["macro_acc"] == pytest.approx((0.5 + 1.0 + 1.0 + 0.0) / 4)  # by question type
    assert behaviour_metrics(recs[3:])["macro_groups"] == pytest.approx(0.5)  # empty groups left out


def test_metrics_hand_values():
    conf = np.array([0.9, 0.05, 0.05])
    recs = [
        item_record(_Item("temporal_order", 0, hard=True), 0, conf, ABST, [("SENS", 1, conf), ("ABST", ABST, conf)]),
        item_record(_Item("temporal_order", 0, hard=True), 1, conf, 0, [("SENS", 1, conf)]),
        item_record(_Item("counting", 2), 2, conf, ABST, [("STAB", 2, conf), ("STAB", 0, conf),
                                                          ("SENS", 2, np.array([0.1, 0.1, 0.8]))]),
        item_record(_Item("counting", 2), ABST, conf, ABST, []),
    ]
    m = behaviour_metrics(recs)
    assert m["macro_acc"] == pytest.approx((0.5 + 0.5) / 2)
    assert m["temporal_hard_acc"] == pytest.approx(0.5)
    # Null copies: 3 of 4 abstain (TP=3, FN=1); originals: 1 abstains (FP=1) → F1 = 6 / 8.
    assert m["abstain_f1"] == pytest.approx(6 / 8)
    assert m["stability"] == pytest.approx(0.5)
    # SENS probes: changed (yes), unchanged (no), unchanged but c(orig answer 2) fell 0.05 → 0.8? no drop → no.
    assert m["sensitivity"] == pytest.approx(1 / 3)
    assert m["false_abstention"] == pytest.approx(0.25)
    ci = bootstrap(recs, n_resamples=200, seed=0)
    for k, v in ci.items():
        assert v["lo"] <= v["value"] + 1e-9 and v["value"] <= v["hi"] + 1e-9, k
    # By type, pooled over two "seeds" (the second one right on its hard item).
    again = [item_record(_Item("temporal_order", 0, hard=True), 0, conf, ABST, [])]
    assert hard_by_type([recs, again]) == {"temporal_order": {"value": pytest.approx(2 / 3), "n": 3}}
    assert accuracy_by_type([recs]) == {"counting": {"value": 0.5, "n": 2}, "temporal_order": {"value": 0.5, "n": 2}}
    # Answers and gold by type, pooled over seeds; abstentions after the letters.
    assert answer_shares([recs, again]) == {"counting": {"C": 0.5, "abstain": 0.5},
                                            "temporal_order": {"A": pytest.approx(2 / 3), "B": pytest.approx(1 / 3)}}
    assert answer_shares([recs], gold=True) == {"counting": {"C": 1.0}, "temporal_order": {"A": 1.0}}
    old = [{k: v for k, v in r.items() if k != "gold"} for r in recs]  # records from before the gold was kept
    assert answer_shares([old], gold=True) == {} and answer_shares([old])["counting"] == {"C": 0.5, "abstain": 0.5}
    # A FLIP probe is sensed only when the answer moved to the other of two options.
    flip = item_record(_Item("temporal_order", 0), 0, conf, ABST, [("FLIP", 1, conf), ("FLIP", 0, conf),
                                                                    ("FLIP", ABST, conf)])
    assert flip["sens"] == [True, False, False]


def test_claim_check_reads_intervals():
    def arm(th, f1, macro):
        return {"metrics": {"temporal_hard_acc": th, "abstain_f1": f1, "macro_acc": macro}}

    ci = lambda v, w=0.05: {"value": v, "lo": v - w, "hi": v + w}  # noqa: E731
    good = claim_check({"bpo": arm(ci(0.6), ci(0.9), ci(0.7)), "grpo": arm(ci(0.3), ci(0.0), ci(0.72))})
    assert good["holds"]
    bad = claim_check({"bpo": arm(ci(0.35), ci(0.9), ci(0.5)), "grpo": arm(ci(0.3), ci(0.0), ci(0.72))})
    assert not bad["temporal_hard"] and bad["abstain_f1"] and not bad["macro_not_lower"] and not bad["holds"]
    # 2x GRPO reaches BPO's abstention F1 (intervals overlap): the gap it had is closed.
    two = claim_check({"bpo": arm(ci(0.35), ci(0.9), ci(0.5)), "grpo": arm(ci(0.3), ci(0.0), ci(0.72)),
                       "grpo_2x": arm(ci(0.3), ci(0.85), ci(0.72))})
    assert two["grpo_2x_closes_gap"] == {"abstain_f1": True} and "closes the gap on abstain_f1" in two["lines"][-1]
    # With the SFT start: GRPO's macro accuracy against it, a line of its own.
    assert "grpo_macro_over_sft" not in good
    flat = claim_check({"bpo": arm(ci(0.6), ci(0.9), ci(0.7)), "grpo": arm(ci(0.3), ci(0.0), ci(0.72))},
                       {"macro_acc": ci(0.7)})
    assert not flat["grpo_macro_over_sft"] and flat["lines"][-1].endswith("not raised")
    up = claim_check({"bpo": arm(ci(0.6), ci(0.9), ci(0.7)), "grpo": arm(ci(0.3), ci(0.0), ci(0.72))},
                     {"macro_acc": ci(0.55)})
    assert up["grpo_macro_over_sft"] and up["holds"] and "GRPO higher, intervals apart" in up["lines"][-1]


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="bpo.arms"):
        resolve(BPOConfig, BPO.presets_dir(), None, ["bpo.arms=[grpo,ppo]"])
    with pytest.raises(ConfigError, match="bpo.anchors"):
        resolve(BPOConfig, BPO.presets_dir(), None, ["bpo.anchors=0"])
    with pytest.raises(ConfigError, match="bpo.adv_norm.*pack_rms"):  # the config's Literal check
        resolve(BPOConfig, BPO.presets_dir(), None, ["bpo.adv_norm=std"])
    with pytest.raises(ConfigError, match="cue_strength"):
        resolve(BPOConfig, BPO.presets_dir(), None, ["task.cue_strength=1.5"])
    with pytest.raises(ConfigError, match="reward.kind"):  # the pack reward is BPO's own
        resolve(BPOConfig, BPO.presets_dir(), None, ["reward.kind=model", "reward.path=some/rm"])
    cfg = resolve(BPOConfig, BPO.presets_dir(), "smoke", ["bpo.adv_mode=ar_literal", "task.cue_strength=0.6"])
    assert cfg.bpo.adv_mode == "ar_literal" and cfg.task.cue_strength == 0.6
    with pytest.raises(ConfigError, match="task.sft_null_share"):
        resolve(BPOConfig, BPO.presets_dir(), None, ["task.sft_null_share=1.0"])
    with pytest.raises(ConfigError, match="task.sft_null_abstain"):
        resolve(BPOConfig, BPO.presets_dir(), None, ["task.sft_null_abstain=-0.1"])


@pytest.mark.parametrize("pixels", [False, True])
def test_null_prior_rows_are_blank_clips_that_abstain_at_the_set_rate(pixels):
    task = VideoQATask(fixed_queries=True)
    inner = PixelSFTTask(task) if pixels else task
    rows = NullPriorSFT(inner, task, share=0.3, abstain=0.2).sample(2000, "train", np.random.default_rng(0))

    def blank(row):
        return (row["frames"] == BACKGROUNDS["mean"]).all() if pixels else set(row["prompt"].split("\n", 1)[1]) <= {"|", " ", "-"}

    assert not any(blank(r) for r in inner.sample(200, "train", np.random.default_rng(1)))
    null = [r for r in rows if blank(r)]
    assert abs(len(null) / len(rows) - 0.3) < 0.04
    abstained = [r["answer"] == r["item"].letters[r["item"].abstain_index] for r in null]
    assert abs(np.mean(abstained) - 0.2) < 0.05
    # The other answers spread over every other option (each a guess, not the gold).
    others = {r["answer"] for r, a in zip(null, abstained, strict=True) if not a and r["item"].qtype == "counting"}
    assert others == {"A", "B", "C"}
    # A share of 0 leaves the task's rows as they are, row for row.
    same = NullPriorSFT(inner, task, share=0.0, abstain=0.2).sample(50, "train", np.random.default_rng(3))
    assert [r["answer"] for r in same] == [r["answer"] for r in inner.sample(50, "train", np.random.default_rng(3))]


def _train_rows(run_dir):
    # Timings differ between runs; everything else must not.
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_metrics(run_dir / "metrics.jsonl")]


@pytest.mark.timeout(900)
def test_bpo_smoke_end_to_end_and_exact_resume(tmp_path, ray_local, troupe_cache, resume_from_checkpoint):
    fast = ["run.progress=false"]
    d = tmp_path / "full"
    with Run("bpo", preset="smoke", overrides=fast, out=d) as r:
        r.run()
        cfg = r.config
    report = (d / "report.md").read_text()
    assert "BPO against its baselines" in report and "| SFT |" in report
    assert "Temporal-hard accuracy by question type" in report
    assert "macro accuracy (3 groups)" in report and "tell a view from the original" in report
    assert (d / "plots" / "behaviour_rates.png").is_file()
    s = json.loads((d / "summary.json").read_text())
    assert set(s["arms"]) == {"grpo", "bpo"}
    for arm in s["arms"].values():
        assert set(arm["metrics"]) >= {"macro_acc", "macro_groups", "temporal_hard_acc", "abstain_f1"}
    assert set(s["view_check"]["views"]) == {"shuffle", "reverse"} and s["view_check"]["clips"] == 200
    rows = _train_rows(d)
    trained = [r for r in rows if "reward/bpo" in r]
    assert len(trained) == cfg.run.steps
    assert all(r["responses/step"] == cfg.bpo.prompts_per_step * cfg.bpo.pack_size for r in trained)
    assert (d / "eval" / "bpo" / "step_000000.jsonl").is_file()
    # `troupe report` rebuilds the same comparison from the files alone.
    (d / "report.md").unlink()
    assert main(["report", str(d)]) == 0
    assert "BPO against its baselines" in (d / "report.md").read_text()

    # Killed after its checkpoint at step 2 (the later one lost) and resumed: the same metrics as
    # the uninterrupted run.
    part = resume_from_checkpoint("bpo", d, tmp_path / "part", 2)
    assert _train_rows(part) == rows


def test_every_preset_resolves():
    names = sorted(p.stem for p in BPO.presets_dir().glob("*.yaml"))
    assert {"smoke", "baselines", "adv-modes", "vl-smoke", "vl-cpu", "vl-gpu"} <= set(names)
    for name in names:
        cfg = resolve(BPOConfig, BPO.presets_dir(), name, [])
        assert cfg.bpo.pack_size >= 2


def test_real_data_needs_the_pixel_rendering():
    with pytest.raises(ConfigError, match="task.rendering"):
        resolve(BPOConfig, BPO.presets_dir(), None,
                ["data.eval=[{name: nextqa, annotation_path: x.csv, video_root: v}]"])


@pytest.mark.timeout(900)
def test_bpo_vision_smoke_end_to_end(tmp_path, ray_local, troupe_cache):
    """The tiny VL model through the same graph: pixel frames in the rows, BPO and GRPO arms,
    each arm generating its next step's packs while it updates (``run.staleness=1``)."""
    d = tmp_path / "vl"
    with Run("bpo", preset="vl-smoke", overrides=["run.progress=false", "run.staleness=1"], out=d) as r:
        r.run()
    s = json.loads((d / "summary.json").read_text())
    assert set(s["arms"]) == {"grpo", "bpo"}
    rows = [r for r in _train_rows(d) if "reward/bpo" in r]
    assert len(rows) == 3 and all(math.isfinite(r["reward/bpo"]) for r in rows)
    # Step 0 generates before any update; steps 1 and 2 were generated during the update before.
    for arm in ("bpo", "grpo"):
        assert [r[f"staleness/{arm}"] for r in rows] == [0.0, 1.0, 1.0]


@pytest.mark.timeout(900)
def test_vl_gpu_preset_runs_on_cpu_with_a_hub_format_checkpoint(tmp_path, ray_local):
    """The one-GPU preset as a GPU user runs it (a Qwen2.5-VL checkpoint in hub format, bf16,
    no SFT, LoRA on the learner, adapter-only weight sync), with a tiny model of that
    architecture and the device and sizes turned down for CPU."""
    from troupe.actors.models import train_tokenizer
    from troupe.actors.vision import VISION_TOKENS, TinyVLSpec, build_tiny_vl, save_hub_format

    task = VideoQATask(pixel_size=56, grid=3)  # the prompts are those of either rendering
    tok = train_tokenizer(task.corpus(300), special_tokens=VISION_TOKENS)
    model = build_tiny_vl(TinyVLSpec(), tok, seed=0)
    ckpt = save_hub_format(model, tok, tmp_path / "qwen25vl-tiny", TinyVLSpec().layout())
    assert "troupe_video" not in json.loads((ckpt / "config.json").read_text())
    full_bytes = sum(p.numel() * 2 for p in model.parameters())  # bf16

    d = tmp_path / "run"
    cpu = [f"model.path={ckpt}", "model.device=cpu", "rollout.num_gpus=0", "learner.num_gpus=0",
           "rollout.num_cpus=0.5", "learner.num_cpus=0.5", "task.pixel_size=56", "task.grid=3",
           "bpo.prompts_per_step=2", "eval.num_prompts=6", "eval.bootstrap=20", "run.steps=2", "run.eval_every=2",
           "run.checkpoint_every=2", "run.progress=false"]
    with Run("bpo", preset="vl-gpu", overrides=cpu, out=d) as r:
        assert r.config.learner.lora.enabled and r.config.model.dtype == "bfloat16" and r.config.model.sft.steps == 0
        r.run()
    s = json.loads((d / "summary.json").read_text())
    assert set(s["arms"]) == {"grpo", "bpo"}
    rows = _train_rows(d)
    trained = [r for r in rows if "reward/bpo" in r]
    assert len(trained) == 2 and all(math.isfinite(r["reward/bpo"]) for r in trained)
    sync = [v for r in trained for k, v in r.items() if k.startswith("sync/bytes")]
    assert sync and all(0 < b < 0.2 * full_bytes for b in sync)  # the LoRA adapter only
    assert (d / "report.md").is_file()
