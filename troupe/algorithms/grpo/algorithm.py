"""GRPO: sample a group per prompt, score it, advantage relative to the group, PPO-clip update.

The graph is rollout → reward → learner (+ a reference scorer when ``learner.kl_coef > 0``).
With ``run.staleness = k > 0`` a step's rollout is generated while an earlier step updates
(`PolicyGraph.rollout_at`), at most k updates behind the learner.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch

from troupe.algorithms.grpo.config import GRPOConfig
from troupe.algorithms.lookahead import RolloutRequest
from troupe.algorithms.policy_graph import PolicyGraph, group_rows, step_seed
from troupe.algorithms.sft import prepare_policy
from troupe.envs.task import build_task
from troupe.platform.algorithm import Algorithm, Report
from troupe.platform.placement import ActorGraph, Role
from troupe.platform.registry import ADVANTAGES
from troupe.platform.run import RunContext


class GRPO(Algorithm):
    Config = GRPOConfig
    summary_line = "group-relative policy optimisation on a verifiable task (the LLM baseline)"
    progress_metrics = ("reward/mean", "eval/accuracy", "loss/policy")
    generates_ahead = True  # run.staleness > 0: rollout_at and update_and_sync

    def __init__(self, config: GRPOConfig, ctx: RunContext) -> None:
        super().__init__(config, ctx)
        self.task = build_task(config.task)
        self.eval_rows = self.task.eval_rows(config.eval.num_prompts)
        self.advantage = ADVANTAGES.get(config.grpo.advantage)
        self.policy: PolicyGraph | None = None

    def prepare(self) -> dict[str, Any]:
        """The SFT checkpoint RL starts from (from the cache when it exists)."""
        facts: dict[str, Any] = {}
        prepare_policy(self.config.model, self.task.sft_task(), self.task.cache_key(), facts)
        self.policy = PolicyGraph(self.config, facts["model_path"])
        return facts

    def roles(self) -> list[Role]:
        return self.policy.roles()

    def setup(self, graph: ActorGraph) -> None:
        super().setup(graph)
        self.policy.setup(graph)

    def sample_prompts(self, step: int) -> list[dict]:
        rng = np.random.default_rng(step_seed(self.config.run.seed, step, "prompts"))
        return self.task.train_rows(self.config.grpo.prompts_per_step, rng)

    def rollout_request(self, step: int) -> RolloutRequest:
        """What step ``step`` generates: a group of samples per prompt, with the step's own seed."""
        c = self.config
        prompts, rows, _ = group_rows(self.sample_prompts(step), c.grpo.group_size)
        return RolloutRequest(prompts, rows, c.rollout.sampling, step_seed(c.run.seed, step, "sample"))

    def step(self, step: int) -> dict[str, float]:
        # With run.staleness > 0 this rollout was started while an earlier step updated.
        rollout = self.policy.rollout_at(step, self.rollout_request)
        return grpo_update(self.policy, rollout, self.config.grpo.group_size, self.advantage)

    def evaluate(self, step: int) -> dict[str, float]:
        greedy = dataclasses.replace(self.config.rollout.sampling, temperature=self.config.eval.temperature)
        out = self.policy.evaluate(self.eval_rows, greedy, seed=step_seed(self.config.run.seed, step, "eval"))
        return {"accuracy": out["reward"]}  # the task's reward is exact match

    def save(self, ckpt_dir: Path) -> None:
        self.policy.save(ckpt_dir)

    def load(self, ckpt_dir: Path) -> None:
        self.policy.load(ckpt_dir)

    @classmethod
    def report(cls, config: GRPOConfig, run: RunContext, history: list[dict[str, Any]]) -> Report:
        evals = [r["eval/accuracy"] for r in history if "eval/accuracy" in r]
        rewards = [r["reward/mean"] for r in history if "reward/mean" in r]
        k = max(1, len(rewards) // 10)
        s = {
            "eval_accuracy_start": evals[0] if evals else None,
            "eval_accuracy_end": evals[-1] if evals else None,
            "eval_accuracy_best": max(evals) if evals else None,
            "train_reward_first10pct": float(np.mean(rewards[:k])) if rewards else None,
            "train_reward_last10pct": float(np.mean(rewards[-k:])) if rewards else None,
            "model_path": run.prepared().get("model_path"),
        }
        staleness = [r["staleness"] for r in history if "staleness" in r]
        if staleness:  # run.staleness > 0
            s["staleness_mean"], s["staleness_max"] = float(np.mean(staleness)), max(staleness)
        rows = [
            "## GRPO result",
            "",
            "| | start | end |",
            "|---|---|---|",
            f"| held-out accuracy (greedy, {config.eval.num_prompts} prompts) | {_f(s['eval_accuracy_start'])} | "
            f"{_f(s['eval_accuracy_end'])} |",
            f"| training reward (mean of first / last 10% of steps) | {_f(s['train_reward_first10pct'])} | "
            f"{_f(s['train_reward_last10pct'])} |",
            *([f"| staleness (updates between sampling and training; mean, max over steps) | "
               f"{_f(s['staleness_mean'])} | {s['staleness_max']:.0f} |"] if staleness else []),
            "",
            f"Policy started from `{s['model_path'] or '?'}`.",
        ]
        return Report(s, ["\n".join(rows)])


def _f(v: Any) -> str:
    return "–" if v is None else f"{v:.3f}"


def grpo_step(policy: PolicyGraph, rows: list[dict], group_size: int, sampling: Any, seed: int,
              advantage: Any) -> dict[str, float]:
    """One GRPO step of ``policy`` on ``rows``: a group of ``group_size`` samples per row, scored
    by the policy's reward role, advantages relative to the group, an update and a weight sync."""
    prompts, rows, _ = group_rows(rows, group_size)
    return grpo_update(policy, policy.rollout(prompts, rows, sampling, seed), group_size, advantage)


def grpo_update(policy: PolicyGraph, rollout: Any, group_size: int, advantage: Any) -> dict[str, float]:
    """The rest of a GRPO step once its ``rollout`` (groups of ``group_size`` consecutive rows) is
    started: its rewards, advantages relative to the group, an update and a weight sync."""
    out = rollout.result()
    group_ids = torch.arange(len(out.rewards) // group_size).repeat_interleave(group_size)
    advantages = advantage(out.rewards, group_ids)  # e.g. GRPO: A_i = (r_i - mean) / std
    metrics = policy.update_and_sync(out.batches, {"advantages": advantages}).result()
    grouped = out.rewards.view(-1, group_size)
    # A judge's answers that parsed to no verdict are counted in the step's metrics, never absorbed.
    unparsed = {"reward/judge_unparsed": float(out.extras["judge_unparsed"].sum())} \
        if "judge_unparsed" in out.extras else {}
    return {**metrics, **unparsed,
            "reward/mean": float(out.rewards.mean()),
            "reward/std": float(out.rewards.std()),
            "reward/solved_groups": float((grouped.max(1).values > 0).float().mean()),
            "reward/zero_std_groups": float((grouped.std(1) == 0).float().mean()),
            "reward/errors": float(len(out.errors)),
            "faults": float(policy.pop_faults()),
            "time/generate_s": out.generate_s,
            "time/reward_s": out.reward_s}
