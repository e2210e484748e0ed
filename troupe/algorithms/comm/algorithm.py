"""``comm``: when should a main agent message an executor? §D on two language models.

`prepare` fits the two tiny agents by SFT on the split-context task (cached): M writes a plain
message or the cryptic code of its belief about the step's key; E restates the key and acts from
its local view and what it reads. Each `step` logs a chunk of episodes in every regime, each
episode run under every fixed action on the agent layer (`troupe.algorithms.comm.lm`): train
episodes for the selector, test episodes to score every policy on, and test episodes at a weak
and a strong M (claim 3). The final `evaluate` fits the selector on the train logs, scores it
and every §D.3 baseline on the test logs, runs it live on the test episodes, and writes
``comm/results.json`` and the plots that the report reads.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from troupe.algorithms.comm import analysis
from troupe.algorithms.comm.config import CommConfig, engine_view
from troupe.algorithms.comm.lm import ACTIONS, Protocol, run_policies
from troupe.algorithms.policy_graph import rollout_class, step_seed
from troupe.algorithms.sft import prepare_policy
from troupe.envs.split_context import SplitContext, SplitContextSFT
from troupe.platform.algorithm import Algorithm, Report
from troupe.platform.checkpoint import atomic_write_json, atomic_write_text
from troupe.platform.config import to_dict
from troupe.platform.errors import ConfigError
from troupe.platform.placement import ActorGraph, Role
from troupe.platform.run import RunContext

log = logging.getLogger("troupe")

# One file per step, written whole and atomically: a line per logged episode (its split, regime,
# parameters, and its step records under every action).
LOGS = "comm/logs"
RESULTS = "comm/results.json"


class MixedSFT:
    """One agent's SFT rows from several split-context tasks (the raw lengths), kinds weighted."""

    def __init__(self, tasks: list[SplitContext], role: str, weights: dict[str, float]) -> None:
        self.parts = [SplitContextSFT(t, role) for t in tasks]
        self.role = role
        self.kinds = [k for k, w in weights.items() if w > 0]
        w = np.array([weights[k] for k in self.kinds], dtype=float)
        self.p = w / w.sum() if len(w) else None

    def sample(self, n: int, split: str, rng: np.random.Generator) -> list[dict]:
        rows = []
        for i in range(n):
            part = self.parts[i % len(self.parts)]
            kinds = [self.kinds[rng.choice(len(self.kinds), p=self.p)]] if self.kinds else None
            rows += part.task.sft_rows(self.role, 1, rng, kinds)
        return rows

    def corpus(self, n: int = 4000, seed: int = 0) -> list[str]:
        rows = self.sample(n, "train", np.random.default_rng(seed))
        return [f"{r['prompt']}\n{r['answer']}" for r in rows]


class Comm(Algorithm):
    Config = CommConfig
    summary_line = "when a main agent should message an executor: counterfactual logs of two LMs and a learned selector"
    progress_metrics = ("acc/weak_local/plain", "acc/strong_local/none")

    def __init__(self, config: CommConfig, ctx: RunContext) -> None:
        super().__init__(config, ctx)
        t = config.task
        self.regimes = list(t.regimes)
        self.sft_tasks = [SplitContext(t.split_context(raw, t.sft_q_L, t.sft_q_M)) for raw in t.raw_lengths]
        self.clients: dict[str, Any] = {}
        self.protocol: Protocol | None = None
        self.paths: dict[str, str] = {}

    # -- the agents ---------------------------------------------------------------------
    def prepare(self) -> dict[str, Any]:
        """Both agents' SFT checkpoints (from the cache when they exist)."""
        c = self.config
        facts: dict[str, Any] = {}
        for role in ("main", "executor"):
            agent = getattr(c, role)
            weights = agent.sft_kinds or ({"plain": 1.0, "cryptic": 1.0} if role == "main" else
                                          dict.fromkeys(("none", "plain", "cryptic", "raw"), 1.0))
            info: dict[str, Any] = {}
            key = {"task": to_dict(c.task), "role": role, "kinds": weights, "v": 1}
            prepare_policy(agent.model, MixedSFT(self.sft_tasks, role, weights), key, info)
            facts[role] = info
            self.paths[role] = info["model_path"]
        return facts

    def roles(self) -> list[Role]:
        c = self.config
        roles = []
        for role in ("main", "executor"):
            agent = getattr(c, role)
            cls = rollout_class(agent.rollout.backend)
            kwargs = {"model_path": self.paths[role], **cls.config_kwargs(engine_view(c, role))}
            roles.append(Role(role, cls, count=agent.rollout.num_engines, num_cpus=agent.rollout.num_cpus,
                              num_gpus=agent.rollout.num_gpus, kwargs=kwargs, max_restarts=agent.rollout.max_restarts,
                              max_task_retries=0))
        return roles

    def setup(self, graph: ActorGraph) -> None:
        from transformers import AutoTokenizer

        from troupe.algorithms.agents.episodes import EngineClient

        super().setup(graph)
        c = self.config.comm
        self.clients = {role: EngineClient(list(graph[role].handles), c.sampling, timeout_s=c.call_timeout_s)
                        for role in ("main", "executor")}
        toks = {role: AutoTokenizer.from_pretrained(self.paths[role]) for role in ("main", "executor")}
        check_context(self.sft_tasks, toks["executor"], self.paths["executor"])
        self.protocol = Protocol(
            task=self.sft_tasks[0],  # the prompts do not depend on the task's parameters
            count_main=lambda s: len(toks["main"](s, add_special_tokens=False)["input_ids"]),
            count_executor=lambda s: len(toks["executor"](s, add_special_tokens=False)["input_ids"]),
            tax=self.config.comm.tax.model())

    # -- the episodes -----------------------------------------------------------------------
    def chunk(self, step: int) -> tuple[list[Any], list[dict[str, Any]]]:
        """The episodes this step logs, and what each one is (split, regime, q_L, q_M, raw length)."""
        c, t = self.config.comm, self.config.task
        episodes, meta = [], []
        for regime, q in t.regimes.items():
            plan = [("train", c.train_episodes, q["q_M"]), ("test", c.test_episodes, q["q_M"])]
            plan += [(f"upstream_{qm:g}", c.upstream_episodes, qm) for qm in t.upstream_q_M]
            for split, n, q_M in plan:
                rng = np.random.default_rng(step_seed(self.config.run.seed, step, f"{regime}/{split}"))
                for i in range(n):
                    raw = t.raw_lengths[int(rng.integers(len(t.raw_lengths)))]
                    heterogeneous = split in ("train", "test")  # claim 3 sets q_M exactly
                    q_L = float(_beta(q["q_L"], t.concentration, rng))
                    q_M_i = float(_beta(q_M, t.concentration, rng)) if heterogeneous else q_M
                    task = SplitContext(t.split_context(raw, q_L, q_M_i))
                    episodes.append(task.episode(rng))
                    meta.append({"step": step, "split": split, "regime": regime, "index": i, "q_L": q_L,
                                 "q_M": q_M_i, "raw_length": raw})
        return episodes, meta

    def step(self, step: int) -> dict[str, float]:
        episodes, meta = self.chunk(step)
        log_ = run_policies(self.sft_tasks[0], episodes, ACTIONS, self.clients, self.protocol,
                            seed=step_seed(self.config.run.seed, step, "episodes"), meta=meta,
                            episode_timeout_s=self.config.comm.episode_timeout_s)
        lines = []
        for i, m in enumerate(meta):
            recs = {a: log_.records[a][i] for a in ACTIONS}
            lines.append(json.dumps({**m, "records": recs}))
        atomic_write_text(self.ctx.artifact(f"{LOGS}/step-{step:05d}.jsonl"), "".join(line + "\n" for line in lines))
        metrics: dict[str, float] = {"log/episodes": float(len(episodes)), "log/engine_calls": float(log_.engine_calls),
                                     "log/failed_forks": float(sum(log_.failed.values())),
                                     "time/episodes_s": log_.wall_s}
        for regime in self.regimes:
            rows = [i for i, m in enumerate(meta) if m["regime"] == regime and m["split"] == "test"]
            for a in ACTIONS:
                ok = [r["success"] for i in rows for r in (log_.records[a][i] or [])]
                if ok:
                    metrics[f"acc/{regime}/{a}"] = float(np.mean(ok))
        return metrics

    def evaluate(self, step: int) -> dict[str, float]:
        """Fit the selector on every train log so far, score every policy on the test logs, run
        the selector live on the test episodes; write the results and plots."""
        rows = read_logs(self.ctx.run_dir / LOGS, upto=step)
        if not rows:
            return {}
        c = self.config.comm
        results = analysis.analyse(rows, self.config, seed=self.config.run.seed)
        # live: the selector of each regime, as a graph node, on that regime's test episodes
        for regime in list(results["regimes"]):
            sel = results["regimes"][regime]["selector_model"]
            results["regimes"][regime]["live"] = self._live(regime, rows, sel, c.live_lambda, step)
        for r in results["regimes"].values():
            r.pop("selector_model")
        results["claims"] = analysis.claims(results, self.config)
        atomic_write_json(self.ctx.artifact(RESULTS), results)
        analysis.plot_all(results, self.ctx.plots_dir)
        out = {}
        for regime, r in results["regimes"].items():
            out[f"{regime}/selector_acc"] = r["selector_at_live_lambda"]["accuracy"]
            out[f"{regime}/live_acc"] = r["live"]["accuracy"]
        return out

    def _live(self, regime: str, rows: list[dict], model: Any, lam: float, step: int) -> dict[str, Any]:
        """The selector deciding inside the graph: the same features from the agents' own calls."""
        from troupe.algorithms.comm.selector import decide

        test = [r for r in rows if r["regime"] == regime and r["split"] == "test"]
        chunks: dict[int, list[int]] = {}
        for r in test:
            chunks.setdefault(r["step"], []).append(r["index"])
        episodes, meta = [], []
        for s in sorted(chunks):  # rebuild the logged episodes from their seeds
            eps, m = self.chunk(s)
            for ep, mm in zip(eps, m, strict=True):
                if mm["regime"] == regime and mm["split"] == "test":
                    episodes.append(ep)
                    meta.append(mm)

        def selector(z: np.ndarray, taxes: np.ndarray) -> int:
            return int(decide(model.predict(z[None, :]), taxes[None, :], lam)[0])

        protocol = dataclasses.replace(self.protocol, selector=selector)
        out = run_policies(self.sft_tasks[0], episodes, ["select"], self.clients, protocol,
                           seed=step_seed(self.config.run.seed, step, f"live/{regime}"), meta=meta)
        return analysis.live_summary(out.records["select"], test)

    # -- state ---------------------------------------------------------------------------------
    def save(self, ckpt_dir: Path) -> None:
        atomic_write_json(ckpt_dir / "comm.json", {"logged_steps": len(log_files(self.ctx.run_dir / LOGS))})

    def load(self, ckpt_dir: Path) -> None:
        """Drop the logs of steps after the checkpoint: those steps run again."""
        done = json.loads((ckpt_dir / "comm.json").read_text())["logged_steps"]
        for path in log_files(self.ctx.run_dir / LOGS)[done:]:
            path.unlink()

    # -- report ----------------------------------------------------------------------------------
    @classmethod
    def report(cls, config: CommConfig, run: RunContext, history: list[dict[str, Any]]) -> Report:
        path = run.run_dir / RESULTS
        if not path.is_file():
            return Report({}, ["## Communication result\n\nNo results: the run logged no episodes."])
        results = json.loads(path.read_text())
        return Report(analysis.summary(results), analysis.sections(results, config, run.prepared()))


def check_context(tasks: list[SplitContext], tokenizer: Any, model_path: str) -> None:
    """E's longest prompt (its view, the longest content it can read, the question, in its chat
    template) must fit its model's context: a clear error naming the task keys otherwise."""
    from transformers import AutoConfig

    from troupe.actors.sampling import chat_format

    limit = getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)
    if not limit:
        return
    rng = np.random.default_rng(0)
    longest = 0
    for task in tasks:
        for step in task.steps(16, rng):
            for kind in ("plain", "raw"):
                prompt = task.executor_prompt(step, step.received(kind))
                text = chat_format(tokenizer, [prompt], True, None)[0]
                longest = max(longest, len(tokenizer(text, add_special_tokens=False)["input_ids"]))
    if longest + 16 > limit:  # room for the answer
        raise ConfigError(f"the executor's prompts run to {longest} tokens, more than its context of {limit} "
                          f"(max_position_embeddings of {model_path}) less room to answer: lower task.budget or "
                          "task.local_facts, or give the executor a longer context (executor.model.tiny."
                          "max_position_embeddings for the embedded model)")


def _beta(mean: float, concentration: float, rng: np.random.Generator) -> float:
    if mean <= 0.0 or mean >= 1.0:
        return float(mean)
    return float(rng.beta(concentration * mean, concentration * (1 - mean)))


def log_files(folder: Path) -> list[Path]:
    """The per-step log files, in step order."""
    return sorted(folder.glob("step-*.jsonl")) if folder.is_dir() else []


def read_logs(folder: Path, upto: int | None = None) -> list[dict[str, Any]]:
    """The logged episodes (of the steps before ``upto``)."""
    rows = [json.loads(line) for path in log_files(folder) for line in path.read_text().splitlines() if line]
    return [r for r in rows if upto is None or r["step"] < upto]
