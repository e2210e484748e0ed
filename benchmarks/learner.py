"""Benchmark: seconds per update through troupe's learner actor vs a raw in-process torch step,
and torch DDP with 2 ranks vs 1.

The batch is one GRPO batch (8 prompts × group 8, 32 sampled tokens) with fixed advantages.
Arms, timed interleaved:

- ``raw``: forward, PPO-clip loss with GRPO aggregation, backward, clipping, AdamW in this
  process (plain torch, ``torch.set_num_threads`` = the actor's threads): the limit;
- ``actor``: ``Learner.update`` as a Ray actor (1 rank), handed the batch as an object ref
  the way a step does;
- ``ddp2``: 2 learner ranks with torch DDP (gloo), each with the same threads as ``actor``.

Goal: raw_s / actor_s ≥ 0.95. Writes ``benchmarks/results/learner.json``.

    python benchmarks/learner.py
    python benchmarks/learner.py --sizes 150k --repeats 3
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import common

REPEATS = {"150k": 40, "4M": 7}  # timed rounds per size: more where a round is short
GOAL = 0.95


def make_batch(model: common.BenchModel, seed: int = 0) -> tuple[Any, Any]:
    """A GRPO batch sampled by troupe's engine (in this process) and fixed advantages."""
    import torch

    from troupe.actors.rollout_hf import HFRolloutEngine

    prompts, rows = common.grouped_prompts(common.bench_rows(seed))
    batch = HFRolloutEngine(model.path).generate(prompts, common.sampling(), rows, seed=seed)
    advantages = torch.randn(len(batch), generator=torch.Generator().manual_seed(seed))
    return batch, advantages


def learner_role(name: str, path: str, ranks: int, threads: int) -> Any:
    """A learner role with troupe's default learner config and ``ranks`` DDP ranks."""
    from troupe.actors.learner import Learner
    from troupe.platform.placement import Role

    return Role(name, Learner, count=ranks, num_cpus=threads,
                kwargs={"model_path": path, "config": {}, "world_size": ranks, "max_len": common.NEW_TOKENS},
                rank_kwargs=[{"rank": r} for r in range(ranks)])


def bench_size(model: common.BenchModel, threads: int, repeats: int, warmup: int) -> dict[str, Any]:
    """The three arms on one model size."""
    import ray

    from troupe.platform.placement import ActorGraph

    batch, advantages = make_batch(model)
    graph = ActorGraph([learner_role("one", model.path, 1, threads), learner_role("ddp2", model.path, 2, threads)],
                       timeout_s=300, call_timeout_s=600).start()
    try:
        ddp = graph["ddp2"]
        addr, port = ddp.wait([ddp[0].master_address.remote()], "master_address")[0]
        ddp.call("init_distributed", addr, port)
        batch_refs = [ray.put(batch)]  # a step hands the learner the rollout's object refs
        extras = {"advantages": advantages}

        raw_model, _ = common.load_model(model.path)
        raw_model.train()
        optimizer = common.adamw(raw_model)
        tensors = {k: batch[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "logprobs")}

        arms = {
            "raw": common.timed(lambda: common.raw_update(raw_model, optimizer, tensors, advantages)),
            "actor": common.timed(lambda: graph["one"].call("update", batch_refs, extras)),
            "ddp2": common.timed(lambda: ddp.call("update", batch_refs, extras)),
        }
        seconds = common.time_interleaved(arms, repeats, warmup)
    finally:
        graph.shutdown()
    s = {name: common.stats(v) for name, v in seconds.items()}
    return {
        "parameters": model.parameters,
        "batch": {"rows": len(batch), "prompt_tokens": int(batch["prompt_ids"].shape[1]),
                  "completion_tokens": int(batch["completion_ids"].shape[1])},
        "threads_per_rank": threads,
        "seconds_per_update": s,
        "ratio_raw_vs_actor": common.ratio(s["raw"], s["actor"]),
        "paired_ratio_raw_vs_actor": common.paired_ratio(seconds["raw"], seconds["actor"]),
        "speedup_ddp2_vs_1": common.ratio(s["actor"], s["ddp2"]),
        "paired_speedup_ddp2_vs_1": common.paired_ratio(seconds["actor"], seconds["ddp2"]),
        "goal": f"raw_s/actor_s >= {GOAL}",
        "goal_met": common.ratio(s["raw"], s["actor"]) >= GOAL,
    }



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_size_arguments(ap, REPEATS)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank and in the raw arm")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    results = common.per_size("learner", args.sizes, args.threads, lambda m: bench_size(
        m, args.threads, common.repeats_for(m.name, args.repeats, REPEATS), args.warmup))
    rows = []
    for name, r in results.items():
        s = r["seconds_per_update"]
        rows.append([name, f"{r['parameters']:,}", s["raw"]["n"], common.fmt_stats(s["raw"]),
                     common.fmt_stats(s["actor"]), f"{r['ratio_raw_vs_actor']:.3f}",
                     f"{r['paired_ratio_raw_vs_actor']['median']:.3f}", "yes" if r["goal_met"] else "no",
                     common.fmt_stats(s["ddp2"]), f"{r['speedup_ddp2_vs_1']:.2f}×"])
    common.print_table(
        f"learner seconds per update, median [min–max] over n rounds; {common.PROMPTS_PER_STEP}×{common.GROUP_SIZE} "
        f"rows, {common.NEW_TOKENS} tokens, {args.threads} thread(s) per rank",
        ["size", "params", "n", "raw", "actor", "raw/actor", "paired", f"≥ {GOAL}", "DDP 2 ranks", "DDP speedup"],
        rows)
    common.write_result(args.result_name or "learner", {"config": vars(args), "wall_s": round(time.perf_counter() - t0, 1),
                                    "sizes": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
