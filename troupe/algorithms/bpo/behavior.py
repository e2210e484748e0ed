"""BPO's math as pure functions: behaviour rewards, the counterfactual baseline and the
anchor-relative advantages (shared/ALGORITHMS.md §A.2 steps 4–5).

Labels: ORIG (an anchor on the original view), STAB (the answer must stay a*), SENS (key
evidence removed: the answer must not stay confidently a*), ABST (no evidence: abstain), and
FLIP, an option beyond §A.2: a reversed two-option order/direction question must take the
other option (``1 - a*``), scored like STAB against that answer.
Answers are option indices, ``ABST`` (-1) or ``INVALID`` (-2), as `parse_answer` returns.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any

import torch

from troupe.envs.video_qa.items import ABST, INVALID, LETTERS, parse_answer
from troupe.platform.errors import DataError
from troupe.platform.registry import ADVANTAGES

LABELS = ("ORIG", "STAB", "SENS", "ABST", "FLIP")
LABEL_CODE = {name: i for i, name in enumerate(LABELS)}


# -- confidences ------------------------------------------------------------------------------
def letter_probs(option_logprobs: torch.Tensor | Sequence[float], num_options: int) -> torch.Tensor:
    """c_v(·): the letters' probabilities renormalised over the item's options (sums to 1)."""
    lp = torch.as_tensor(option_logprobs, dtype=torch.float64)[:num_options]
    return torch.softmax(lp, 0)


# -- per-response rewards (step 4) ---------------------------------------------------------------
def criterion(label: str, answer: int, gold: int, conf_gold: float, *, c_fa: float) -> float:
    """r_ℓ for a parsed ``answer``, without the format bonus. ``conf_gold`` is c_v(a*) on the
    response's own view (detached); ``c_fa`` is the false-abstention cost (``bpo.c_fa``).
    INVALID earns 0 under every label."""
    if answer == INVALID:
        return 0.0
    if label in ("ORIG", "STAB"):
        return float(answer == gold) - c_fa * float(answer == ABST)
    if label == "SENS":
        return 1.0 - float(answer == gold) * conf_gold
    if label == "ABST":
        return float(answer == ABST)
    if label == "FLIP":  # two options: the other one is 1 - a*
        return float(answer == 1 - gold) - c_fa * float(answer == ABST)
    raise DataError(f"behaviour label {label!r} is not one of {', '.join(LABELS)}")


def behaviour_met(label: str, answer: int, gold: int) -> bool:
    """Whether ``answer`` shows the behaviour ``label`` demands, as a yes/no (the pack bonus):
    ORIG/STAB keep a*, SENS moves off it, ABST abstains, FLIP takes the other of two options."""
    if label in ("ORIG", "STAB"):
        return answer == gold
    if label == "SENS":
        return answer != gold
    if label == "ABST":
        return answer == ABST
    if label == "FLIP":
        return answer == 1 - gold
    raise DataError(f"behaviour label {label!r} is not one of {', '.join(LABELS)}")


def well_formatted(completion: str, num_options: int) -> bool:
    """The answer format: the response is just an option letter, optionally ``(B)`` or ``B.``."""
    s = completion.strip().strip("().").strip()
    return len(s) == 1 and s in LETTERS[:num_options]


def behavior_reward(completion: str, label: str, gold: int, num_options: int,
                    option_logprobs: torch.Tensor | None = None, *, c_fa: float, r_fmt: float,
                    **_: Any) -> dict[str, float]:
    """The row's behaviour reward, its parsed answer and c_v(a*) (for baselines and metrics)."""
    if label == "FLIP" and num_options != 3:
        raise DataError(f"behaviour label FLIP needs two answer options plus the abstain option, got "
                        f"{num_options} options")
    answer = parse_answer(completion, num_options)
    conf_gold = float(letter_probs(option_logprobs, num_options)[gold]) if option_logprobs is not None else 1.0
    r = criterion(label, answer, gold, conf_gold, c_fa=c_fa)
    if label == "ORIG" and answer != INVALID and well_formatted(completion, num_options):
        r += r_fmt
    return {"reward": r, "answer": float(answer), "conf_gold": conf_gold}


# -- baselines and advantages (step 5) -----------------------------------------------------------
def label_codes(labels: Sequence[str]) -> torch.Tensor:
    bad = sorted({lab for lab in labels if lab not in LABEL_CODE})
    if bad:
        raise DataError(f"behaviour labels {bad} are not among {', '.join(LABELS)}")
    return torch.tensor([LABEL_CODE[lab] for lab in labels], dtype=torch.long)


def _pack_sums(group_ids: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-pack sums of ``values`` (rows → packs) and each row's pack index."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    sums = torch.zeros(int(inv.max()) + 1 if len(inv) else 0, dtype=torch.float64).index_add_(0, inv, values)
    return sums, inv


def counterfactual_baselines(group_ids: torch.Tensor, is_anchor: torch.Tensor, labels: Sequence[str] | torch.Tensor,
                             answers: torch.Tensor, gold: torch.Tensor, conf_gold: torch.Tensor,
                             c_fa: float) -> torch.Tensor:
    """AR-cf's baseline for each view response: the mean over the pack's anchors of its view's
    criterion scored on the anchor's answer, i.e. what repeating the original answer would have
    earned on this view (c_v read off this view's forward pass). NaN on anchors.

    Vectorised: the criterion is linear in the anchors' indicators (correct, abstained,
    invalid), so the mean over anchors only needs their per-pack fractions."""
    codes = labels if isinstance(labels, torch.Tensor) else label_codes(labels)
    a = is_anchor.to(torch.float64)
    n_anchor, inv = _pack_sums(group_ids, a)
    if bool((n_anchor == 0).any()):
        raise ValueError("a pack has no anchor response on the original view")
    answers, gold = answers.long(), gold.long()
    frac = {name: _pack_sums(group_ids, a * ind.to(torch.float64))[0][inv] / n_anchor[inv]
            for name, ind in (("correct", answers == gold), ("abst", answers == ABST), ("invalid", answers == INVALID))}
    conf = conf_gold.to(torch.float64)
    stab = frac["correct"] - c_fa * frac["abst"]
    base = torch.where(codes == LABEL_CODE["SENS"], (1 - frac["invalid"]) - frac["correct"] * conf, stab)
    base = torch.where(codes == LABEL_CODE["ABST"], frac["abst"], base)
    # FLIP (two options): an anchor earns it by having answered the other option.
    other = 1 - frac["correct"] - frac["abst"] - frac["invalid"]
    base = torch.where(codes == LABEL_CODE["FLIP"], other - c_fa * frac["abst"], base)
    return torch.where(is_anchor, torch.full_like(base, math.nan), base)


def _anchor_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, is_anchor: torch.Tensor,
                       anchor_baseline: torch.Tensor | None) -> torch.Tensor:
    """A_0k = r_0k − b_0 on anchors (0 elsewhere): b_0 is the leave-one-out mean of the other
    anchors when a pack has ≥ 2, else ``anchor_baseline`` (a per-type EMA the caller keeps)."""
    r = rewards.to(torch.float64)
    a = is_anchor.to(torch.float64)
    n, inv = _pack_sums(group_ids, a)
    total, _ = _pack_sums(group_ids, r * a)
    n_row, total_row = n[inv], total[inv]
    loo = (total_row - r) / (n_row - 1).clamp(min=1)
    if anchor_baseline is None:
        if bool((is_anchor & (n_row < 2)).any()):
            raise ValueError("a pack with one anchor needs anchor_baseline (a per-type moving average)")
        single = loo
    else:
        single = anchor_baseline.to(torch.float64)
    base = torch.where(n_row >= 2, loo, single)
    return torch.where(is_anchor, r - base, torch.zeros_like(r))


def ar_literal(rewards: torch.Tensor, group_ids: torch.Tensor, *, is_anchor: torch.Tensor,
               anchor_baseline: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
    """AR-literal: a view response's advantage is its reward minus the anchors' mean reward."""
    r = rewards.to(torch.float64)
    a = is_anchor.to(torch.float64)
    n, inv = _pack_sums(group_ids, a)
    anchor_mean = _pack_sums(group_ids, r * a)[0][inv] / n[inv]
    out = _anchor_advantages(rewards, group_ids, is_anchor, anchor_baseline)
    return torch.where(is_anchor, out, r - anchor_mean).float()


def ar_cf(rewards: torch.Tensor, group_ids: torch.Tensor, *, is_anchor: torch.Tensor, cf_baseline: torch.Tensor,
          anchor_baseline: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
    """AR-cf: a view response's advantage is its reward minus the counterfactual baseline (the
    same criterion scored on the anchors' answers), which removes the view's offset."""
    out = _anchor_advantages(rewards, group_ids, is_anchor, anchor_baseline)
    return torch.where(is_anchor, out, rewards.to(torch.float64) - cf_baseline.to(torch.float64)).float()


def mixed_mean(rewards: torch.Tensor, group_ids: torch.Tensor, **_: Any) -> torch.Tensor:
    """The pack as one mixed group, Dr.GRPO style: r − mean(pack)."""
    return ADVANTAGES.get("dr_grpo")(rewards, group_ids)


def mixed_meanstd(rewards: torch.Tensor, group_ids: torch.Tensor, **_: Any) -> torch.Tensor:
    """The pack as one mixed group, GRPO style: (r − mean) / std."""
    return ADVANTAGES.get("grpo")(rewards, group_ids)


def pack_rms_normalise(adv: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """Each pack's advantages divided by their root mean square (``bpo.adv_norm=pack_rms``): every
    pack with a signal carries the same update mass, whatever its type, as GRPO's division by
    the group's std gives every non-flat group. On a group of anchors alone (r minus the others'
    mean) it is GRPO's advantage with the population std. A pack whose advantages are all 0
    stays 0."""
    a = adv.to(torch.float64)
    sq, inv = _pack_sums(group_ids, a * a)
    n, _ = _pack_sums(group_ids, torch.ones_like(a))
    rms = (sq / n).sqrt()[inv]
    return torch.where(rms > 0, a / (rms + eps), a).to(adv.dtype)


def call_advantage(fn: Any, rewards: torch.Tensor, group_ids: torch.Tensor, kw: dict[str, Any]) -> torch.Tensor:
    """Call an advantage estimator with the pack fields it accepts (GRPO's take none)."""
    params = inspect.signature(fn).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kw = {k: v for k, v in kw.items() if k in params}
    return fn(rewards, group_ids, **kw)


class TypeEMA:
    """Per-question-type moving average of anchor rewards: the anchor baseline when a pack
    has a single anchor (decay 0.95). Its state is checkpointed with the run."""

    def __init__(self, decay: float = 0.95) -> None:
        self.decay = decay
        self.values: dict[str, float] = {}

    def baseline(self, qtypes: Sequence[str], rewards: torch.Tensor, is_anchor: torch.Tensor) -> torch.Tensor:
        """The current average for each row's type (a type seen first gets its batch mean), then
        update with this batch's anchor rewards."""
        cur: dict[str, list[float]] = {}
        for q, r, a in zip(qtypes, rewards.tolist(), is_anchor.tolist(), strict=True):
            if a:
                cur.setdefault(q, []).append(r)
        out = torch.tensor([self.values.get(q, sum(cur.get(q, [0.0])) / max(1, len(cur.get(q, []))))
                            for q in qtypes], dtype=torch.float64)
        for q, rs in cur.items():
            m = sum(rs) / len(rs)
            self.values[q] = self.decay * self.values[q] + (1 - self.decay) * m if q in self.values else m
        return out

    def state(self) -> dict[str, Any]:
        return {"decay": self.decay, "values": dict(self.values)}

    def load(self, state: dict[str, Any]) -> None:
        self.decay, self.values = state["decay"], dict(state["values"])
