"""BPO: Behavior Pack Optimization over counterfactual video views (ALGORITHMS.md §A),
trained side by side with its baselines from one SFT checkpoint.

Each step every arm gets the same prompts. A BPO pack holds K0 anchors on the original view
and K_v responses on each of m views chosen by question type; all of a step's packs are
generated in one batched call per arm. The shared reward actor scores each response for the
behaviour its view demands (``bpo_behavior``), the advantage is anchor-relative (``adv_mode``),
and the learner takes a PPO-clip step with Dr.GRPO aggregation. GRPO arms spend the same
number of responses on the original view (budget matching). With ``run.staleness = k > 0``
each arm generates its packs of the next steps while it updates (`PolicyGraph.rollout_at`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from troupe.algorithms.bpo.behavior import (
    TypeEMA,
    behaviour_met,
    call_advantage,
    counterfactual_baselines,
    label_codes,
    letter_probs,
    pack_rms_normalise,
)
from troupe.algorithms.bpo.config import ARMS, Arm, BPOConfig, arm_summary
from troupe.algorithms.bpo.evaluation import (
    METRIC_TITLES,
    METRICS,
    accuracy_by_type,
    answer_shares,
    behaviour_metrics,
    bootstrap,
    fmt_ci,
    hard_by_type,
    item_record,
    separated,
)
from troupe.algorithms.lookahead import RolloutRequest
from troupe.algorithms.policy_graph import PolicyGraph, step_seed
from troupe.algorithms.rollout import RolloutResult
from troupe.algorithms.sft import loss_table, prepare_policy
from troupe.envs.video_qa.distinguishability import describe as describe_views
from troupe.envs.video_qa.items import LETTERS, TEMPORAL_QTYPES, VideoItem, parse_answer
from troupe.envs.video_qa.synthetic import VideoQATask
from troupe.envs.video_qa.views import BehaviorTable, ViewUnavailable, apply_view, select_views
from troupe.platform.algorithm import Algorithm, Report
from troupe.platform.checkpoint import atomic_write_json, atomic_write_text
from troupe.platform.config import to_dict
from troupe.platform.errors import ConfigError
from troupe.platform.placement import ActorGraph, Role
from troupe.platform.registry import ADVANTAGES
from troupe.platform.report import markdown_table
from troupe.platform.run import RunContext

log = logging.getLogger("troupe")


@dataclasses.dataclass
class Pack:
    """One arm's rollout requests for a step, and the structure its advantage needs."""

    prompts: list[str]
    rows: list[dict[str, Any]]
    letters: list[str]
    group_ids: torch.Tensor
    is_anchor: torch.Tensor
    labels: list[str]
    skipped: int = 0


class PixelSFTTask:
    """The task as the VL model's SFT sees it: question text plus pixel frames."""

    def __init__(self, task: VideoQATask, items: list[VideoItem] | None = None) -> None:
        self.task = task
        self.items = items  # real items (already pixels); None: the synthetic task

    def sample(self, n: int, split: str, rng: np.random.Generator) -> list[dict]:
        out = []
        items = (self.task.sample_items(n, split, rng) if self.items is None
                 else [self.items[i] for i in rng.integers(0, len(self.items), n)])
        for it in items:
            px = self.task.render_pixels(it) if self.items is None else it
            out.append({"prompt": self.task.pixel_prompt(it), "answer": it.gold_letter, "frames": px.frames,
                        "item": it, "group": it.qtype})
        return out

    def corpus(self, n: int = 4000, seed: int = 0) -> list[str]:
        return self.task.corpus(n, seed)


class NullPriorSFT:
    """An SFT task whose rows are, with probability ``share``, the null (blank) view of their
    clip, answered with the abstain option with probability ``abstain`` and otherwise with one
    of the item's other options drawn uniformly: the SFT start then abstains on blank clips
    that often when sampling (``task.sft_null_share``, ``task.sft_null_abstain``)."""

    def __init__(self, inner: Any, task: VideoQATask, share: float, abstain: float) -> None:
        self.inner, self.task, self.share, self.abstain = inner, task, share, abstain

    def sample(self, n: int, split: str, rng: np.random.Generator) -> list[dict]:
        rows = self.inner.sample(n, split, rng)
        for i in np.flatnonzero(rng.random(len(rows)) < self.share):
            rows[i] = self.null_row(rows[i], rng)
        return rows

    def null_row(self, row: dict, rng: np.random.Generator) -> dict:
        item: VideoItem = row["item"]
        letters = item.letters
        answer = letters[item.abstain_index] if rng.random() < self.abstain else \
            letters[rng.choice([i for i in range(len(letters)) if i != item.abstain_index])]
        null = apply_view(item, "null")  # the null view training uses, in either rendering
        if row.get("frames") is not None:  # pixels: the prompt holds no frames
            return {**row, "frames": self.task.render_pixels(null).frames, "answer": answer, "group": "null"}
        return {**row, "prompt": self.task.prompt(null), "answer": answer, "group": "null"}

    def corpus(self, n: int = 4000, seed: int = 0) -> list[str]:
        return self.inner.corpus(n, seed)


class BPO(Algorithm):
    Config = BPOConfig
    summary_line = "behavior pack optimization over counterfactual video views, against budget-matched GRPO"
    progress_metrics = ("reward/bpo", "reward/grpo", "eval/macro_acc/bpo")
    generates_ahead = True  # run.staleness > 0: every arm's rollout_at and update_and_sync

    def __init__(self, config: BPOConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        c = config
        self.task = VideoQATask(c.task)  # TaskConfig is a VideoQAConfig: the task reads its own fields
        self.pixels = c.task.rendering == "pixels"
        self.table = BehaviorTable.from_dict(c.bpo.behavior_table)
        self.data_skipped: dict[str, dict[str, int]] = {}
        self.train_items = self._load_real(c.data.train, "train") if c.data.train else None
        eval_items = (self._load_real(c.data.eval, "eval")[: c.eval.num_prompts] if c.data.eval
                      else self.task.eval_items(c.eval.num_prompts, c.eval.eval_seed, c.eval.temporal_weight))
        self.eval_probes = self._build_probes(eval_items)
        self.emas = {name: TypeEMA(c.bpo.anchor_ema) for name in c.bpo.arms}
        self.arms: dict[str, PolicyGraph] = {}
        self._packs: dict[tuple[str, int], Pack] = {}  # (arm, step) -> its pack, until the step trains on it

    def prepare(self) -> dict[str, Any]:
        """The shared SFT checkpoint every arm starts from; the real-data skips, for the report."""
        c = self.config
        facts: dict[str, Any] = {"data_skipped": self.data_skipped}
        if self.train_items is None and c.eval.view_check_clips:
            facts["view_check"] = self.check_views()
        sft_task = PixelSFTTask(self.task, self.train_items) if self.pixels else self.task
        if c.task.sft_null_share > 0:
            sft_task = NullPriorSFT(sft_task, self.task, c.task.sft_null_share, c.task.sft_null_abstain)
        prepare_policy(c.model, sft_task, to_dict(c.task), facts)
        reward_kwargs = {"c_fa": c.bpo.c_fa, "r_fmt": c.bpo.r_fmt}
        self.arms = {name: PolicyGraph(c, facts["model_path"], reward_kwargs, prefix=f"{name}_", shared_roles=i == 0)
                     for i, name in enumerate(c.bpo.arms)}
        return facts

    def check_views(self) -> dict[str, Any]:
        """Whether non-temporal features tell the shuffled or reversed clips of this task from
        the originals (`view_distinguishability`); logged, and a warning in the report when so."""
        from troupe.envs.video_qa.distinguishability import describe, view_distinguishability

        check = view_distinguishability(self.task, self.config.eval.view_check_clips, seed=self.config.run.seed)
        for line in describe(check):
            (log.warning if line.startswith("WARNING") else log.info)("view check: %s", line)
        return check

    def _load_real(self, sources: list[dict[str, Any]], role: str) -> list[VideoItem]:
        """Items of real benchmarks; each source's skips are kept for the report. Temporal-hard
        on real data is the benchmarks' own temporal categories (§A.4)."""
        from troupe.envs.video_qa.real import load_real

        items = []
        for src in sources:
            kw = dict(src)
            name = kw.pop("name", None)
            if name is None:
                raise ConfigError(f"data.{role}: entry {src} has no 'name' (tempcompass, mvbench or nextqa)")
            kw.setdefault("num_frames", self.config.task.num_frames)
            kw.setdefault("size", self.config.task.pixel_size)
            kw.setdefault("on_missing", "skip")
            res = load_real(name, **kw)
            self.data_skipped[f"{role}/{name}"] = dict(res.skipped)
            items += [it.replace(hard=it.qtype in TEMPORAL_QTYPES, meta={**it.meta, "rendering": "pixels"})
                      for it in res.items]
        if not items:
            raise ConfigError(f"data.{role}: no items loaded (skipped: {self.data_skipped})")
        return items

    def sample_items(self, step: int) -> list[VideoItem]:
        rng = np.random.default_rng(step_seed(self.config.run.seed, step, "prompts"))
        n = self.config.bpo.prompts_per_step
        if self.train_items is not None:
            return [self.train_items[i] for i in rng.integers(0, len(self.train_items), n)]
        return self.task.sample_items(n, "train", rng)

    # -- graph ------------------------------------------------------------------------------
    def roles(self) -> list[Role]:
        return [r for p in self.arms.values() for r in p.roles()]

    def setup(self, graph: ActorGraph) -> None:
        super().setup(graph)
        for p in self.arms.values():
            p.setup(graph)

    # -- packs ------------------------------------------------------------------------------
    def _render(self, item: VideoItem) -> tuple[str, dict[str, Any]]:
        """The prompt text and the row fields every rendering shares."""
        row = {"gold": item.answer, "num_options": len(item.options), "qtype": item.qtype,
               "item_id": item.item_id, "hard": item.hard, "view": item.meta.get("view", "orig")}
        if self.pixels:
            row["frames"] = item.frames
            return self.task.pixel_prompt(item), row
        return self.task.prompt(item), row

    def _view(self, item: VideoItem, view: str, rng: np.random.Generator) -> VideoItem:
        """``item`` under ``view``, as one rendering shows it to a policy (`VideoQATask.perceive`:
        the synthetic task's order noise is drawn afresh for every original and every view)."""
        symbolic = item.meta.get("rendering", "symbolic") == "symbolic"
        base = self.task.render_pixels(item) if self.pixels and symbolic else item
        return self.task.perceive(base if view == "orig" else apply_view(base, view, rng), rng)

    def build_pack(self, arm: Arm, items: list[VideoItem], rng: np.random.Generator) -> Pack:
        """Rows for one arm: BPO-style packs (anchors + views) or a GRPO group on the original."""
        s = self.config.bpo
        prompts, rows, gids, anchor, labels = [], [], [], [], []
        skipped = 0
        table = self.table if arm.table is None else arm_table(self.config.bpo.behavior_table, arm.table)
        for j, item in enumerate(items):
            if arm.views and (arm.view_types is None or item.qtype in arm.view_types):
                first = ("reverse",) if s.reverse_in_temporal_packs and item.qtype in TEMPORAL_QTYPES else ()
                picked, n_skip = select_views(item, table, s.num_views, rng, random_views=arm.random_views,
                                              first=first, slot_offset=j if s.rotate_slots else 0)
                skipped += n_skip
                plan = [("orig", "ORIG")] * s.anchors + [(v, lab) for v, lab in picked for _ in range(s.per_view)]
            else:
                plan = [("orig", "ORIG")] * (s.pack_size * arm.group_scale)
            for view, label in plan:
                prompt, row = self._render(self._view(item, view, rng))
                # Aug-GRPO rewards every view for the original answer (augmentation, no behaviours):
                # STAB on views, as in the linear benchmark (ORIG would add the format bonus there too).
                row["label"] = label if arm.reward == "behavior" or view == "orig" else "STAB"
                prompts.append(prompt)
                rows.append(row)
                gids.append(j)
                anchor.append(view == "orig")
                labels.append(row["label"])
        letters = [LETTERS[: r["num_options"]] for r in rows]
        return Pack(prompts, rows, letters, torch.tensor(gids), torch.tensor(anchor), labels, skipped)

    # -- the step ---------------------------------------------------------------------------
    def step_pack(self, name: str, step: int) -> Pack:
        """Arm ``name``'s pack at ``step``: a function of (run seed, step, arm) alone, so a pack
        built when its rollout started ahead (``run.staleness > 0``) and one built again after a
        resume are the same."""
        rng = np.random.default_rng(step_seed(self.config.run.seed, step, f"views/{name}"))
        return self.build_pack(ARMS[name], self.sample_items(step), rng)

    def rollout_request(self, name: str, step: int) -> RolloutRequest:
        """What arm ``name`` generates at ``step``; its pack is kept for the step's advantages."""
        pack = self._packs[name, step] = self.step_pack(name, step)
        return RolloutRequest(pack.prompts, pack.rows, self.config.rollout.sampling,
                              step_seed(self.config.run.seed, step, f"sample/{name}"), option_letters=pack.letters)

    def step(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        # Every arm's rollout in flight at once (with run.staleness > 0, started while an
        # earlier step updated); each reward call waits for its arm's batches itself.
        rollouts = {name: policy.rollout_at(step, lambda s, n=name: self.rollout_request(n, s))
                    for name, policy in self.arms.items()}
        # A rollout restored from a checkpoint left no pack here: build it again, the same.
        packs = {name: self._packs.pop((name, step), None) or self.step_pack(name, step) for name in self.arms}
        results = {name: r.result() for name, r in rollouts.items()}
        t1 = time.perf_counter()
        metrics: dict[str, float] = {}
        updates = {}
        for name, policy in self.arms.items():
            adv = self.advantages(name, packs[name], results[name])
            updates[name] = policy.update_and_sync(results[name].batches, {"advantages": adv})
            metrics.update(self.train_metrics(name, packs[name], results[name], adv))
        t2 = time.perf_counter()
        for name, policy in self.arms.items():
            metrics.update({f"{k}/{name}": v for k, v in updates[name].result().items()})
            metrics[f"faults/{name}"] = float(policy.pop_faults())
        metrics.update({"time/generate_s": t1 - t0, "time/reward_s": t2 - t1, "time/update_s": time.perf_counter() - t2,
                        "responses/step": float(sum(len(p.prompts) for p in packs.values()) / len(packs))})
        return metrics

    def advantages(self, name: str, pack: Pack, scored: RolloutResult) -> torch.Tensor:
        arm, s = ARMS[name], self.config.bpo
        rewards = scored.rewards
        mode = arm.advantage or s.adv_mode
        fn = ADVANTAGES.get(mode)
        kw: dict[str, Any] = {"is_anchor": pack.is_anchor}
        if arm.views and arm.reward == "behavior":
            extras = scored.extras
            gold = torch.tensor([r["gold"] for r in pack.rows])
            kw["cf_baseline"] = counterfactual_baselines(pack.group_ids, pack.is_anchor, label_codes(pack.labels),
                                                         extras["answer"].long(), gold, extras["conf_gold"], s.c_fa)
            if s.anchors == 1:
                kw["anchor_baseline"] = self.emas[name].baseline([r["qtype"] for r in pack.rows], rewards,
                                                                 pack.is_anchor)
        adv = call_advantage(fn, rewards, pack.group_ids, kw)
        if (arm.adv_norm or s.adv_norm) == "pack_rms":
            adv = pack_rms_normalise(adv, pack.group_ids)
        if s.adv_clip:
            adv = adv.clamp(-s.adv_clip, s.adv_clip)
        return adv

    def train_metrics(self, name: str, pack: Pack, scored: RolloutResult, adv: torch.Tensor) -> dict[str, float]:
        r = scored.rewards
        answers = scored.extras.get("answer")
        # Groups whose responses all scored alike carry no signal (GRPO's reward/zero_std_groups). In
        # the main job the GRPO arm's entropy collapses and, past step 300, most of its steps have
        # every group flat (grad norm 0).
        groups = [r[pack.group_ids == g] for g in torch.unique(pack.group_ids)]
        flat = [bool((x == x[0]).all()) for x in groups]
        out = {f"reward/{name}": float(r.mean()), f"adv_abs/{name}": float(adv.abs().mean()),
               f"zero_std_groups/{name}": float(np.mean(flat)),
               f"reward_errors/{name}": float(len(scored.errors)), f"views_skipped/{name}": float(pack.skipped)}
        out.update({f"adv_share_{q}/{name}": v for q, v in advantage_shares([row["qtype"] for row in pack.rows], adv).items()})
        if answers is not None:
            gold = torch.tensor([row["gold"] for row in pack.rows])
            anchors = pack.is_anchor
            out[f"train_anchor_acc/{name}"] = float((answers[anchors] == gold[anchors]).float().mean())
            # By question type: which types the arm's updates come from, and which it loses (one
            # metric name, hence one plot, per type: arms side by side).
            right = (answers == gold).tolist()
            on_anchors = [{"qtype": row["qtype"], "correct": ok}
                          for row, ok, is_anchor in zip(pack.rows, right, anchors.tolist(), strict=True) if is_anchor]
            out.update({f"train_acc_{q}/{name}": float(a["value"])
                        for q, a in accuracy_by_type([on_anchors]).items()})
            out[f"train_abstain/{name}"] = float((answers == -1).float().mean())
            out[f"pack_score/{name}"] = self.pack_score(pack, r, answers, gold)
        return out

    def pack_score(self, pack: Pack, r: torch.Tensor, answers: torch.Tensor, gold: torch.Tensor) -> float:
        """The joint pack score (logged): w0·mean r_ORIG + Σ_ℓ mean r_ℓ + b·[anchor right ∧ all behaviours met]."""
        scores = []
        for g in torch.unique(pack.group_ids):
            idx = (pack.group_ids == g).nonzero().flatten().tolist()
            by_label: dict[str, list[float]] = {}
            met = True
            for i in idx:
                lab = pack.labels[i]
                by_label.setdefault(lab, []).append(float(r[i]))
                met &= behaviour_met(lab, int(answers[i]), int(gold[i]))
            scores.append(sum(np.mean(v) for v in by_label.values()) + self.config.bpo.pack_bonus * met)
        return float(np.mean(scores))

    # -- evaluation ----------------------------------------------------------------------------
    def _build_probes(self, items: list[VideoItem]) -> list[dict[str, Any]]:
        """Every eval item on its original view, a null copy and each counterfactual view its type
        uses (fixed once, so every arm and every evaluation sees the same probes)."""
        rng = np.random.default_rng(self.config.eval.eval_seed)
        probes = []
        for k, item in enumerate(items):
            row = self.table.row(item.qtype)
            views = [("orig", "ORIG"), ("null", "ABST")] + [(v, lab) for v, lab in row.items() if v != "null"]
            for view, label in views:
                try:
                    v_item = self._view(item, view, rng)
                except ViewUnavailable:  # no support or target for this view: not probed
                    continue
                prompt, r = self._render(v_item)
                probes.append({"k": k, "item": item, "view": view, "label": label, "prompt": prompt, "row": r})
        return probes

    def evaluate(self, step: int) -> dict[str, float]:
        c = self.config
        greedy = dataclasses.replace(c.rollout.sampling, temperature=c.eval.temperature)
        out: dict[str, float] = {}
        for name, policy in self.arms.items():
            records = self.eval_records(policy, greedy, step)
            self._write_records(name, step, records)
            for k, v in behaviour_metrics(records).items():
                out[f"{k}/{name}"] = v
        return out

    def eval_records(self, policy: PolicyGraph, sampling: Any, step: int) -> list[dict[str, Any]]:
        import ray

        probes = self.eval_probes
        refs = policy.rollout([p["prompt"] for p in probes], [p["row"] for p in probes], sampling,
                              step_seed(self.config.run.seed, step, "eval"),
                              option_letters=[p["item"].letters for p in probes], score=False).batches()
        texts, lps = [], []
        for b in ray.get(refs):
            texts += b["completion"]
            lps += list(b["option_logprobs"])
        by_item: dict[int, dict[str, Any]] = {}
        for p, text, lp in zip(probes, texts, lps, strict=True):
            n = len(p["item"].options)
            d = by_item.setdefault(p["k"], {"item": p["item"], "views": []})
            ans, conf = parse_answer(text, n), letter_probs(lp, n).numpy()
            if p["view"] == "orig":
                d["orig"], d["conf"] = ans, conf
            elif p["view"] == "null":
                d["null"] = ans
            else:
                d["views"].append((p["label"], ans, conf))
        return [item_record(d["item"], d["orig"], d["conf"], d["null"], d["views"], self.config.eval.sens_conf_drop)
                for _, d in sorted(by_item.items())]

    def _write_records(self, name: str, step: int, records: list[dict]) -> None:
        path = self.ctx.artifact(f"eval/{name}/step_{step:06d}.jsonl")
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))

    @staticmethod
    def read_records(run: RunContext, name: str) -> dict[int, list[dict]]:
        """An arm's evaluation records by step, as `evaluate` wrote them."""
        return {int(path.stem.split("_")[1]): [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
                for path in sorted((run.run_dir / "eval" / name).glob("step_*.jsonl"))}

    # -- checkpoints -----------------------------------------------------------------------------
    def save(self, ckpt_dir: Path) -> None:
        for name, policy in self.arms.items():
            d = ckpt_dir / name
            d.mkdir(parents=True, exist_ok=True)
            policy.save(d)
        atomic_write_json(ckpt_dir / "bpo.json", {"emas": {k: e.state() for k, e in self.emas.items()}})

    def load(self, ckpt_dir: Path) -> None:
        for name, policy in self.arms.items():
            policy.load(ckpt_dir / name)
        state = json.loads((ckpt_dir / "bpo.json").read_text())
        for k, e in self.emas.items():
            e.load(state["emas"][k])

    # -- report ----------------------------------------------------------------------------------
    @classmethod
    def report(cls, config: BPOConfig, run: RunContext, history: list[dict[str, Any]]) -> Report:
        summary = cls.summarize(config, run)
        summary["train_abstain_end"] = late_abstain_rates(history, list(summary["arms"]))
        _plot_eval_curves(config, history, run.plots_dir / "behaviour_rates.png")
        return Report(summary, report_sections(config, summary))

    @classmethod
    def summarize(cls, config: BPOConfig, run: RunContext) -> dict[str, Any]:
        """Each arm's last evaluation against the shared SFT start, with bootstrap intervals."""
        c = config
        out: dict[str, Any] = {"arms": {}, "pack_size": c.bpo.pack_size}
        for name in c.bpo.arms:
            recs = cls.read_records(run, name)
            if not recs:
                continue
            first, last = min(recs), max(recs)
            if "sft" not in out:  # every arm starts from the same checkpoint: step 0 is the SFT row
                out["sft"] = bootstrap(recs[first], c.eval.bootstrap, seed=c.run.seed)
                out["sft_hard_by_type"] = hard_by_type([recs[first]])
                out["sft_by_type"] = accuracy_by_type([recs[first]])
                out["sft_answers"] = answer_shares([recs[first]])
                out["gold_answers"] = answer_shares([recs[first]], gold=True)
            out["arms"][name] = {"step": last, **arm_summary(name, c.bpo),
                                 "metrics": bootstrap(recs[last], c.eval.bootstrap, seed=c.run.seed),
                                 "hard_by_type": hard_by_type([recs[last]]),
                                 "by_type": accuracy_by_type([recs[last]]),
                                 "answers": answer_shares([recs[last]])}
        out["claim"] = claim_check(out["arms"], out.get("sft"))
        prepared = run.prepared()
        if prepared.get("data_skipped"):
            out["data_skipped"] = prepared["data_skipped"]
        out["model_path"] = prepared.get("model_path")
        if prepared.get("view_check"):
            out["view_check"] = prepared["view_check"]
        if prepared.get("sft_loss_by_group"):
            out["sft_loss_by_group"] = prepared["sft_loss_by_group"]
        return out


def _plot_eval_curves(config: BPOConfig, history: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(15, 6.4))
    for ax in axes.flat[len(METRICS):]:
        ax.set_visible(False)
    for ax, metric in zip(axes.flat, METRICS, strict=False):
        for name in config.bpo.arms:
            pts = [(r["step"], r[f"eval/{metric}/{name}"]) for r in history if f"eval/{metric}/{name}" in r]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", ms=3, label=name)
        ax.set_title(METRIC_TITLES[metric], fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def report_sections(config: BPOConfig, summary: dict[str, Any]) -> list[str]:
    arms = summary.get("arms", {})
    if not arms:
        return []
    head = "| policy | responses/prompt | " + " | ".join(METRIC_TITLES[m] for m in METRICS) + " |"
    lines = ["## BPO against its baselines", ""]
    check = summary.get("view_check")
    if check and check.get("distinguishable"):
        lines += [f"> **Warning:** {line}" for line in describe_views(check) if line.startswith("WARNING")] + [""]
    lines += [f"Held-out synthetic test set ({config.eval.num_prompts} items, greedy answers), value and "
              f"bootstrap 95% interval over items. SFT is the shared starting checkpoint. Macro accuracy is "
              f"the mean over question types (five on the synthetic task; over benchmarks on real data); "
              f"macro accuracy (3 groups) is §A.5's: the mean over non-temporal, cue-consistent temporal and "
              f"temporal-hard items.", "",
              head, "|" + "---|" * (len(METRICS) + 2)]
    if "sft" in summary:
        lines.append("| SFT | – | " + " | ".join(fmt_ci(summary["sft"].get(m)) for m in METRICS) + " |")
    for name, a in arms.items():
        lines.append(f"| {name} (step {a['step']}) | {a['responses_per_prompt']} | "
                     + " | ".join(fmt_ci(a["metrics"].get(m)) for m in METRICS) + " |")
    # The five-type macro's make-up (where an arm gains or loses), then the temporal-hard items alone.
    for key, title in (("by_type", "Accuracy by question type, every item (items)"),
                       ("hard_by_type", "Temporal-hard accuracy by question type (items)")):
        lines += type_table(title, {"SFT": summary.get(f"sft_{key}") or {},
                                    **{name: a.get(key) or {} for name, a in arms.items()}})
    lines += answer_table({"gold": summary.get("gold_answers") or {}, "SFT": summary.get("sft_answers") or {},
                           **{name: a.get("answers") or {} for name, a in arms.items()}})
    claim = summary.get("claim")
    if claim:
        lines += ["", "### The claim (§A.5), as measured", ""] + [f"- {line}" for line in claim["lines"]]
        rate = (summary.get("train_abstain_end") or {}).get("bpo")
        if not claim["abstain_f1"] and rate is not None:
            # Measured: abstention is learnt only once it is sampled on ABST views (docs/bpo.md).
            lines.append(f"- Why abstention F1 did not separate, as far as this run shows: BPO's sampled training "
                         f"answers abstained {rate:.1%} of the time over its last {ABSTAIN_WINDOW} steps. Its reward "
                         "can raise abstention only once it is sampled on an ABST view; from an SFT start that "
                         "never abstains that happens in some seeds only, and the start's abstention prior "
                         "(`task.sft_null_share`, `task.sft_null_abstain`) sets how often it is sampled "
                         "(docs/bpo.md).")
        lines += ["", "One run, one seed, on this run's task and policy. §A.5's own benchmark (a softmax-linear "
                  "policy that cannot tell a shuffled clip from the original) is "
                  "`python benchmarks/bpo.py --parts linear`; pooled figures for this setting are in "
                  "`benchmarks/results/bpo.json`."]
    if check:
        lines += ["", f"Can non-temporal features (object counts, contiguity, token frequencies, blank frames) "
                  f"tell a view from the original? A classifier on {check['clips']} training clips, "
                  f"cross-validated by clip:", ""] + [f"- {line}" for line in describe_views(check)
                                                       if not line.startswith("WARNING")]
    if summary.get("data_skipped"):
        lines += ["", "Real-data rows skipped while loading (by source and reason): "
                  + "; ".join(f"{k}: {v}" for k, v in summary["data_skipped"].items())]
    lines += ["", "![behaviour rates](plots/behaviour_rates.png)", "",
              f"Policy started from the SFT checkpoint `{summary.get('model_path') or '?'}`."]
    lines += sft_loss_table(summary.get("sft_loss_by_group"))
    return ["\n".join(lines)]


def sft_loss_table(curve: dict[str, Any] | None, columns: int = 6) -> list[str]:
    """Report lines: the SFT fit's loss on the answer by question type at up to ``columns``
    window ends (`GroupLoss`); none for a checkpoint fitted before it was recorded."""
    if not curve or not curve.get("steps"):
        return []
    return ["", f"SFT loss on the answer by question type (its negative log-likelihood, averaged over the "
            f"rows of each {curve['every']} steps up to the step shown; `null` is the blank-clip rows of the "
            "abstention prior). A type that stays at a uniform guess's loss (ln k over k options) is one the "
            "start never learnt:", "", *loss_table(curve, "question type", columns)]


def type_table(title: str, by_type: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """Report lines of one accuracy-by-question-type table (policies as rows); none if empty."""
    qtypes = sorted({q for v in by_type.values() for q in v})
    if not qtypes:
        return []
    return ["", f"{title}:", "", *markdown_table(
        ["policy", *qtypes], ([name, *(f"{v[q]['value']:.3f} ({v[q]['n']})" if q in v else "–" for q in qtypes)]
                              for name, v in by_type.items()))]


def answer_table(shares: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """Report lines: each policy's answers by question type as shares of the items per option,
    beside the gold's (question types as rows); none if empty."""
    qtypes = sorted({q for v in shares.values() for q in v})
    if not qtypes:
        return []
    cols = [name for name, v in shares.items() if v]
    return ["", "Answers by question type, share of the items per option (an arm that uses fewer options "
            "than the gold has collapsed onto a prior):", "", *markdown_table(
                ["question type", *cols],
                ([q, *(" · ".join(f"{a} {x:.2f}" for a, x in shares[c].get(q, {}).items()) or "–" for c in cols)]
                 for q in qtypes))]


def advantage_shares(qtypes: list[str], adv: torch.Tensor) -> dict[str, float]:
    """Each question type's share of a step's advantage mass, sum |A| over its rows (anchors and
    views) over the step's: where an arm's update comes from (a type's share against GRPO's,
    with the same prompts, shows whether its packs carry less of the update). Empty when every
    advantage is 0: a step without an update has no shares (they would pull the means to 0)."""
    a = adv.detach().abs().double()
    total = float(a.sum())
    if total == 0:
        return {}
    shares: dict[str, float] = {}
    for q, x in zip(qtypes, a.tolist(), strict=True):
        shares[q] = shares.get(q, 0.0) + x
    return {q: v / total for q, v in sorted(shares.items())}


def arm_table(section: dict[str, dict[str, Any]] | None, cells: dict[str, dict[str, str]]) -> BehaviorTable:
    """The run's behaviour table (``bpo.behavior_table`` over §A.2's default) with an arm's cells on top."""
    rows = {q: dict(r) for q, r in (section or {}).items()}
    for qtype, row in cells.items():
        rows.setdefault(qtype, {}).update(row)
    return BehaviorTable.from_dict(rows)


ABSTAIN_WINDOW = 50  # training steps over which the report reads an arm's late abstention rate


def late_abstain_rates(history: list[dict[str, Any]], arms: list[str]) -> dict[str, float]:
    """Each arm's share of sampled training answers that abstain, over its last `ABSTAIN_WINDOW`
    logged steps (arms that log no answers are left out)."""
    out = {}
    for arm in arms:
        rates = [row[f"train_abstain/{arm}"] for row in history if f"train_abstain/{arm}" in row]
        if rates:
            out[arm] = float(np.mean(rates[-ABSTAIN_WINDOW:]))
    return out


def claim_check(arms: dict[str, Any], sft: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """BPO vs budget-matched GRPO: temporal-hard accuracy and abstention F1 higher with
    non-overlapping intervals, and macro accuracy not lower (its interval not wholly below).
    With the SFT start's metrics, also whether GRPO raised macro accuracy over it (intervals
    apart): the main job's other claim, reported beside §A.5's, not part of it."""
    if "bpo" not in arms or "grpo" not in arms:
        return None
    b, g = arms["bpo"]["metrics"], arms["grpo"]["metrics"]
    hard = separated(b["temporal_hard_acc"], g["temporal_hard_acc"])
    f1 = separated(b["abstain_f1"], g["abstain_f1"])
    macro = not separated(g["macro_acc"], b["macro_acc"])
    lines = [f"temporal-hard accuracy: BPO {fmt_ci(b['temporal_hard_acc'])} vs GRPO {fmt_ci(g['temporal_hard_acc'])}"
             f" → {'BPO higher, intervals apart' if hard else 'not separated'}",
             f"abstention F1: BPO {fmt_ci(b['abstain_f1'])} vs GRPO {fmt_ci(g['abstain_f1'])}"
             f" → {'BPO higher, intervals apart' if f1 else 'not separated'}",
             f"macro accuracy: BPO {fmt_ci(b['macro_acc'])} vs GRPO {fmt_ci(g['macro_acc'])}"
             f" → {'not lower' if macro else 'BPO lower'}"]
    out: dict[str, Any] = {"temporal_hard": hard, "abstain_f1": f1, "macro_not_lower": macro,
                           "holds": hard and f1 and macro}
    if "grpo_2x" in arms:
        # On each metric where BPO is apart from GRPO: does 2x GRPO reach BPO (intervals overlap)?
        g2 = arms["grpo_2x"]["metrics"]
        gaps = [m for m, apart in (("temporal_hard_acc", hard), ("abstain_f1", f1)) if apart]
        out["grpo_2x_closes_gap"] = {m: not separated(b[m], g2[m]) for m in gaps}
        closed = [m for m in gaps if out["grpo_2x_closes_gap"][m]]
        lines.append("GRPO with 2× rollouts: " + ("no gap to close" if not gaps else
                     f"closes the gap on {', '.join(closed)}" if closed else
                     "does not close the gap (" + "; ".join(f"{m} {fmt_ci(g2[m])}" for m in gaps) + ")"))
    if sft is not None:
        out["grpo_macro_over_sft"] = separated(g["macro_acc"], sft["macro_acc"])
        lines.append(f"GRPO over the SFT start, macro accuracy: GRPO {fmt_ci(g['macro_acc'])} vs SFT "
                     f"{fmt_ci(sft['macro_acc'])} → "
                     + ("GRPO higher, intervals apart" if out["grpo_macro_over_sft"] else "not raised"))
    return {**out, "lines": lines}

