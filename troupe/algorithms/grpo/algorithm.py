"""GRPO: sample a group per prompt, score it, advantage relative to the group, PPO-clip update.

The graph is rollout → reward → learner (+ a reference scorer when ``learner.kl_coef > 0``).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np

from troupe.algorithms.grpo.config import GRPOConfig
from troupe.algorithms.policy_graph import PolicyGraph, group_rows, step_seed
from troupe.algorithms.sft import prepare_policy
from troupe.envs.arithmetic import ArithmeticTask
from troupe.envs.datasets import PromptDataset
from troupe.platform.algorithm import Algorithm
from troupe.platform.config import to_dict
from troupe.platform.placement import ActorGraph, Role
from troupe.platform.registry import ADVANTAGES, ALGORITHMS, ENVIRONMENTS


@ALGORITHMS.register("grpo")
class GRPO(Algorithm):
    name = "grpo"
    Config = GRPOConfig
    summary_line = "group-relative policy optimisation on a verifiable task (the LLM baseline)"

    def __init__(self, config: GRPOConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        t = config.task
        self.task: ArithmeticTask = ENVIRONMENTS.get(t.name)(digits=t.digits, ops=tuple(t.ops))
        self.train_set = PromptDataset.from_jsonl(t.dataset, ("prompt", "answer")) if t.dataset else None
        eval_rows = (PromptDataset.from_jsonl(t.eval_dataset, ("prompt", "answer")).rows if t.eval_dataset
                     else self.task.eval_set(config.eval.num_prompts))
        self.eval_rows = eval_rows[: config.eval.num_prompts]
        self.advantage = ADVANTAGES.get(config.grpo.advantage)
        self.model_path = prepare_policy(config.model, self.task, to_dict(t))
        self.policy = PolicyGraph(config, str(self.model_path))

    def roles(self) -> list[Role]:
        return self.policy.roles()

    def setup(self, graph: ActorGraph) -> None:
        super().setup(graph)
        self.policy.setup(graph)

    def sample_prompts(self, step: int) -> list[dict]:
        rng = np.random.default_rng(step_seed(self.config.run.seed, step, "prompts"))
        n = self.config.grpo.prompts_per_step
        return self.train_set.sample(n, rng) if self.train_set else self.task.sample(n, "train", rng)

    def step(self, step: int) -> dict[str, float]:
        c, p = self.config, self.policy
        prompts, rows, group_ids = group_rows(self.sample_prompts(step), c.grpo.group_size)

        t0 = time.perf_counter()
        pending = p.generate(prompts, rows, c.rollout.sampling, step_seed(c.run.seed, step, "sample"))
        scoring = p.score_begin(pending)  # the reward actor waits for the batches itself
        batches = p.wait_batches(pending)
        t1 = time.perf_counter()
        scored = p.score(batches, scoring)
        rewards = scored["rewards"]
        advantages = self.advantage(rewards, group_ids)  # e.g. GRPO: A_i = (r_i - mean) / std
        extras: dict[str, Any] = {"advantages": advantages}
        if c.learner.kl_coef > 0:
            extras["ref_logprobs"] = p.reference_logprobs(batches)
        t2 = time.perf_counter()
        metrics = p.update_and_sync(batches, extras)  # sets time/update_s and time/sync_s

        grouped = rewards.view(-1, c.grpo.group_size)
        metrics.update({
            "reward/mean": float(rewards.mean()),
            "reward/std": float(rewards.std()),
            "reward/solved_groups": float((grouped.max(1).values > 0).float().mean()),
            "reward/zero_std_groups": float((grouped.std(1) == 0).float().mean()),
            "reward/errors": float(len(scored["errors"])),
            "faults": float(p.pop_faults()),
            "time/generate_s": t1 - t0,
            "time/reward_s": t2 - t1,
        })
        return metrics

    def evaluate(self, step: int) -> dict[str, float]:
        greedy = dataclasses.replace(self.config.rollout.sampling, temperature=self.config.eval.temperature)
        out = self.policy.evaluate(self.eval_rows, greedy, seed=step_seed(self.config.run.seed, step, "eval"))
        return {"accuracy": out["reward"]}  # the task's reward is exact match

    def save(self, ckpt_dir: Path) -> None:
        self.policy.save(ckpt_dir)

    def load(self, ckpt_dir: Path) -> None:
        self.policy.load(ckpt_dir)

    def finalize(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        evals = [r["eval/accuracy"] for r in history if "eval/accuracy" in r]
        rewards = [r["reward/mean"] for r in history if "reward/mean" in r]
        k = max(1, len(rewards) // 10)
        out = {
            "eval_accuracy_start": evals[0] if evals else None,
            "eval_accuracy_end": evals[-1] if evals else None,
            "eval_accuracy_best": max(evals) if evals else None,
            "train_reward_first10pct": float(np.mean(rewards[:k])) if rewards else None,
            "train_reward_last10pct": float(np.mean(rewards[-k:])) if rewards else None,
        }
        if hasattr(self, "model_path"):  # absent when `troupe report` rebuilds from files
            out["model_path"] = str(self.model_path)
        return out

    def report_sections(self, summary: dict[str, Any]) -> list[str]:
        s = summary
        rows = [
            "## GRPO result",
            "",
            "| | start | end |",
            "|---|---|---|",
            f"| held-out accuracy (greedy, {self.config.eval.num_prompts} prompts) | {_f(s.get('eval_accuracy_start'))} | "
            f"{_f(s.get('eval_accuracy_end'))} |",
            f"| training reward (mean of first / last 10% of steps) | {_f(s.get('train_reward_first10pct'))} | "
            f"{_f(s.get('train_reward_last10pct'))} |",
            "",
            f"Policy started from the SFT checkpoint `{s.get('model_path') or '?'}`.",
        ]
        return ["\n".join(rows)]


def _f(v: Any) -> str:
    return "–" if v is None else f"{v:.3f}"
