"""Benchmark: tokens/s through troupe's rollout actor vs an in-process ``generate``.

Same model, same 8 prompts × group 8 batch, exactly 32 sampled tokens per row, the same torch
thread count in every arm (the actor gets its threads from ``num_cpus``). Three arms, timed
interleaved:

- ``actor``: ``HFRolloutEngine.generate`` as a Ray actor, called and fetched by the driver
  (tokenising, sampling, log-probs of the sampled tokens, decoding, the Batch, Ray's round trip);
- ``engine``: the same class called in this process (no Ray), to split Ray's share from the
  engine's own post-processing;
- ``generate``: tokenising plus a plain ``model.generate`` in this process: the limit.

Goal: actor / generate ≥ 0.95. Writes ``benchmarks/results/rollout.json``.

    python benchmarks/rollout.py
    python benchmarks/rollout.py --sizes 150k --repeats 3
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import common

REPEATS = {"150k": 40, "4M": 7}  # timed rounds per size: more where a round is short
GOAL = 0.95


def bench_size(model: common.BenchModel, threads: int, repeats: int, warmup: int) -> dict[str, Any]:
    """The three arms on one model size."""
    import ray

    from troupe.actors.rollout_hf import HFRolloutEngine
    from troupe.platform.placement import ActorGraph, Role

    prompts, rows = common.grouped_prompts(common.bench_rows())
    sampling = common.sampling()
    work = len(prompts) * common.NEW_TOKENS
    graph = ActorGraph([Role("rollout", HFRolloutEngine, num_cpus=threads, kwargs={"model_path": model.path})],
                       timeout_s=300, call_timeout_s=600).start()
    try:
        engine = graph["rollout"][0]
        actor_threads = ray.get(engine.info.remote())["threads"]
        local_engine = HFRolloutEngine(model.path)  # the same class, in this process
        raw_model, tokenizer = common.load_model(model.path)
        raw_model.eval()
        seed = iter(range(10**6))
        counted: dict[str, list[int]] = {"actor": [], "engine": [], "generate": []}
        inside_actor: list[float] = []  # the engine's own clock: what Ray's round trip adds is the rest

        def actor() -> float:
            t = time.perf_counter()
            batch = ray.get(engine.generate.remote(prompts, sampling, rows, seed=next(seed)), timeout=600)
            dt = time.perf_counter() - t
            counted["actor"].append(int(batch["completion_mask"].sum()))
            inside_actor.append(float(batch.meta["gen_s"]))
            return dt

        def engine_in_process() -> float:
            t = time.perf_counter()
            batch = local_engine.generate(prompts, sampling, rows, seed=next(seed))
            dt = time.perf_counter() - t
            counted["engine"].append(int(batch["completion_mask"].sum()))
            return dt

        def generate() -> float:
            t = time.perf_counter()
            enc = common.encode_prompts(tokenizer, prompts)
            out = common.raw_generate(raw_model, tokenizer, enc, sampling)
            dt = time.perf_counter() - t
            counted["generate"].append(int(out.shape[0] * (out.shape[1] - enc["input_ids"].shape[1])))
            return dt

        seconds = common.time_interleaved({"actor": actor, "engine": engine_in_process, "generate": generate},
                                          repeats, warmup)
    finally:
        graph.shutdown()
    for name, counts in counted.items():
        # Every arm must have sampled the same number of tokens, or tokens/s compares unlike work.
        if set(counts) != {work}:
            raise RuntimeError(f"{name} sampled {sorted(set(counts))} tokens per call, expected {work}")
    arms = {name: {"seconds": common.stats(s), "tokens_per_s": common.rate_stats(work, s)}
            for name, s in seconds.items()}
    timed_rounds = slice(len(inside_actor) - len(seconds["actor"]), None)  # drop the warm-up calls
    ray_s = [w - g for w, g in zip(seconds["actor"], inside_actor[timed_rounds], strict=True)]
    ratio = common.ratio(arms["actor"]["tokens_per_s"], arms["generate"]["tokens_per_s"])
    return {
        "parameters": model.parameters,
        "batch": {"rows": len(prompts), "new_tokens": common.NEW_TOKENS, "tokens_per_call": work},
        "threads": {"actor": actor_threads, "in_process": threads},
        "arms": arms,
        "actor_seconds_inside_engine": common.stats(inside_actor[timed_rounds]),
        "actor_seconds_in_ray_round_trip": common.stats(ray_s),
        "ratio_actor_vs_generate": ratio,
        "ratio_engine_vs_generate": common.ratio(arms["engine"]["tokens_per_s"], arms["generate"]["tokens_per_s"]),
        # tokens/s ratio = inverse seconds ratio, round by round
        "paired_ratio_actor_vs_generate": common.paired_ratio(seconds["generate"], seconds["actor"]),
        "goal": f"actor/generate >= {GOAL}",
        "goal_met": ratio >= GOAL,
    }



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_size_arguments(ap, REPEATS)
    ap.add_argument("--threads", type=int, default=1, help="torch threads in every arm (the actor's num_cpus)")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    results = common.per_size("rollout", args.sizes, args.threads, lambda m: bench_size(
        m, args.threads, common.repeats_for(m.name, args.repeats, REPEATS), args.warmup))
    rows = []
    for name, r in results.items():
        a = r["arms"]
        rows.append([name, f"{r['parameters']:,}", a["actor"]["seconds"]["n"],
                     common.fmt_stats(a["actor"]["tokens_per_s"]), common.fmt_stats(a["engine"]["tokens_per_s"]),
                     common.fmt_stats(a["generate"]["tokens_per_s"]),
                     f"{r['ratio_actor_vs_generate']:.3f}", f"{r['paired_ratio_actor_vs_generate']['median']:.3f}",
                     f"{r['actor_seconds_in_ray_round_trip']['median'] * 1e3:.1f}", "yes" if r["goal_met"] else "no"])
    common.print_table(
        f"rollout tokens/s, median [min–max] over n rounds; {common.PROMPTS_PER_STEP}×{common.GROUP_SIZE} rows, "
        f"{common.NEW_TOKENS} tokens, {args.threads} thread(s)",
        ["size", "params", "n", "actor", "engine in-process", "generate", "actor/generate", "paired", "Ray ms",
         f"≥ {GOAL}"], rows)
    common.write_result(args.result_name or "rollout", {"config": vars(args), "wall_s": round(time.perf_counter() - t0, 1),
                                    "sizes": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
