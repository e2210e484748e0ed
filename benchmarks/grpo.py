"""Benchmark: troupe's GRPO step vs the sequential in-process limit and vs TRL's GRPOTrainer.

Same model, tokenizer, batch (8 prompts × group 8), exactly 32 sampled tokens, float32, one
torch thread per process, no KL term. Arms, timed interleaved (one step of each per round):

- ``troupe``: ``troupe.Run("grpo").step()`` — rollout actor → reward actor → learner actor →
  weight sync to the engine; timed around the call, and split by the step's own
  ``time/*`` metrics;
- ``limit``: in this process, one ``generate``, the reward and advantages, one raw torch update
  on the same batch (on-policy, so π_old needs no extra pass);
- ``trl``: ``trl.GRPOTrainer`` on CPU (``use_vllm=False``, ``beta=0``, ``loss_type="grpo"``,
  gradient checkpointing and bf16 off, as troupe runs), one optimizer step per generation;
  a trainer callback times each step, from its start (before generation) to its end (after
  the optimizer step), and runs the other two arms between TRL's steps.

- ``troupe_async``: the same run with ``run.staleness=1``: step t's update overlaps the
  generation of step t+1 (on the weights the update starts from), so a step costs about
  max(update, generate) + sync instead of their sum. Nothing is in flight between two timed
  steps (the weight sync waits for the generation started ahead), so the other arms of a round
  run on an otherwise idle machine. The first step after warm-up already trains on a rollout
  generated ahead.

Goals: troupe ≤ 1.10 × limit, troupe faster than TRL, and under 10% of troupe's step outside
generation, scoring and update (1 − (generate + reward + update) / step); the async step
≤ 0.75 × the limit and ≤ 0.75 × TRL (on the whole machine at 4M).

Two passes. "1 thread per process" is the overhead comparison: troupe gets one engine and one
learner rank, each with one thread, and the in-process arms one thread. "Whole machine"
(``--processes N``, default 2) gives every arm the same N cores in the way each can use them:
troupe N engines and N DDP learner ranks of one thread each, the limit and TRL N torch threads.
That pass times five async layouts: ``troupe_async`` (N engines and N ranks, like the sync
arm), ``troupe_async_split`` (one engine and one rank of one thread each: generation on one
core while the update runs on the other), ``troupe_async_ranks`` (one engine beside N ranks),
and the first and last again with the engines at the lowest OS priority (``*_nice``,
``rollout.niceness=19``: generation takes only the cycles the ranks leave); the async goals
take the fastest. Each async figure comes with its bounds: max(generate,
update) + reward + sync of the sync arm's own parts, and, on the whole machine, the one-thread
work (generate + update) spread over N cores.

Then reward curves: GRPO on the SFT-trained default model (the task's own 8-token sampling),
3 seeds × 30 steps, sync and with ``run.staleness=1``: the async run's final reward should lie
within the seeds' spread of the sync run's. Writes ``benchmarks/results/grpo.json`` and
``benchmarks/results/grpo_reward_curves.png``.

    python benchmarks/grpo.py
    python benchmarks/grpo.py --sizes 150k --repeats 3 --curve-steps 10
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import common

REPEATS = {"150k": 40, "4M": 5}  # timed rounds per size: more where a round is short
LIMIT_GOAL = 1.10
OUTSIDE_GOAL = 0.10
ASYNC_GOAL = 0.75  # the async step against the sequential limit and against TRL's step
RAY_CPUS = 20  # logical: the six runs of the whole-machine pass hold 16.1 CPUs of bundles
NICE = 19  # the niced async layouts' engine priority: the lowest
LR = 5e-4  # troupe's learner default, used by every arm


def troupe_overrides(model_path: str | None, out: str, seed: int = 0, steps: int = 10_000,
                     processes: int = 1, staleness: int = 0, ranks: int | None = None, niceness: int = 0) -> list[str]:
    """A GRPO run of 8 prompts × 8 on ``model_path`` (None: the default SFT model and sampling),
    with ``processes`` rollout engines at OS priority ``niceness`` and ``ranks`` (default: as
    many) learner ranks of one thread each, generating ``staleness`` steps ahead of the update."""
    o = [f"run.out={out}", f"run.seed={seed}", f"run.steps={steps}", f"run.staleness={staleness}",
         f"rollout.niceness={niceness}",
         "run.eval_every=0", "run.checkpoint_every=0",
         "run.progress=false", f"grpo.prompts_per_step={common.PROMPTS_PER_STEP}",
         f"grpo.group_size={common.GROUP_SIZE}", f"learner.lr={LR}",
         f"rollout.num_engines={processes}", f"learner.num_ranks={ranks or processes}"]
    if model_path is not None:
        o += [f"model.path={model_path}", "model.sft.steps=0", f"rollout.sampling.max_new_tokens={common.NEW_TOKENS}",
              "rollout.sampling.temperature=1.0"]
    return o


class InProcessGRPO:
    """The sequential limit: one model in this process does a GRPO step with no Ray at all."""

    def __init__(self, model_path: str) -> None:
        self.model, self.tokenizer = common.load_model(model_path)
        self.optimizer = common.adamw(self.model, lr=LR)
        self.sampling = common.sampling()
        self.parts: list[dict[str, float]] = []  # per step: generate_s, reward_s, update_s

    def step(self, i: int) -> float:
        """One step on fresh prompts; returns its seconds."""
        import torch

        from troupe.actors.rollout_hf import completion_mask
        from troupe.algorithms.advantages import grpo_advantage
        from troupe.envs.arithmetic import arithmetic_exact

        t = time.perf_counter()
        rows = common.bench_rows(seed=1000 + i)
        prompts, rep = common.grouped_prompts(rows)
        enc = common.encode_prompts(self.tokenizer, prompts)
        self.model.eval()
        seqs = common.raw_generate(self.model, self.tokenizer, enc, self.sampling)
        t1 = time.perf_counter()
        completion = seqs[:, enc["input_ids"].shape[1]:]
        cmask = completion_mask(completion, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id)
        texts = self.tokenizer.batch_decode(completion, skip_special_tokens=True)
        rewards = torch.tensor([arithmetic_exact(c, r["answer"]) for c, r in zip(texts, rep, strict=True)])
        groups = torch.arange(len(rows)).repeat_interleave(common.GROUP_SIZE)
        advantages = grpo_advantage(rewards, groups)
        t2 = time.perf_counter()
        self.model.train()
        batch = {"prompt_ids": enc["input_ids"], "prompt_mask": enc["attention_mask"], "completion_ids": completion,
                 "completion_mask": cmask}
        common.raw_update(self.model, self.optimizer, batch, advantages)
        t3 = time.perf_counter()
        self.parts.append({"generate_s": t1 - t, "reward_s": t2 - t1, "update_s": t3 - t2})
        return t3 - t


def trl_trainer(model_path: str, out: str, steps: int, callback: Any) -> Any:
    """TRL's GRPOTrainer configured like troupe's run (see the module docstring)."""
    from datasets import Dataset
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer

    from troupe.envs.arithmetic import arithmetic_exact

    hf_logging.set_verbosity_error()
    model, tokenizer = common.load_model(model_path)
    rows = [r for i in range(steps) for r in common.bench_rows(seed=1000 + i)]
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]}
                              for r in rows])

    def exact(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [arithmetic_exact(t, a) for t, a in zip(texts, answer, strict=True)]

    args = GRPOConfig(
        output_dir=out, max_steps=steps, per_device_train_batch_size=common.PROMPTS_PER_STEP * common.GROUP_SIZE,
        num_generations=common.GROUP_SIZE, max_completion_length=common.NEW_TOKENS, temperature=1.0, top_p=1.0,
        top_k=0, generation_kwargs={"min_new_tokens": common.NEW_TOKENS, "suppress_tokens": [tokenizer.pad_token_id]},
        learning_rate=LR, adam_beta2=0.99, weight_decay=0.0, lr_scheduler_type="constant", warmup_steps=0,
        max_grad_norm=1.0, beta=0.0, epsilon=0.2, loss_type="grpo", scale_rewards="group", num_iterations=1,
        use_vllm=False, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        logging_steps=10**6, save_strategy="no", report_to="none", disable_tqdm=True, seed=0,
        dataloader_num_workers=0, log_completions=False,
    )
    return GRPOTrainer(model=model, reward_funcs=exact, args=args, train_dataset=data, processing_class=tokenizer,
                       callbacks=[callback])


def step_timer(between: Any) -> Any:
    """A trainer callback that times each optimizer step and calls ``between()`` after it."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self._t = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._t = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.seconds.append(time.perf_counter() - self._t)
            between()

    return StepTimer()


class Layout(NamedTuple):
    """One troupe arm of a pass."""

    engines: int
    learner_ranks: int
    staleness: int
    engine_niceness: int = 0


def troupe_layouts(processes: int) -> dict[str, Layout]:
    """The troupe arms of a pass, by name."""
    layouts = {"troupe": Layout(processes, processes, 0), "troupe_async": Layout(processes, processes, 1)}
    if processes > 1:
        layouts["troupe_async_split"] = Layout(1, 1, 1)  # one core generates while the other updates
        layouts["troupe_async_ranks"] = Layout(1, processes, 1)  # one engine beside every learner rank
        # The same two with engines at the lowest OS priority: generation ahead takes the
        # cycles the DDP ranks leave idle instead of slowing the update (the critical path).
        layouts["troupe_async_nice"] = Layout(processes, processes, 1, NICE)
        layouts["troupe_async_ranks_nice"] = Layout(1, processes, 1, NICE)
    return layouts


def async_figures(s: dict[str, dict], parts: dict[str, dict], async_arms: list[str], processes: int,
                  one_thread_work_s: float | None) -> dict[str, Any]:
    """The faster async arm's ratios, the goals on them, and the bounds overlap can reach."""
    best = min(async_arms, key=lambda a: s[a]["median"])
    med = {k: v["median"] for k, v in parts.items()}
    overlap_bound = max(med["generate_s"], med["update_s"]) + med["reward_s"] + med["sync_s"]
    out: dict[str, Any] = {
        "async_arm": best,
        "ratio_async_vs_limit": common.ratio(s[best], s["limit"]),
        "ratio_async_vs_trl": common.ratio(s[best], s["trl"]),
        "ratio_async_vs_sync": common.ratio(s[best], s["troupe"]),
        # The sync arm's own parts, overlapped perfectly (on this pass's threads).
        "overlap_bound_s": overlap_bound,
        "overlap_bound_vs_limit": overlap_bound / s["limit"]["median"],
    }
    if one_thread_work_s is not None and processes > 1:
        # No layout on N cores beats the one-thread CPU work spread evenly over them.
        out["work_bound_s"] = one_thread_work_s / processes
        out["work_bound_vs_limit"] = out["work_bound_s"] / s["limit"]["median"]
        out["work_bound_vs_trl"] = out["work_bound_s"] / s["trl"]["median"]
    return out


def bench_size(model: common.BenchModel, repeats: int, warmup: int, tmp: str, processes: int = 1,
               one_thread_work_s: float | None = None) -> dict[str, Any]:
    """The arms on one model size. ``processes`` > 1 is the whole-machine comparison: troupe
    spreads the step over that many engines and learner ranks (one thread each), and the limit
    and TRL run with that many torch threads. ``one_thread_work_s``: generate + update of the
    limit at one thread, for the whole-machine work bound."""
    import contextlib

    import torch

    from troupe.platform.driver import Run  # what `troupe.Run` resolves to

    threads = common.set_threads(processes)
    limit = InProcessGRPO(model.path)
    layouts = troupe_layouts(processes)
    wall: dict[str, list[float]] = {name: [] for name in layouts}
    metrics: dict[str, list[dict[str, Any]]] = {name: [] for name in layouts}
    limit_s: list[float] = []
    with contextlib.ExitStack() as stack:
        runs = {name: stack.enter_context(Run("grpo", overrides=troupe_overrides(
                    model.path, f"{tmp}/runs-{processes}-{name}", processes=lay.engines, ranks=lay.learner_ranks,
                    staleness=lay.staleness, niceness=lay.engine_niceness)))
                for name, lay in layouts.items()}
        rounds = iter(range(10**6))

        def troupe_arm(name: str) -> Any:
            def arm() -> None:
                t = time.perf_counter()
                m = runs[name].step()
                wall[name].append(time.perf_counter() - t)
                metrics[name].append(m)
            return arm

        def limit_step() -> None:
            limit_s.append(limit.step(len(limit_s)))

        arms = [troupe_arm(name) for name in layouts] + [limit_step]

        def between() -> None:
            # The other arms, in an order that rotates from one round to the next.
            r = next(rounds)
            for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
                arm()
            label = "warmup" if r < warmup else f"round {r + 1 - warmup}/{repeats}"
            print(f"  {label}: trl {timer.seconds[-1]:.3f}s, "
                  + ", ".join(f"{name} {wall[name][-1]:.3f}s" for name in layouts)
                  + f", limit {limit_s[-1]:.3f}s", flush=True)

        timer = step_timer(between)
        trainer = trl_trainer(model.path, f"{tmp}/trl-{processes}", warmup + repeats, timer)
        trainer.train()
        if torch.get_num_threads() != threads:
            raise RuntimeError(f"torch threads changed from {threads} to {torch.get_num_threads()} during the run")
        engine_threads = [i["threads"] for i in runs["troupe"].graph["rollout"].call("info")]
    keep = slice(warmup, None)
    m = metrics["troupe"][keep]
    parts = {k: common.stats([x[f"time/{k}"] for x in m]) for k in ("generate_s", "reward_s", "update_s", "sync_s",
                                                                      "step_s")}
    outside = [1 - (x["time/generate_s"] + x["time/reward_s"] + x["time/update_s"]) / x["time/step_s"] for x in m]
    outside_wall = [1 - (x["time/generate_s"] + x["time/reward_s"] + x["time/update_s"]) / w
                    for x, w in zip(m, wall["troupe"][keep], strict=True)]
    s = {name: common.stats(w[keep]) for name, w in wall.items()}
    s["limit"], s["trl"] = common.stats(limit_s[keep]), common.stats(timer.seconds[keep])
    async_arms = [name for name, lay in layouts.items() if lay.staleness > 0]
    asy = async_figures(s, parts, async_arms, processes, one_thread_work_s)
    vs_limit = common.ratio(s["troupe"], s["limit"])
    vs_trl = common.ratio(s["troupe"], s["trl"])
    out_share = statistics.median(outside)
    return {
        "parameters": model.parameters,
        "threads": {"driver_limit_trl": threads, "rollout_engines": engine_threads, "learner_ranks": processes},
        "layouts": {name: lay._asdict() for name, lay in layouts.items()},
        "seconds_per_step": s,
        "troupe_step_parts": parts,
        "async_step_parts": {name: {k: common.stats([x[f"time/{k}"] for x in metrics[name][keep]])
                                    for k in ("update_s", "sync_s", "ahead_wait_s", "step_s")}
                             for name in async_arms},
        "async_staleness": {name: common.stats([x["staleness"] for x in metrics[name][keep]]) for name in async_arms},
        "limit_step_parts": {k: common.stats([x[k] for x in limit.parts[keep]]) for k in limit.parts[0]},
        "outside_share": common.stats(outside),
        "outside_share_of_wall": common.stats(outside_wall),
        "ratio_troupe_vs_limit": vs_limit,
        "ratio_troupe_vs_trl": vs_trl,
        "paired_ratio_troupe_vs_limit": common.paired_ratio(wall["troupe"][keep], limit_s[keep]),
        "paired_ratio_troupe_vs_trl": common.paired_ratio(wall["troupe"][keep], timer.seconds[keep]),
        "paired_ratio_async_vs_limit": common.paired_ratio(wall[asy["async_arm"]][keep], limit_s[keep]),
        "paired_ratio_async_vs_trl": common.paired_ratio(wall[asy["async_arm"]][keep], timer.seconds[keep]),
        **asy,
        "goals": {f"troupe <= {LIMIT_GOAL} x limit": vs_limit <= LIMIT_GOAL, "troupe faster than trl": vs_trl < 1,
                  f"outside share < {OUTSIDE_GOAL}": out_share < OUTSIDE_GOAL,
                  f"async <= {ASYNC_GOAL} x limit": asy["ratio_async_vs_limit"] <= ASYNC_GOAL,
                  f"async <= {ASYNC_GOAL} x trl": asy["ratio_async_vs_trl"] <= ASYNC_GOAL},
    }


def reward_curves(seeds: list[int], steps: int, tmp: str, staleness: int = 0) -> dict[str, Any]:
    """reward/mean per step of short GRPO runs (default SFT model and sampling), one per seed."""
    from troupe.platform.driver import Run  # what `troupe.Run` resolves to

    curves = {}
    for seed in seeds:
        t = time.perf_counter()
        with Run("grpo", overrides=troupe_overrides(None, f"{tmp}/curves-{staleness}", seed=seed, steps=steps,
                                                    staleness=staleness)) as run:
            curve = [float(run.step()["reward/mean"]) for _ in range(steps)]
        curves[str(seed)] = curve
        print(f"  staleness {staleness}, seed {seed}: reward {curve[0]:.3f} → {curve[-1]:.3f} "
              f"({time.perf_counter() - t:.0f}s)", flush=True)
    k = max(1, steps // 10)
    return {"steps": steps, "staleness": staleness, "reward_mean_per_step": curves,
            "first_10pct": {s: statistics.mean(c[:k]) for s, c in curves.items()},
            "last_10pct": {s: statistics.mean(c[-k:]) for s, c in curves.items()}}


def final_reward(curves: dict[str, Any], last: float = 1 / 3) -> dict[str, float]:
    """Per seed, the mean reward of the last third of the steps (a tenth is 3 noisy steps here)."""
    k = max(1, round(len(next(iter(curves["reward_mean_per_step"].values()))) * last))
    return {s: statistics.mean(c[-k:]) for s, c in curves["reward_mean_per_step"].items()}


def curves_claim(sync: dict[str, Any], asy: dict[str, Any]) -> dict[str, Any]:
    """Async's final reward (mean over seeds) within the seeds' spread of sync's: the gap of the
    means is at most the larger range (max − min over seeds) of the two."""
    fs, fa = final_reward(sync), final_reward(asy)
    gap = statistics.mean(fa.values()) - statistics.mean(fs.values())
    spread = max(max(fs.values()) - min(fs.values()), max(fa.values()) - min(fa.values()))
    return {"claim": f"async (staleness 1) final reward within the seeds' spread of sync, {len(fs)} seeds",
            "measured": f"last-third reward, sync {statistics.mean(fs.values()):.3f} "
                        f"[{min(fs.values()):.3f}–{max(fs.values()):.3f}], async {statistics.mean(fa.values()):.3f} "
                        f"[{min(fa.values()):.3f}–{max(fa.values()):.3f}]; gap {gap:+.3f}, spread {spread:.3f}",
            "holds": abs(gap) <= spread}


def plot_curves(curves: dict[str, dict[str, list[float]]], path: Path) -> None:
    """Per mode (sync, async), one faint line per seed and their mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    for (mode, per_seed), colour in zip(curves.items(), ("tab:blue", "tab:orange"), strict=False):
        for c in per_seed.values():
            ax.plot(range(len(c)), c, color=colour, alpha=0.25, linewidth=1)
        mean = [statistics.mean(v) for v in zip(*per_seed.values(), strict=True)]
        ax.plot(range(len(mean)), mean, color=colour, linewidth=2, label=f"{mode}, mean of {len(per_seed)} seeds")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward/mean")
    ax.set_title("troupe GRPO, SFT-trained 150k model, 8 prompts × 8 (faint: seeds)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_size_arguments(ap, REPEATS)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--curve-steps", type=int, default=30)
    ap.add_argument("--processes", type=int, default=2,
                    help="the whole-machine pass: rollout engines and learner ranks for troupe, torch threads for "
                         "the limit and TRL (0 or 1: skip it)")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    common.init_ray(RAY_CPUS)
    results: dict[str, Any] = {}
    machine: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="troupe-bench-") as tmp:
        models = common.build_models(tmp, args.sizes)
        for name in args.sizes:
            print(f"grpo, {name} ({models[name].parameters:,} parameters), 1 thread per process", flush=True)
            results[name] = bench_size(models[name], common.repeats_for(name, args.repeats, REPEATS), args.warmup, tmp)
        if args.processes > 1:
            for name in args.sizes:
                print(f"grpo, {name}, whole machine: troupe {args.processes} engines + {args.processes} learner "
                      f"ranks, limit and TRL {args.processes} threads", flush=True)
                lp = results[name]["limit_step_parts"]
                machine[name] = bench_size(models[name], common.repeats_for(name, args.repeats, REPEATS),
                                           args.warmup, tmp, processes=args.processes,
                                           one_thread_work_s=lp["generate_s"]["median"] + lp["update_s"]["median"])
        common.set_threads(1)  # the reward curves: one thread per process again
        curves = curves_async = None
        if args.curve_steps:
            print(f"reward curves, seeds {args.seeds}, sync and staleness 1", flush=True)
            curves = reward_curves(args.seeds, args.curve_steps, tmp)
            curves_async = reward_curves(args.seeds, args.curve_steps, tmp, staleness=1)
    if curves:
        plot_curves({"sync": curves["reward_mean_per_step"], "async (staleness 1)": curves_async["reward_mean_per_step"]},
                    common.RESULTS / "grpo_reward_curves.png")
    for title, res in (("1 thread per process", results),
                       (f"whole machine ({args.processes} engines + ranks; {args.processes} threads)", machine)):
        if not res:
            continue
        rows = []
        for name, r in res.items():
            s, g = r["seconds_per_step"], r["goals"]
            rows.append([name, f"{r['parameters']:,}", s["troupe"]["n"], common.fmt_stats(s["troupe"]),
                         common.fmt_stats(s[r["async_arm"]]), common.fmt_stats(s["limit"]), common.fmt_stats(s["trl"]),
                         f"{r['ratio_troupe_vs_limit']:.3f}", f"{r['ratio_troupe_vs_trl']:.3f}",
                         f"{r['ratio_async_vs_limit']:.3f}", f"{r['ratio_async_vs_trl']:.3f}",
                         f"{r['outside_share']['median']:.1%}", "/".join("yes" if v else "no" for v in g.values())])
        common.print_table(
            f"GRPO seconds per step, median [min–max] over n rounds; {common.PROMPTS_PER_STEP}×{common.GROUP_SIZE} "
            f"rows, {common.NEW_TOKENS} tokens, {title}",
            ["size", "params", "n", "troupe", "async", "limit", "TRL", "troupe/limit", "troupe/TRL", "async/limit",
             "async/TRL", "outside", f"goals ≤{LIMIT_GOAL}/<TRL/<{OUTSIDE_GOAL:.0%}/async ≤{ASYNC_GOAL}×2"], rows)
    payload = {"config": vars(args), "wall_s": round(time.perf_counter() - t0, 1), "sizes": results,
               "whole_machine": machine, "reward_curves": curves, "reward_curves_async": curves_async}
    claims = common.runtime_claims(payload)
    if curves:
        claims.append(curves_claim(curves, curves_async))
        print("reward curves (first → last 10% of steps), sync:",
              {s: f"{curves['first_10pct'][s]:.3f} → {curves['last_10pct'][s]:.3f}" for s in curves["first_10pct"]},
              "async:", {s: f"{curves_async['first_10pct'][s]:.3f} → {curves_async['last_10pct'][s]:.3f}"
                         for s in curves_async["first_10pct"]})
        print(claims[-1]["measured"])
    common.write_result(args.result_name or "grpo", {**payload, "claims": claims})
    return 0


if __name__ == "__main__":
    sys.exit(main())
