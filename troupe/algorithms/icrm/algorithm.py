"""icrm: a reward model steered by in-context preference demonstrations (ALGORITHMS.md §C), fitted
by learner actors beside its baselines on the same backbone, chosen, saved, and used as the
reward of GRPO arms (ICRM-RL).

The graph is ``workers.count`` learner actors (`ICRMLearner`); the models of the comparison
(`learner.variants`: ICRM at each λ of ``train.lambdas``, the in-context BCE point model, the
static BT RMs of the ensemble, the generative judge) are dealt to them by estimated cost. A step
fits every model for its share of ``train.steps``. After the last step the driver scores every
model on the evaluation episodes, chooses λ by validation ECE, and saves the chosen ICRM and the
static RM under ``models/`` — the directories ``reward.kind=icrm`` reads in a GRPO run.

Then ICRM-RL (``rl``): ``rl.steps`` GRPO steps for each arm of ``rl.arms`` (`config.ARMS`), all
from one SFT policy on the persona prompts: ``icrm`` is rewarded by the chosen ICRM steered by
persona a's demos in every row, ``static`` by the static RM (which reads no demos), ``icrm_b`` by
the same ICRM steered by persona b's. Every arm is scored by both personas' gold rewards on
held-out prompts (greedy), every ``rl.eval_every`` steps. The reward roles read their model at
their first call, once the fitting has saved it.

With ``data.source=arithmetic`` (verifiable math) the episodes are (correct, incorrect) solution
pairs of arithmetic problems, the demos pairs of *other* problems, and the arms are ``icrm`` (the
chosen ICRM reading k such demos of training problems in every row), ``static`` (the static RM
fitted on the same pairs) and ``rule`` (the task's exact checker itself), all from one SFT policy
on the same problems and scored by exact-match accuracy on held-out problems.

With a dataset source (``data.source`` helpsteer2, ultrafeedback or pku_saferlhf) the models
are fitted and evaluated on its episodes, on prompts held out of training; ICRM-RL, best-of-N
and the steering front need the synthetic personas' gold reward and are not run (the report
says so; `config.RLConfig`).

The report is rebuilt from ``predictions.json``, ``truth.json`` and ``rl.jsonl`` alone (and
``data.json`` for a dataset source).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from troupe.algorithms.grpo.algorithm import grpo_step
from troupe.algorithms.icrm import analysis
from troupe.algorithms.icrm import selection as bon
from troupe.algorithms.icrm.config import ARITHMETIC, ARMS, DATASET_KEYS, PERSONAS, ICRMRunConfig, TrainConfig
from troupe.algorithms.icrm.learner import (
    ArithmeticData,
    Data,
    DatasetData,
    ICRMLearner,
    TaskData,
    Variant,
    arithmetic_task,
    corpus,
    eval_sets,
    fit_steps,
    icrm_name,
    persona_weights,
    selection_set,
    task_data,
    variants,
)
from troupe.algorithms.icrm.reward import ICRMReward
from troupe.algorithms.icrm.text import prepare_backbone
from troupe.algorithms.policy_graph import PolicyGraph, step_seed
from troupe.algorithms.sft import prepare_policy
from troupe.envs.persona_prompts import PersonaPromptsTask
from troupe.envs.preferences.loaders import HUB_IDS
from troupe.envs.preferences.solutions import with_solution_demos
from troupe.platform.algorithm import Algorithm, Report
from troupe.platform.checkpoint import atomic_write_json, atomic_write_text
from troupe.platform.config import to_dict
from troupe.platform.errors import ConfigError
from troupe.platform.placement import ActorGraph, Role
from troupe.platform.registry import ADVANTAGES
from troupe.platform.run import RunContext

# Relative cost of one training step, for dealing models to learners: an in-context model reads
# 2k + 2 responses per episode, a static one 2, the judge one sequence of all of them. The static
# figure is measured on the embedded backbone (12 ms a step against 34 ms, frozen backbone: the
# context encoder is a small share of an in-context step).
COST = {"context": 1.0, "static": 0.35, "judge": 1.5}
RHOS = tuple(round(0.1 * i, 1) for i in range(11))  # §C.2's demo mixes


def cost(v: Variant, t: TrainConfig) -> float:
    """A model's whole fitting: its cost per step times its own step count."""
    per_step = COST["judge"] if v.kind == "judge" else COST["context" if v.context else "static"]
    return per_step * fit_steps(v, t)


def deal(vs: list[Variant], workers: int, t: TrainConfig) -> list[list[Variant]]:
    """Largest first to the least loaded learner; no learner is left empty."""
    n = min(workers, len(vs))
    shares: list[list[Variant]] = [[] for _ in range(n)]
    load = [0.0] * n
    for v in sorted(vs, key=lambda v: -cost(v, t)):
        i = int(np.argmin(load))
        shares[i].append(v)
        load[i] += cost(v, t)
    return shares


def backbone_key(cfg: ICRMRunConfig, data: Data, texts: list[str]) -> dict[str, Any]:
    """What the embedded backbone's cache is keyed by: everything that shapes its corpus ``texts``."""
    key = to_dict(cfg.data)
    if isinstance(data, DatasetData):  # a file's contents, not only its name, shape the backbone
        key["corpus_sha256"] = hashlib.sha256(json.dumps(texts).encode()).hexdigest()
        return key
    # The dataset keys do not shape the personas' corpus (backbones cached before them still
    # serve), but the source does: arithmetic and personas at one seed once shared a backbone.
    key = {k: v for k, v in key.items() if k not in DATASET_KEYS}
    if isinstance(data, ArithmeticData):
        key["source"] = ARITHMETIC
    return key


class ICRMAlgorithm(Algorithm):
    Config = ICRMRunConfig
    summary_line = "ICRM: a reward model steered by in-context demos vs static, point, ensemble and judge baselines"
    progress_metrics = ("loss/" + icrm_name(1.0),)

    def __init__(self, config: ICRMRunConfig, ctx: RunContext) -> None:
        super().__init__(config, ctx)
        self.variants = variants(config)
        self.shares = deal(self.variants, config.workers.count, config.train)
        self.holder = {v.name: i for i, share in enumerate(self.shares) for v in share}
        self.backbone_path = ""
        self.data: Data | None = None
        self.finished = False
        rl = config.rl
        self.tasks: dict[str, Any] = {}
        if config.data.source == PERSONAS:
            self.tasks = {who: PersonaPromptsTask(dataclasses.replace(
                rl.policy.task, weights=list(getattr(rl, f"persona_{who}")), demos=config.data.personas.max_demos,
                beta0=config.data.personas.beta0)) for who in ("a", "b")}
            self.eval_rows = {who: t.eval_rows(rl.policy.eval.num_prompts) for who, t in self.tasks.items()}
        elif config.data.source == ARITHMETIC:
            self.tasks = {"a": arithmetic_task(config)}
            self.eval_rows = {"exact": self.tasks["a"].eval_rows(rl.policy.eval.num_prompts)}
        self.arms: dict[str, PolicyGraph] = {}
        self.advantage = ADVANTAGES.get(rl.policy.grpo.advantage)
        self.rl_log: list[dict[str, Any]] = []

    def prepare(self) -> dict[str, Any]:
        """The task's data (a dataset is read once, here, and handed to the learners), the backbone
        every reward model reads with (the embedded one pretrained on the task's text, cached), and
        the SFT policy the RL arms start from."""
        c = self.config
        if c.backbone.path != "tiny":
            from troupe.actors.models import model_config_or_error

            model_config_or_error(c.backbone.path, "backbone.path", "a causal LM (a hub id or a local directory)")
        self.data = task_data(c)
        texts = corpus(c, self.data)
        self.backbone_path, backbone = prepare_backbone(c.backbone, texts, backbone_key(c, self.data, texts))
        facts: dict[str, Any] = {"backbone": backbone, "backbone_path": self.backbone_path,
                                 "models": [v.name for v in self.variants],
                                 "learners": [[v.name for v in share] for share in self.shares]}
        if isinstance(self.data, DatasetData | ArithmeticData):
            facts["data"] = self.data.facts()
        if c.rl.steps:
            policy: dict[str, Any] = {}
            prepare_policy(c.rl.policy.model, self.tasks["a"].sft_task(), self.tasks["a"].cache_key(), policy)
            facts["policy"] = policy
            # Each arm's reward role is its reward model; the shared "reward" role (a rule) is the
            # gold reward every arm is evaluated with.
            # The rule arm is trained on that gold reward itself.
            self.arms = {arm: PolicyGraph(c.rl.policy, policy["model_path"], prefix=f"{arm}_", shared_roles=i == 0,
                                          reward_role=reward_role(arm), checker_role="reward")
                         for i, arm in enumerate(c.rl.arms)}
        return facts

    def roles(self) -> list[Role]:
        c = self.config
        roles = [Role("learner", ICRMLearner, count=len(self.shares), num_cpus=c.workers.num_cpus,
                      num_gpus=c.workers.num_gpus, kwargs={"cfg": c, "backbone_path": self.backbone_path,
                                                           "data": self.data},
                      rank_kwargs=[{"variants": share} for share in self.shares])]
        if not self.arms:
            return roles
        r = c.rl.policy.reward
        for rm in sorted({ARMS[arm][0] for arm in c.rl.arms} - {"rule"}):
            roles.append(Role(f"reward_{rm}", ICRMReward, num_cpus=r.num_cpus, max_restarts=r.max_restarts,
                              kwargs={"path": str(self.ctx.artifact(f"models/{rm}")), "estimate": c.rl.estimate,
                                      "device": r.device, "batch_size": r.batch_size}))
        return roles + [role for p in self.arms.values() for role in p.roles()]

    def setup(self, graph: ActorGraph) -> None:
        super().setup(graph)
        for p in self.arms.values():
            p.setup(graph)

    # -- the loop ----------------------------------------------------------------------------------
    def step(self, step: int) -> dict[str, float]:
        if step >= self.config.train.chunks:
            return self.rl_step(step - self.config.train.chunks)
        c = self.config
        until = round((step + 1) * c.train.steps / c.train.chunks)
        metrics: dict[str, float] = {"train_steps": float(until)}
        for share in self.graph["learner"].call("advance", until):
            for name, r in share.items():
                metrics[f"loss/{name}"] = r["loss"]
                metrics[f"time/{name}_s"] = r["seconds"]
                metrics[f"steps/{name}"] = r["steps"]
        if step == c.train.chunks - 1:
            metrics |= self.finish()
        return metrics

    def finish(self) -> dict[str, float]:
        """Score every model on the evaluation episodes, choose λ, save the RMs for RL."""
        c = self.config
        predictions: dict[str, Any] = {}
        for share in self.graph["learner"].call("predict"):
            predictions |= share
        predictions = json.loads(json.dumps(predictions))  # the report reads k as a string key, as from the file
        data = self.task_data()
        truth = {s: {str(k): {"label": [e.query.label for e in eps], "p_true": p.tolist()}
                     for k, (eps, p) in by_k.items()} for s, by_k in eval_sets(c, data).items()}
        atomic_write_json(self.ctx.artifact("predictions.json"), predictions)
        atomic_write_json(self.ctx.artifact("truth.json"), truth)
        if isinstance(data, DatasetData | ArithmeticData):
            atomic_write_json(self.ctx.artifact("data.json"), data.facts())
        tab = analysis.table(predictions, truth)
        selected, eces = analysis.select_lambda(tab, {icrm_name(lam): lam for lam in c.train.lambdas})
        saved = {}
        for role, name in (("icrm", selected), ("static", "static_0" if c.train.ensemble else None)):
            if name is None:
                continue
            path = self.ctx.artifact(f"models/{role}")
            group = self.graph["learner"]
            group.wait([group[self.holder[name]].save_model.remote(name, str(path))], "save_model")
            saved[role] = {"model": name, "path": str(path)}
        atomic_write_json(self.ctx.artifact("selection.json"), {"selected": selected, "validation_ece": eces,
                                                                "saved": saved})
        if isinstance(data, TaskData):  # best-of-N and the front are scored by the personas' gold reward
            atomic_write_json(self.ctx.artifact("best_of_n.json"), self.select(selected, data))
        self.finished = True
        t = tab[selected]["seen"]
        return {"eval/selected_lambda": float(selected.removeprefix("icrm_lam")),
                "eval/icrm_ece_seen": t["all"]["ece"], "eval/icrm_accuracy_seen": t["all"]["accuracy"]}

    def task_data(self) -> Data:
        if self.data is None:
            self.data = task_data(self.config)
        return self.data

    def select(self, selected: str, data: TaskData) -> dict[str, Any]:
        """§C.4 read by what the models pick from the evaluation pool (`learner.selection_set`):
        best-of-N on persona a's gold reward against KL = log N − (N − 1)/N for ICRM steered by
        a's demos (r and the conservative E_q log p), by b's, and the static RM; and the steering
        front, ICRM with round(ρ k) of its k demos from persona b, against the linear
        scalarisation (1 − ρ) r_a + ρ r_b of the same ICRM steered by each persona alone."""
        c = self.config
        k = c.data.personas.max_demos
        counts = bon.mixed_counts(k, RHOS)
        contexts = {f"rho{rho:g}": m for rho, m in zip(RHOS, counts, strict=True)}
        group = self.graph["learner"]
        calls = [group[self.holder[selected]].selection_scores.remote(selected, contexts)]
        if c.train.ensemble:
            calls.append(group[self.holder["static_0"]].selection_scores.remote("static_0", {"none": -1}))
        scores = {}
        for part in group.wait(calls, "selection_scores"):
            scores |= {key: np.asarray(v) for key, v in part.items()}
        sel = selection_set(c, data)
        feats = data.eval_pool.features[sel.candidates]  # (rows, N, attributes)
        gold = {who: feats @ w for who, w in persona_weights(c).items()}
        ns = [2 ** i for i in range(int(np.log2(sel.candidates.shape[1])) + 1)]
        a_ctx, b_ctx = f"rho{RHOS[0]:g}", f"rho{RHOS[-1]:g}"
        proxies = {"gold itself": gold["a"], "ICRM steered by a (r)": scores[f"r/{a_ctx}"],
                   "ICRM steered by a (E_q log p)": scores[f"conservative/{a_ctx}"],
                   "ICRM steered by b (r)": scores[f"r/{b_ctx}"]}
        if "r/none" in scores:
            proxies["static RM (r)"] = scores["r/none"]
        curves = {name: bon.best_of_n(p, gold["a"], ns).tolist() for name, p in proxies.items()}
        n_all = [sel.candidates.shape[1]]

        def point(p: np.ndarray) -> list[float]:
            return [float(bon.best_of_n(p, gold[w], n_all)[0]) for w in ("a", "b")]

        mix = [point(scores[f"r/rho{rho:g}"]) for rho in RHOS]
        scal = [point((1 - rho) * scores[f"r/{a_ctx}"] + rho * scores[f"r/{b_ctx}"]) for rho in RHOS]
        base = [float(gold["a"][:, 0].mean()), float(gold["b"][:, 0].mean())]
        static = point(scores["r/none"]) if "r/none" in scores else None
        ref = np.min(np.array(mix + scal + [base] + ([static] if static else [])), 0)
        return {"model": selected, "rows": int(sel.candidates.shape[0]), "n": ns,
                "kl": bon.best_of_n_kl(np.array(ns)).tolist(), "gold_a": curves, "k": k, "rho": list(RHOS),
                "mix": mix, "scalarised": scal, "base": base, "static": static, "reference": ref.tolist(),
                "hypervolume": {"mix": bon.hypervolume_2d(np.array(mix), ref),
                                "scalarised": bon.hypervolume_2d(np.array(scal), ref)}}

    # -- ICRM-RL -------------------------------------------------------------------------------------
    def rl_step(self, t: int) -> dict[str, float]:
        """GRPO step ``t`` of every arm, on the same prompts (each arm's own persona's demos, or
        the same solution pairs of other problems);
        the gold evaluation before the first step and every ``rl.eval_every`` after."""
        c = self.config.rl
        metrics: dict[str, float] = {}
        if t == 0:
            metrics |= self.rl_evaluate(0)
        rng = np.random.default_rng(step_seed(self.config.run.seed, t, "rl_prompts"))
        state = rng.bit_generator.state
        for arm, policy in self.arms.items():
            rng.bit_generator.state = state  # the same prompts and reference responses for every arm
            rows = self.tasks[ARMS[arm][1]].train_rows(c.policy.grpo.prompts_per_step, rng)
            data = self.task_data()
            if isinstance(data, ArithmeticData):  # k (correct, incorrect) pairs of other problems in each row
                rows = with_solution_demos(rows, data.train, data.mistakes, self.config.data.max_demos, rng)
            out = grpo_step(policy, rows, c.policy.grpo.group_size, c.policy.rollout.sampling,
                            step_seed(self.config.run.seed, t, f"rl_sample/{arm}"), self.advantage)
            metrics |= {f"rl/{k}/{arm}": v for k, v in out.items()}
        if (t + 1) % c.eval_every == 0 or t + 1 == c.steps:
            metrics |= self.rl_evaluate(t + 1)
        return metrics

    def rl_evaluate(self, t: int) -> dict[str, float]:
        """Both personas' gold reward (arithmetic: exact-match accuracy, ``exact``) of every arm's
        greedy completions on held-out prompts (``gold/<arm>/<who>``) and of ``rl.eval_samples``
        sampled ones per prompt (``gold_sampled/<arm>/<who>``); each record is appended to
        ``rl.jsonl`` for the report."""
        c = self.config.rl
        greedy = dataclasses.replace(c.policy.rollout.sampling, temperature=c.policy.eval.temperature)
        out: dict[str, float] = {}
        for arm, policy in self.arms.items():
            for who, rows in self.eval_rows.items():
                r = policy.evaluate(rows, greedy, seed=step_seed(self.config.run.seed, t, f"rl_eval/{arm}"))
                out[f"gold/{arm}/{who}"] = r["reward"]
                if c.eval_samples:  # one seed for every arm: at step 0 they score the same samples
                    r = policy.evaluate([row for row in rows for _ in range(c.eval_samples)], c.policy.rollout.sampling,
                                        seed=step_seed(self.config.run.seed, t, "rl_eval_sampled"))
                    out[f"gold_sampled/{arm}/{who}"] = r["reward"]
        self.rl_log.append({"rl_step": t, **out})
        self._write_rl_log()
        return {f"eval/{k}": v for k, v in out.items()}

    def _write_rl_log(self) -> None:
        atomic_write_text(self.ctx.artifact("rl.jsonl"), "".join(json.dumps(r, sort_keys=True) + "\n"
                                                                  for r in self.rl_log))

    # -- state -------------------------------------------------------------------------------------
    def save(self, ckpt_dir: Path) -> None:
        states: dict[str, bytes] = {}
        for share in self.graph["learner"].call("export"):
            states |= share
        buf = io.BytesIO()
        torch.save(states, buf)
        tmp = ckpt_dir / "learners.pt.tmp"
        tmp.write_bytes(buf.getvalue())
        tmp.replace(ckpt_dir / "learners.pt")
        for arm, policy in self.arms.items():
            (ckpt_dir / arm).mkdir(parents=True, exist_ok=True)
            policy.save(ckpt_dir / arm)
        atomic_write_json(ckpt_dir / "icrm.json", {"finished": self.finished, "models": sorted(states),
                                                   "config": to_dict(self.config.train), "rl_log": self.rl_log})

    def load(self, ckpt_dir: Path) -> None:
        meta = json.loads((ckpt_dir / "icrm.json").read_text())
        expected = sorted(v.name for v in self.variants)
        if meta["models"] != expected:
            raise ConfigError(f"checkpoint {ckpt_dir} holds models {meta['models']}; this run fits {expected}: "
                              "resume with the same train.lambdas, train.point, train.ensemble and train.judge")
        states = torch.load(ckpt_dir / "learners.pt", weights_only=False)
        self.graph["learner"].call_each("restore", [({v.name: states[v.name] for v in share},)
                                                    for share in self.shares])
        self.finished = meta["finished"]
        for arm, policy in self.arms.items():
            policy.load(ckpt_dir / arm)
        # the RL log as of the checkpoint: evaluations after it are run again
        self.rl_log = meta["rl_log"]
        self._write_rl_log()

    # -- the run directory -------------------------------------------------------------------------
    @classmethod
    def report(cls, config: ICRMRunConfig, run: RunContext, history: list[dict[str, Any]]) -> Report:
        pred_file, truth_file = run.run_dir / "predictions.json", run.run_dir / "truth.json"
        if not pred_file.is_file() or not truth_file.is_file():
            return Report({}, ["## Reward models steered by demonstrations", "",
                               "The run stopped before its evaluation: no predictions.json yet."])
        predictions = analysis.with_derived(json.loads(pred_file.read_text()))
        truth = json.loads(truth_file.read_text())
        tab = analysis.table(predictions, truth)
        selected, eces = analysis.select_lambda(tab, {icrm_name(lam): lam for lam in config.train.lambdas})
        lam_one = icrm_name(1.0) if icrm_name(1.0) in tab else None
        claim_list = analysis.claims(tab, predictions, truth, selected, lam_one)
        rl_file = run.run_dir / "rl.jsonl"
        records = [json.loads(line) for line in rl_file.read_text().splitlines() if line] if rl_file.is_file() else []
        bon_file = run.run_dir / "best_of_n.json"
        picks = json.loads(bon_file.read_text()) if bon_file.is_file() else None
        if picks:
            claim_list += analysis.selection_claims(picks)
        claim_list += analysis.rl_claims(records)
        written = analysis.plots(tab, predictions, truth, selected, run.plots_dir)
        written += analysis.selection_plots(picks, run.plots_dir) if picks else []
        written += analysis.rl_plots(records, run.plots_dir)
        curves = analysis.rl_kl_curves(records, history, config.train.chunks)
        written += analysis.rl_kl_plot(curves, run.plots_dir, config.data.source == ARITHMETIC,
                                       sampled=analysis.has_sampled(records))
        summary = {"selected": selected, "validation_ece": eces, "metrics": tab, "claims": claim_list,
                   "rl": records, "rl_gold_vs_kl": curves, "plots": written, "best_of_n": picks}
        sections = analysis.sections(tab, selected, eces, claim_list, written)
        sections += analysis.selection_section(picks) if picks else []
        data_file = run.run_dir / "data.json"
        if config.data.source != PERSONAS:
            facts = json.loads(data_file.read_text()) if data_file.is_file() else None
            summary["data"] = facts
            describe = arithmetic_section if config.data.source == ARITHMETIC else data_section
            sections = describe(config, facts) + sections
        return Report(summary, sections + analysis.rl_section(records))


def reward_role(arm: str) -> str:
    """The role an arm's rollouts are scored by: its reward model's, or the rule's own."""
    rm = ARMS[arm][0]
    return "reward" if rm == "rule" else f"reward_{rm}"


def arithmetic_section(config: ICRMRunConfig, facts: dict[str, Any] | None) -> list[str]:
    """What an arithmetic run's episodes are, and how many problems each part holds."""
    d = config.data
    lines = ["## Data", "", f"Verifiable arithmetic: {d.digits}-digit operands, operators {d.ops}. A pair is a "
             "problem's correct answer against a plausible wrong one; an episode's demos are pairs of other "
             "problems, shown in a random order (the correct one always preferred, so calibration is against that "
             f"exact label). Training problems come from the task's train split; evaluation problems from its "
             f"held-out split, halved into validation and test. Mistake kinds trained on (and in `valid`, `seen`): "
             f"{d.mistakes}; held out (`unseen`, its demos and queries both): {d.unseen_mistakes}."]
    lines += _part_sizes(facts, "problems", "solutions")
    lines += ["", "In the tables below \"new personas of the train split\" read as held-out problems with the "
              "trained mistake kinds (`seen`), \"unseen-direction personas\" as the held-out mistake kinds "
              "(`unseen`). Best-of-N and the steering front (persona rewards) are not run."]
    return ["\n".join(lines)]


def _part_sizes(facts: dict[str, Any] | None, prompts: str, responses: str) -> list[str]:
    """The table of how many prompts and responses each part holds (none without the facts)."""
    if not facts:
        return []
    p, r = facts["prompts"], facts["responses"]
    return ["", f"| part | {prompts} | {responses} |", "|---|---|---|",
            *(f"| {n} | {p[n]} | {r[n]} |" for n in ("train", "valid", "test"))]


def data_section(config: ICRMRunConfig, facts: dict[str, Any] | None) -> list[str]:
    """What a dataset run read, how its prompts were split, and what it did not run (and why)."""
    d = config.data
    where = d.path or f"the hub id {HUB_IDS[d.source]}"
    lines = ["## Data", "", f"Episodes from **{d.source}** ({where}, split `{d.split}`), labels `{d.labels}`"
             + (f" (β = {d.beta:g})" if d.labels == "bt" else "") + "; prompts split by a seeded hash of their text, "
             f"{d.eval_fraction:g} of them held out of training (half validation, half test)."]
    lines += _part_sizes(facts, "prompts", "responses")
    lines += ["", "Objectives (attribute weights). Trained on, and evaluated on held-out prompts as `valid` and "
              "`seen`: " + "; ".join(f"`{n}` {w}" for n, w in d.objectives.items()) + ". Held out, evaluated as "
              "`unseen`: " + "; ".join(f"`{n}` {w}" for n, w in d.unseen_objectives.items()) + ".", "",
              "Accuracy is against the side the objective prefers; calibration is against "
              + ("σ(β · margin)." if d.labels == "bt" else "the threshold label itself (exact, 0 or 1).")
              + " The tables below name the splits as for personas: \"new personas of the train split\" are the "
              "training objectives on test prompts (`seen`), \"unseen-direction personas\" the held-out "
              "objectives (`unseen`).", "",
              f"Not run with data.source={d.source}: ICRM-RL (rl.steps) and best-of-N / the steering front. Both "
              "score a response by the synthetic personas' gold reward (wᵀφ of attributes counted from its text); "
              "a dataset's scores exist only for its own responses, not for a policy's new ones or a candidate "
              "pool. Run them with data.source=personas."]
    return ["\n".join(lines)]

