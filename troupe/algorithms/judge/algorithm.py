"""``judge``: BayesJudge (ALGORITHMS.md §G) over streams of conflicting human and LLM pairwise judgments.

The graph is ``workers.count`` aggregator actors (`JudgeAggregator`), each owning a share of the
streams, and, with ``lm.enabled``, ``lm.num_judges`` LLM judge actors (`LLMJudge`). The streams
are §G.6's synthetic benchmark (``streams.seeds`` streams per order-bias condition), the user's
JSONL streams (``streams.files``) and the LM judge's stream: comparisons of the word task
(`word_task`) judged in both presentation orders by a tiny LM fitted in `prepare`, each with
simulated expert and crowd labels.

One `step` advances every stream by a chunk of its arrivals (1/run.steps of them): the
aggregators filter theirs while the judges answer this step's chunk of LM comparisons, which
then join the LM stream. `evaluate` scores every stream (§G.5's metrics, the baselines of §G.4
beside BayesJudge) and runs the SMC-vs-exact check on small streams; it writes
``judge/results.json``, from which `report` builds the summary, the claims table and the plots.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from troupe.actors.judge import JudgeCall, LLMJudge
from troupe.algorithms.judge import report as judge_report
from troupe.algorithms.judge.aggregator import JudgeAggregator, StreamSpec
from troupe.algorithms.judge.config import JudgeConfig
from troupe.algorithms.judge.evaluation import true_group_signatures
from troupe.algorithms.judge.model import VERDICTS, Comparison, HumanLabel, JudgePair, encode_stream
from troupe.algorithms.judge.word_task import TextComparison, WordComparisons
from troupe.algorithms.sft import prepare_policy
from troupe.envs.judge_streams import confusion, load_stream_jsonl
from troupe.platform.algorithm import Algorithm, Report
from troupe.platform.checkpoint import atomic_write_json, atomic_write_text
from troupe.platform.config import to_dict
from troupe.platform.errors import ConfigError, DataError
from troupe.platform.placement import ActorGraph, Role
from troupe.platform.run import RunContext

log = logging.getLogger("troupe")

RESULTS = "judge/results.json"
LM_LOGS = "judge/lm"  # one file per step: the judge's answers and the labels of that step's comparisons
LM_STREAM = "lm/words"


class Judge(Algorithm):
    Config = JudgeConfig
    summary_line = "BayesJudge: online Bayesian aggregation of human and LLM pairwise judgments (SMC over streams)"
    progress_metrics = ("accuracy/online", "lm/unparsed")

    def __init__(self, config: JudgeConfig, ctx: RunContext) -> None:
        super().__init__(config, ctx)
        c = config
        self.prior = c.prior.model()
        self.specs: list[StreamSpec] = []
        for s in c.synthetic_streams():
            self.specs.append(StreamSpec(s["name"], "synthetic", seed=s["seed"], true_beta=s["beta_ord"],
                                         synthetic=c.streams.synthetic(c.raters, s["beta_ord"], s["seed"]),
                                         meta={"condition": f"beta_ord={s['beta_ord']:g}"}))
        for k, path in enumerate(c.streams.files):
            self.specs.append(self._file_spec(path, k))
        self.task = WordComparisons(c.lm.task, c.lm.template)
        self.lm_items: list[TextComparison] = []
        self.lm_truth_theta: dict[str, np.ndarray] = {}
        self.roster: list[tuple[str, str]] = []
        if c.lm.enabled:
            self.lm_items = self.task.comparisons(c.lm.comparisons, seed=c.run.seed, prefix="lm")
            self.roster, self.lm_truth_theta = lm_raters(c, np.random.default_rng([c.run.seed, 7]))
            groups = [g for _, g in self.roster]
            theta = np.stack([self.lm_truth_theta[r] for r, _ in self.roster])
            self.specs.append(StreamSpec(LM_STREAM, "lm", seed=c.run.seed, roster=tuple(self.roster),
                                         true_theta={r: v.tolist() for r, v in self.lm_truth_theta.items()},
                                         true_pi=list(c.lm.task.pi),
                                         meta={"condition": "lm", "true_groups": true_group_signatures(
                                             np.asarray(c.lm.task.pi), theta, groups)}))
        self.n_workers = min(c.workers.count, len(self.specs))
        self.owner = {s.name: k % self.n_workers for k, s in enumerate(self.specs)}
        self.judge_path: str | None = None
        self.lm_done = 0  # LM comparisons judged and sent

    def _file_spec(self, path: str, k: int) -> StreamSpec:
        """A user's stream, read and checked here: bad input fails before any actor starts."""
        key = f"streams.files[{k}]"
        if not Path(path).is_file():
            raise ConfigError(f"{key}={path!r}: no such file (a JSONL stream, one comparison per line)")
        try:
            data = load_stream_jsonl(path)
            encode_stream(data.comparisons, self.config.prior.judge_model, self.config.streams.require_groups)
        except DataError as e:
            raise DataError(f"{key}: {e}") from None
        return StreamSpec(f"file/{Path(path).stem}", "file", seed=self.config.run.seed + 1000 + k,
                          comparisons=data.comparisons, truth=data.truth, meta={"condition": "file", "path": path})

    # -- the graph --------------------------------------------------------------------------
    def prepare(self) -> dict[str, Any]:
        """The LM judge's SFT checkpoint on the word task (from the cache when it exists)."""
        if not self.config.lm.enabled:
            return {}
        info: dict[str, Any] = {}
        key = {"task": to_dict(self.config.lm.task), "template": self.config.lm.template, "role": "judge", "v": 1}
        self.judge_path = str(prepare_policy(self.config.lm.model, self.task, key, info))
        return {"judge": info}

    def roles(self) -> list[Role]:
        c = self.config
        roles = [Role("aggregator", JudgeAggregator, count=self.n_workers, num_cpus=c.workers.num_cpus,
                      kwargs={"prior": self.prior, "inference": c.smc, "judge_model": c.prior.judge_model,
                              "require_groups": c.streams.require_groups})]
        if c.lm.enabled:
            m = c.lm.model
            roles.append(Role("judge", LLMJudge, count=c.lm.num_judges, num_cpus=c.lm.num_cpus,
                              kwargs={"path": self.judge_path, "dtype": m.dtype, "device": m.device,
                                      "batch_size": c.lm.batch_size, "min_mass": c.lm.min_mass,
                                      "template": c.lm.template, "seed": c.run.seed}))
        return roles

    def setup(self, graph: ActorGraph) -> None:
        super().setup(graph)
        shares = [[s for s in self.specs if self.owner[s.name] == k] for k in range(self.n_workers)]
        graph["aggregator"].call_each("attach", [(share,) for share in shares])

    # -- the loop -----------------------------------------------------------------------------
    def step(self, step: int) -> dict[str, float]:
        aggs = self.graph["aggregator"]
        steps = self.config.run.steps
        refs = [h.advance.remote(step, steps) for h in aggs.handles]  # filters run while the judges answer
        lm_metrics = self._judge_chunk(step) if self.config.lm.enabled else {}
        progress = [row for rows in aggs.wait(refs, "advance") for row in rows]
        if self.config.lm.enabled:
            progress.append(self._send_lm(step))
        metrics: dict[str, float] = {"events": float(sum(p["events"] for p in progress)), **lm_metrics}
        accs = [p["online_accuracy"] for p in progress if np.isfinite(p["online_accuracy"])]
        if accs:
            metrics["accuracy/online"] = float(np.mean(accs))
        for cond in sorted({p["condition"] for p in progress if p["condition"]}):
            rows = [p for p in progress if p["condition"] == cond]
            ess = [p["ess_min"] for p in rows if np.isfinite(p["ess_min"])]
            acc = [p["online_accuracy"] for p in rows if np.isfinite(p["online_accuracy"])]
            if acc:
                metrics[f"accuracy/online/{cond}"] = float(np.mean(acc))
            if ess:
                metrics[f"ess_min/{cond}"] = float(min(ess))
        metrics["time/filter_s"] = float(sum(p["seconds"] for p in progress))
        return metrics

    def _chunk(self, step: int) -> list[TextComparison]:
        n, steps = len(self.lm_items), self.config.run.steps
        return self.lm_items[round(step * n / steps): round((step + 1) * n / steps)]

    def _judge_chunk(self, step: int) -> dict[str, float]:
        """The judges answer this step's LM comparisons in both orders; the answers and the
        simulated labels are logged (one file per step) before they join the stream."""
        items = self._chunk(step)
        judges = self.graph["judge"]
        parts = [items[k:: len(judges)] for k in range(len(judges))]
        answers = judges.call_each("compare", [([c.prompt for c in p], [c.a for c in p], [c.b for c in p])
                                               for p in parts])
        calls: dict[str, JudgeCall] = {c.id: a for p, ans in zip(parts, answers, strict=True)
                                       for c, a in zip(p, ans, strict=True)}
        records = [lm_record(c, calls[c.id], self.config, self.roster, self.lm_truth_theta) for c in items]
        text = "".join(json.dumps(r) + "\n" for r in records)
        atomic_write_text(self.ctx.artifact(f"{LM_LOGS}/step-{step:05d}.jsonl"), text)
        unparsed = sum((r["pair"][0] is None) + (r["pair"][1] is None) for r in records)
        return {"lm/comparisons": float(len(records)), "lm/unparsed": float(unparsed)}

    def _send_lm(self, step: int) -> dict[str, Any]:
        records = read_lm_log(self.ctx.run_dir / LM_LOGS / f"step-{step:05d}.jsonl")
        comps, truth = lm_comparisons(records)
        agg = self.graph["aggregator"][self.owner[LM_STREAM]]
        out = self.graph["aggregator"].wait([agg.extend.remote(LM_STREAM, comps, truth)], "extend")[0]
        self.lm_done += len(records)
        return out

    def evaluate(self, step: int) -> dict[str, float]:
        """Score every stream so far, check SMC against the exact posterior on small streams, and
        write the results the report is built from."""
        aggs = self.graph["aggregator"]
        streams = [row for rows in aggs.call("results") for row in rows]
        exact = self._exact_check()
        judge_stats = self.graph["judge"].call("stats") if self.config.lm.enabled else []
        results = judge_report.assemble(streams, exact, judge_stats, self.config, step)
        atomic_write_json(self.ctx.artifact(RESULTS), results)
        return judge_report.eval_metrics(results)

    def _exact_check(self) -> list[dict[str, Any]]:
        c = self.config.check
        if c.exact_streams == 0:
            return []
        specs = [(self.config.streams.synthetic(c.raters(), 0.15, self.config.run.seed + 500 + k, n=c.exact_n),
                  self.config.run.seed + k) for k in range(c.exact_streams)]
        aggs = self.graph["aggregator"]
        per = [specs[k:: len(aggs)] for k in range(len(aggs))]
        return [row for rows in aggs.call_each("check_exact", [(p,) for p in per]) for row in rows]

    # -- state ----------------------------------------------------------------------------------
    def save(self, ckpt_dir: Path) -> None:
        done: dict[str, int] = {}
        for d in self.graph["aggregator"].call("done"):
            done.update(d)
        atomic_write_json(ckpt_dir / "judge.json", {"done": done, "lm_done": self.lm_done,
                                                     "lm_steps": len(lm_log_files(self.ctx.run_dir / LM_LOGS))})

    def load(self, ckpt_dir: Path) -> None:
        """Drop the LM logs of steps after the checkpoint (they run again) and replay every
        stream's arrivals up to where the checkpoint had them."""
        state = json.loads((ckpt_dir / "judge.json").read_text())
        files = lm_log_files(self.ctx.run_dir / LM_LOGS)
        for path in files[state["lm_steps"]:]:
            path.unlink()
        records = [r for path in files[: state["lm_steps"]] for r in read_lm_log(path)]
        self.lm_done = state["lm_done"]
        if len(records) != self.lm_done:
            raise ConfigError(f"checkpoint {ckpt_dir}: {self.lm_done} LM comparisons were sent but the logs under "
                              f"{LM_LOGS} hold {len(records)}; the run directory is incomplete")
        grown = {LM_STREAM: lm_comparisons(records)} if self.config.lm.enabled else {}
        args = []
        for k in range(self.n_workers):
            mine = {n: d for n, d in state["done"].items() if self.owner.get(n) == k}
            args.append((mine, {n: g for n, g in grown.items() if self.owner[n] == k}))
        self.graph["aggregator"].call_each("replay", args)

    # -- the run directory ------------------------------------------------------------------------
    @classmethod
    def report(cls, config: JudgeConfig, run: RunContext, history: list[dict[str, Any]]) -> Report:
        path = run.run_dir / RESULTS
        if not path.is_file():
            return Report({}, ["## BayesJudge result\n\nNo results: the run scored no stream."])
        results = json.loads(path.read_text())
        plots = judge_report.write_plots(results, run.plots_dir)
        return Report(judge_report.summary(results), judge_report.sections(results, config, run.prepared(), plots))


# -- the LM judge's stream -------------------------------------------------------------------------
def lm_raters(config: JudgeConfig, rng: np.random.Generator) -> tuple[list[tuple[str, str]], dict[str, np.ndarray]]:
    """The LM stream's simulated raters, (name, group) in roster order, and each one's true Θ rows."""
    r = config.raters
    roster, theta = [], {}
    for group, n, diag, tie in (("expert", r.n_experts, r.expert_diag, r.expert_tie),
                                ("crowd", r.n_crowd, r.crowd_diag, r.crowd_tie)):
        rows = confusion(diag, tie)
        for k in range(n):
            name = f"{group}{k}"
            roster.append((name, group))
            theta[name] = rows if r.concentration is None else np.stack(
                [rng.dirichlet(r.concentration * row + 1e-6) for row in rows])
    return roster, theta


def read_answer(q: np.ndarray | None, how: str, rng: np.random.Generator) -> str | None:
    """One order's content-space verdict from the judge's letter distribution (None: unparsed)."""
    if q is None:
        return None
    k = int(rng.choice(3, p=q / q.sum())) if how == "sample" else int(np.argmax(q))
    return VERDICTS[k]


def lm_record(item: TextComparison, call: JudgeCall, config: JudgeConfig, roster: list[tuple[str, str]],
              theta: dict[str, np.ndarray]) -> dict[str, Any]:
    """One LM comparison as logged: the judge's two distributions and read verdicts, and the
    simulated human labels (drawn from the raters' true rows given the comparison's verdict)."""
    seed, k = config.run.seed, int(item.id.removeprefix("lm"))
    rng = np.random.default_rng([seed, k, 1])
    pair = [read_answer(call.ab, config.lm.answer, rng), read_answer(call.ba, config.lm.answer, rng)]
    rng = np.random.default_rng([seed, k, 2])
    r = config.raters
    experts = [n for n, g in roster if g == "expert"]
    crowd = [n for n, g in roster if g == "crowd"]
    who = [experts[i] for i in rng.choice(len(experts), r.experts_per_item, replace=False)] + \
          [crowd[i] for i in rng.choice(len(crowd), r.crowd_per_item, replace=False)]
    group = dict(roster)
    labels = [[name, VERDICTS[int(rng.choice(3, p=theta[name][item.verdict]))], group[name]] for name in sorted(who)]
    return {"id": item.id, "prompt": item.prompt, "a": item.a, "b": item.b, "truth": VERDICTS[item.verdict],
            "q_ab": None if call.ab is None else [float(x) for x in call.ab],
            "q_ba": None if call.ba is None else [float(x) for x in call.ba],
            "text_ab": call.text_ab, "text_ba": call.text_ba, "pair": pair, "labels": labels}


def lm_comparisons(records: list[dict[str, Any]]) -> tuple[list[Comparison], dict[str, str]]:
    """Logged LM records as stream arrivals, and their truth."""
    comps = [Comparison(r["id"], tuple(HumanLabel(n, lab, g) for n, lab, g in r["labels"]), JudgePair(*r["pair"]),
                        (r["a"], r["b"])) for r in records]
    return comps, {r["id"]: r["truth"] for r in records}


def lm_log_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("step-*.jsonl")) if folder.is_dir() else []


def read_lm_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]
