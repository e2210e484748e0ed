"""The synthetic video-QA task gives BPO's mechanism something to act on (the linear
benchmark's explanation, troupe/algorithms/bpo/linear.py, as tests of the task itself):

* the temporal evidence is in the frames and a tiny LM learns to read it (SFT on cue-free
  data, through the SFT path BPO builds its checkpoint with);
* the cue and the order evidence compete in training: the cue is right ``cue_strength`` of the
  time, the order a rendering shows ``1 - order_noise`` of the time, redrawn per rendering;
* a shuffled or reversed clip cannot be told from its original by non-temporal features, so
  a SENS reward on it is earned only by reading the order; the former contiguous-span layout
  fails that check, and the check says so.
"""

from __future__ import annotations

import numpy as np
import pytest

from troupe.algorithms.bpo.config import TaskConfig
from troupe.envs.video_qa import VideoQATask, apply_view
from troupe.envs.video_qa.distinguishability import describe, view_distinguishability

TEMPORAL = ("temporal_order", "action_direction")


def bpo_task(**overrides) -> VideoQATask:
    """The task with BPO's defaults (`TaskConfig`: fixed queries), symbolic."""
    return VideoQATask(TaskConfig(), **overrides)  # a config instance is taken as is, extra fields and all


def first_seen(item, name):
    return next(t for t, f in enumerate(item.frames.frames) if any(o.name == name for o in f))


def order_read(item) -> int:
    """The answer a perfect order reader gives on this rendering."""
    if item.qtype == "temporal_order":
        return min(range(2), key=lambda i: first_seen(item, item.options[i]))
    xs = [o.x for f in item.frames.frames for o in f if o.name == item.target]
    return 0 if xs[-1] < xs[0] else 1


def cue_read(item) -> int:
    """The answer the cue gives: a prior on option A for order, the mover's row for direction;
    neither moves under any rearrangement of frames."""
    if item.qtype == "temporal_order":
        return 0
    row = {o.name: o.y for f in item.frames.frames for o in f}
    return 0 if row[item.target] < 2 else 1


def test_cue_and_order_evidence_compete_in_training():
    """§A.5's setting on the LM task: over renderings of training clips the order is read right
    about 1 - order_noise = 0.8 of the time and the cue is right about cue_strength = 0.85, so
    the likelihood-optimal answer follows the cue where they disagree. On the reversed view the
    order shows the other answer about 0.8 of the time, whatever the original's rendering
    showed; the cue never moves under shuffle or reverse."""
    task = bpo_task()
    rng = np.random.default_rng(0)
    items = [it for it in task.sample_items(3000, "train", rng) if it.qtype in TEMPORAL]
    shown = [task.perceive(it, rng) for it in items]
    order_right = np.mean([order_read(s) == it.answer for s, it in zip(shown, items, strict=True)])
    cue_right = np.mean([cue_read(it) == it.answer for it in items])
    assert abs(order_right - 0.8) < 0.03 and abs(cue_right - 0.85) < 0.03, (order_right, cue_right)
    reversed_other = np.mean([order_read(task.perceive(apply_view(it, "reverse"), rng)) != it.answer for it in items])
    assert abs(reversed_other - 0.8) < 0.03
    for it in items[:300]:
        for view in ("shuffle", "reverse"):
            assert cue_read(apply_view(it, view, rng)) == cue_read(it)


def test_views_are_indistinguishable_by_nontemporal_features():
    """A classifier on object counts, contiguity, token frequencies and blank frames tells
    neither the shuffled nor the reversed clip from the original above chance (accuracy
    within the 95% binomial interval of 0.5 on 2 x 2000 rows)."""
    check = view_distinguishability(bpo_task(), n=2000, seed=0)
    for view in ("shuffle", "reverse"):
        r = check["views"][view]
        assert abs(r["accuracy"] - 0.5) <= r["half_width"], (view, r)
        assert abs(r["auc"] - 0.5) <= 0.03, (view, r)
    assert check["distinguishable"] == []
    assert not any(line.startswith("WARNING") for line in describe(check))


def test_contiguous_spans_make_the_shuffle_view_distinguishable_and_the_check_warns():
    """The former layout (one contiguous span per object): shuffling breaks contiguity, so
    "non-contiguous → change the answer" would earn SENS; the check reports it as a warning.
    Reverse keeps every such statistic, under either layout."""
    check = view_distinguishability(bpo_task(layout="spans", order_noise=0.0), n=1000, seed=0)
    assert check["distinguishable"] == ["shuffle"]
    assert check["views"]["shuffle"]["accuracy"] > 0.9
    assert abs(check["views"]["reverse"]["accuracy"] - 0.5) <= check["views"]["reverse"]["half_width"]
    warnings = [line for line in describe(check) if line.startswith("WARNING")]
    assert len(warnings) == 1 and "shuffle" in warnings[0]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("qtype", ["temporal_order", "action_direction"])
def test_a_tiny_lm_learns_the_temporal_evidence_from_cue_free_frames(tmp_path, qtype):
    """Through the SFT path BPO's checkpoint comes from (`fit_sft`, the embedded tiny LM and
    its locally trained tokenizer), on one temporal question type with no cue (cue_strength 0.5)
    and no order noise: held-out accuracy of the greedy letter is at least 0.8, so the evidence
    in the frames is learnable and a policy that leans on the cue has something better.

    Measured: at chance on a plateau (mean loss 0.35), then all at once. At lr 1e-3 the mean loss
    of order questions falls below 0.01 after 268-357 steps in each of seeds 0-4, and of direction
    questions after 292 steps (held-out 1.00); at 3e-3 (the SFT default) order learnt after
    400-800 steps on one machine and stayed on the plateau for all 1200 steps, in every seed, on
    another, so the test uses 1e-3. The fit stops once the loss is below 0.01
    (`model.sft.stop_loss`), with 1200 steps as the cap. Fitted together, the two types reach
    1.00 / 0.95 at the cap: each is asked alone so that the fit stops early."""
    import torch

    from troupe.actors.models import load_causal_lm
    from troupe.actors.sampling import chat_format
    from troupe.algorithms.sft import ModelConfig, SFTConfig, fit_sft

    task = bpo_task(cue_strength=0.5, order_noise=0.0, qtypes=[qtype])
    cfg = ModelConfig(sft=SFTConfig(steps=1200, batch_size=32, lr=1e-3, stop_loss=0.01))
    info = fit_sft(cfg, task, tmp_path)
    assert info["sft_steps"] < 1200 and info["final_loss"] < 0.01, info
    model, tok = load_causal_lm(str(tmp_path))
    test = task.eval_items(400, seed=1)
    prompts = chat_format(tok, [task.prompt(it) for it in test])
    letters = [tok(c, add_special_tokens=False)["input_ids"][0] for c in "AB"]
    right = {qtype: []}
    tok.padding_side = "left"
    with torch.no_grad():
        for i in range(0, len(test), 100):
            enc = tok(prompts[i:i + 100], return_tensors="pt", padding=True, add_special_tokens=False)
            pos = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)
            logits = model(**enc, position_ids=pos).logits[:, -1, letters]
            for it, pick in zip(test[i:i + 100], logits.argmax(-1).tolist(), strict=True):
                right[it.qtype].append(pick == it.answer)
    acc = {q: float(np.mean(v)) for q, v in right.items()}
    assert all(a >= 0.8 for a in acc.values()), acc

