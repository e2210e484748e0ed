"""`troupe run opd`: distillation from a noisy teacher on a chain task, as an actor graph (§B).

Every arm (a method at a horizon) is a student: a rollout engine and a distillation learner.
They share the noisy teacher (`NoisyTeacher`) and the aggregation buffer (`DistillBuffer`).
One step of each arm, by its method's data (`config.METHODS`):

- ``offline`` (BC, clean-teacher BC, sequence KD): at step 0 the teacher writes the arm's
  whole budget of trajectories into the buffer; every step fits ``offline_updates_per_step``
  draws (more than the others take: its data is paid for, so it is fitted toward convergence);
- ``online`` (GKD, sampled reverse KL): the student samples (T=1) a fresh batch of chains,
  the teacher scores every position, the learner fits that batch;
- ``dagger`` (NE-OPD): the student rolls in greedily, the teacher's targets at every visited
  position join the arm's aggregated data set, the learner fits draws from it.

Then the learner's weights go to the arm's engine. With ``run.staleness = k > 0`` an online
or DAgger arm rolls in the chains of its next steps while it updates, on the weights that
update starts from (at most k updates old; ``<arm>/staleness`` per step). Evaluation samples
every arm's held-out chains greedily and at T=1 and checks them against the clean answer,
step by step.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from troupe.actors.distill_learner import DistillLearner
from troupe.actors.sampling import SamplingConfig
from troupe.algorithms.lookahead import RolloutRequest
from troupe.algorithms.opd import analysis
from troupe.algorithms.opd.buffer import DistillBuffer
from troupe.algorithms.opd.config import METHODS, OPDConfig
from troupe.algorithms.opd.kernels import mode_margin_of
from troupe.algorithms.opd.noise import votes_needed
from troupe.algorithms.opd.teacher import NoisyTeacher
from troupe.algorithms.policy_graph import PolicyGraph, step_seed
from troupe.algorithms.sft import prepare_policy
from troupe.envs.chain import ChainMixture, ChainTask, answer_length, chain_exact, step_correct
from troupe.platform.algorithm import Algorithm, Report
from troupe.platform.checkpoint import atomic_write_json
from troupe.platform.config import to_dict
from troupe.platform.errors import ConfigError
from troupe.platform.placement import ActorGraph, Role
from troupe.platform.run import RunContext

SHARED = ("loss/distill", "entropy", "agree/teacher_mode")  # summed over learner ranks


class OPD(Algorithm):
    Config = OPDConfig
    summary_line = "distillation from a noisy teacher on chains of growing horizon: BC, OPD and NE-OPD"
    generates_ahead = True  # run.staleness > 0: rollout_at, start_ahead and confirm_ahead

    def __init__(self, config: OPDConfig, ctx: RunContext) -> None:
        super().__init__(config, ctx)
        c = config
        self.tasks = {h: ChainTask(dataclasses.replace(c.task, horizon=h)) for h in c.opd.horizons}
        self.eval_rows = {h: t.eval_rows(c.eval.num_prompts) for h, t in self.tasks.items()}
        self.arms = c.arms()
        self.policies: dict[str, PolicyGraph] = {}
        self.m_votes: dict[int, int] = {}
        self.teacher_path = config.teacher.path

    # -- the graph --------------------------------------------------------------------------
    def prepare(self) -> dict[str, Any]:
        """The student every arm starts from (the embedded model untrained, or ``model.path``)."""
        c = self.config
        facts: dict[str, Any] = {}
        # One tokenizer for the student and an embedded teacher: both read the same corpus.
        mixture = ChainMixture([self.tasks[h] for h in sorted(c.opd.horizons)])
        prepare_policy(c.model, mixture, mixture.cache_key(), facts)
        self.teacher_path = c.teacher.path
        if c.teacher.path == "tiny":
            teacher: dict[str, Any] = {}
            model = dataclasses.replace(c.teacher.model, path="tiny")
            prepare_policy(model, mixture, mixture.cache_key(), teacher)
            self.teacher_path = teacher["model_path"]
            facts["teacher"] = teacher
        # run.staleness > 0: an arm rolls in no further ahead than its teacher budget lasts.
        self.policies = {arm: PolicyGraph(dataclasses.replace(c, learner=c.arm_learner(method)), facts["model_path"],
                                          prefix=f"{arm}_", shared_roles=False, learner_cls=DistillLearner,
                                          num_steps=c.query_steps(h))
                         for arm, method, h in self.arms}
        vocab = self.check_teacher(facts["model_path"])
        self.m_votes = {h: self.votes(h, vocab) for h in c.opd.horizons}
        facts["votes"] = {str(h): m for h, m in self.m_votes.items()}
        facts["budget"] = {h: c.budget(h) for h in c.opd.horizons}
        return facts

    def check_teacher(self, student_path: str) -> int:
        """What the teacher actor would refuse, refused in the driver before any actor starts;
        returns the student's vocabulary size."""
        from troupe.actors.models import load_tokenizer
        from troupe.algorithms.opd.kernels import answer_ids
        from troupe.algorithms.opd.teacher import check_same_vocabulary

        t = self.config.teacher
        student = load_tokenizer(student_path)
        for key, k in (("teacher.noise.top_k", t.noise.top_k if t.noise.kernel == "topk" else 0),
                       ("teacher.top_k", t.top_k)):
            if k > len(student):
                raise ConfigError(f"{key}={k} is larger than the vocabulary ({len(student)} tokens)")
        answer_ids(student, t.noise.answer_tokens)
        if self.teacher_path != "program":
            check_same_vocabulary(student, load_tokenizer(self.teacher_path), student_path, self.teacher_path)
        return len(student)

    def votes(self, horizon: int, vocab: int) -> int:
        """m of sample access: ``teacher.votes``, or §B.2's Hoeffding number at the kernel's margin."""
        t = self.config.teacher
        if t.votes:
            return t.votes
        return votes_needed(mode_margin_of(t.noise, vocab), vocab, horizon + 1, t.delta)

    def roles(self) -> list[Role]:
        c = self.config
        t = c.teacher
        path = next(iter(self.policies.values())).model_path
        roles = [Role("teacher", NoisyTeacher, num_cpus=t.num_cpus, num_gpus=t.num_gpus, max_restarts=t.max_restarts,
                      kwargs={"expert": self.teacher_path, "student_path": path, "noise": to_dict(t.noise),
                              "device": t.device, "dtype": t.dtype, "top_k": t.top_k}),
                 Role("buffer", DistillBuffer, num_cpus=0.1, kwargs={"capacity": c.opd.buffer_capacity})]
        return roles + [role for p in self.policies.values() for role in p.roles()]

    def setup(self, graph: ActorGraph) -> None:
        super().setup(graph)
        for p in self.policies.values():
            p.setup(graph)

    def _sampling(self, temperature: float, horizon: int, explore: float = 0.0) -> SamplingConfig:
        """The rollout's sampling at ``temperature``, with room for one answer and its end token
        (an answer can be no longer, and a student that never stops costs no more). ``explore``:
        ε-greedy, the argmax with probability 1 − ε, else a draw at ``temperature`` (1 if 0)."""
        if explore:
            temperature = temperature or 1.0
        return dataclasses.replace(self.config.rollout.sampling, temperature=temperature, explore=explore,
                                   max_new_tokens=self.max_tokens(horizon))

    def max_tokens(self, horizon: int) -> int:
        return answer_length(self.config.task.kind, horizon) + 1

    # -- the loop ---------------------------------------------------------------------------
    def rollin_request(self, arm: str, method: str, horizon: int, step: int) -> RolloutRequest:
        """What an online arm rolls in at ``step``: its own prompts, at T=1 (sampled roll-in) or
        at the roll-in temperature with ε-exploration; unscored (the teacher scores it)."""
        c = self.config
        rows = self.tasks[horizon].train_rows(c.opd.prompts_per_step,
                                              np.random.default_rng(step_seed(c.run.seed, step, f"rows/{arm}")))
        sampling = (self._sampling(1.0, horizon) if METHODS[method].roll == "sample"
                    else self._sampling(c.opd.roll_temperature, horizon, c.opd.explore))
        return RolloutRequest([r["prompt"] for r in rows], rows, sampling, step_seed(c.run.seed, step, f"roll/{arm}"),
                              score=False)

    def step(self, step: int) -> dict[str, float]:
        c = self.config
        teacher, buffer = self.graph["teacher"][0], self.graph["buffer"][0]
        rollouts = {}
        for arm, method, h in self.arms:  # every arm's roll-in first: the engines work at once
            if METHODS[method].data != "offline" and step < c.query_steps(h):
                # With run.staleness > 0 this roll-in was started while an earlier step updated.
                rollouts[arm] = self.policies[arm].rollout_at(step, lambda s, a=arm, m=method, hh=h:
                                                              self.rollin_request(a, m, hh, s))
        updates = {}
        for arm, method, h in self.arms:
            m = METHODS[method]
            learners = self.policies[arm].role("learner").handles
            if m.data == "offline" and step == 0:
                rows = self.tasks[h].train_rows(c.trajectories(h), np.random.default_rng(step_seed(c.run.seed, 0, f"rows/{arm}")))
                temperature = c.opd.kd_temperature if m.roll == "kd" else 1.0
                traj = teacher.trajectories.remote(rows, temperature, self.max_tokens(h), arm, m.roll == "clean",
                                                   step_seed(c.run.seed, 0, f"teacher/{arm}"))
                buffer.add.remote(arm, traj)
            if m.data == "online" and arm not in rollouts:
                continue  # its budget is spent: nothing new to fit
            if arm in rollouts:
                batches = rollouts[arm].batches()
                if m.access == "votes":
                    draw = step_seed(c.run.seed, step, f"teacher/{arm}")
                    scored = teacher.votes.remote(batches, self.m_votes[h], arm, draw)
                else:
                    scored = teacher.distributions.remote(batches, arm)
                if m.data == "dagger":
                    buffer.add.remote(arm, scored, m.loss == "hard")
            refs = []
            for u in range(c.updates_per_step(method)):
                if m.data == "online":
                    data = scored
                else:
                    data = buffer.sample.remote(arm, c.opd.batch_size, step_seed(c.run.seed, step, f"draw/{arm}/{u}"))
                if m.loss == "sampled_rkl":
                    refs = [lr.sampled_rkl.remote(data) for lr in learners]
                else:
                    beta = m.beta if m.beta is not None else c.opd.jsd_beta
                    refs = [lr.distill.remote(data, m.loss, {"beta": beta} if m.loss == "jsd" else {})
                            for lr in learners]
            updates[arm] = refs  # the last update's metrics; the earlier ones are queued before it
            if arm in rollouts:
                self.policies[arm].start_ahead()  # the next roll-ins run beside this update
        metrics: dict[str, float] = {}
        for arm, method, _ in self.arms:
            if arm not in updates:
                continue
            policy = self.policies[arm]
            per_rank = policy.role("learner").wait(updates[arm], "update")
            shares = METHODS[method].loss != "sampled_rkl"  # distill returns each rank's share of the batch
            for k in per_rank[0]:
                values = [r[k] for r in per_rank]
                metrics[f"{arm}/{k}"] = float(sum(values) if shares and k in SHARED else np.mean(values))
            if arm in rollouts:
                metrics.update({f"{arm}/{k}": v for k, v in policy.confirm_ahead().items()})
            policy.sync_weights()
        usage = self.graph["teacher"].wait([teacher.usage.remote()], "usage")[0]
        metrics.update({f"{arm}/teacher_tokens": float(usage.get(arm, 0)) for arm, _, _ in self.arms})
        return metrics

    # -- evaluation -------------------------------------------------------------------------
    def evaluate(self, step: int) -> dict[str, float]:
        """Every arm's held-out success at greedy and T=1 decoding, and its per-step agreement
        with the clean answer; the noisy teacher's own success at T=1 beside them."""
        import ray

        c = self.config
        pending = {}
        for arm, _, h in self.arms:
            rows = self.eval_rows[h]
            for mode, temperature in (("greedy", 0.0), ("t1", 1.0)):
                pending[arm, mode] = self.policies[arm].rollout(
                    [r["prompt"] for r in rows], rows, self._sampling(temperature, h),
                    step_seed(c.run.seed, step, f"eval/{arm}/{mode}"), score=False)
        teacher = self.graph["teacher"][0]
        own = {h: teacher.trajectories.remote(self.eval_rows[h], 1.0, self.max_tokens(h), "eval",
                                              seed=step_seed(c.run.seed, step, f"teacher/eval/{h}"))
               for h in c.opd.horizons}
        clean = {h: teacher.trajectories.remote(self.eval_rows[h], 0.0, self.max_tokens(h), "eval", True)
                 for h in c.opd.horizons}
        out: dict[str, float] = {}
        record: dict[str, Any] = {"step": step, "arms": {}, "teacher_t1": {}, "teacher_clean_greedy": {},
                                  "prompts": {str(h): [r["prompt"] for r in rows] for h, rows in self.eval_rows.items()}}
        for (arm, mode), rollout in pending.items():
            texts = [t for b in ray.get(rollout.batches()) for t in b["completion"]]
            h = dict((a, hh) for a, _, hh in self.arms)[arm]
            success, steps = score_texts(texts, self.eval_rows[h])
            record["arms"].setdefault(arm, {})[mode] = {"success": success, "steps": steps}
            out[f"{arm}/{mode}"] = float(np.mean(success))
            out[f"{arm}/{mode}_steps"] = float(np.mean(steps))
        for h, ref in own.items():
            success, _ = score_texts(ray.get(ref)["completion"], self.eval_rows[h])
            record["teacher_t1"][str(h)] = success
            out[f"teacher_h{h}/t1"] = float(np.mean(success))
            success, _ = score_texts(ray.get(clean[h])["completion"], self.eval_rows[h])
            record["teacher_clean_greedy"][str(h)] = success
            out[f"teacher_h{h}/clean_greedy"] = float(np.mean(success))
        atomic_write_json(self.ctx.artifact("eval.json"), record)
        return out

    # -- state ------------------------------------------------------------------------------
    def save(self, ckpt_dir: Path) -> None:
        for arm, p in self.policies.items():
            (ckpt_dir / arm).mkdir(parents=True, exist_ok=True)
            p.save(ckpt_dir / arm)
        self.graph["buffer"].wait([self.graph["buffer"][0].save.remote(str(ckpt_dir / "buffer"))], "save")
        teacher = self.graph["teacher"]
        state = teacher.wait([teacher[0].get_state.remote()], "get_state")[0]
        atomic_write_json(ckpt_dir / "teacher.json", state)

    def load(self, ckpt_dir: Path) -> None:
        for arm, p in self.policies.items():
            p.load(ckpt_dir / arm)
        self.graph["buffer"].wait([self.graph["buffer"][0].load.remote(str(ckpt_dir / "buffer"))], "load")
        teacher = self.graph["teacher"]
        teacher.wait([teacher[0].set_state.remote(json.loads((ckpt_dir / "teacher.json").read_text()))], "set_state")

    @classmethod
    def report(cls, config: OPDConfig, run: RunContext, history: list[dict[str, Any]]) -> Report:
        path = run.artifact("eval.json")
        if not path.is_file():
            return Report({}, ["## OPD\n\nNo evaluation ran."])
        record = json.loads(path.read_text())
        usage = {arm: row[f"{arm}/teacher_tokens"] for row in history for arm, _, _ in config.arms()
                 if f"{arm}/teacher_tokens" in row}
        tab = analysis.table(config, record, usage, history)
        plots = analysis.plots(config, tab, run.plots_dir)
        summary = {"table": tab, "claims": analysis.claims(config, tab)}
        return Report(summary, analysis.sections(config, tab, summary["claims"], run.prepared(), plots))


def score_texts(texts: list[str], rows: list[dict]) -> tuple[list[float], list[float]]:
    """Per prompt: 1 when the chain is exactly right, and the share of its steps that are."""
    success = [chain_exact(t, r["steps"]) for t, r in zip(texts, rows, strict=True)]
    steps = [float(np.mean(step_correct(t, r["steps"]))) for t, r in zip(texts, rows, strict=True)]
    return success, steps
