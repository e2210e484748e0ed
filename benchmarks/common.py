"""What the runtime benchmarks share: the two benchmark models, the batch, interleaved timing of
the arms of a comparison, the raw in-process baselines, the table and the result file.

Every comparison runs its arms side by side in one process tree, one call at a time and in a
rotating order, so that a noisy shared machine slows every arm alike; figures are medians
with min–max over the rounds, ratios are ratios of medians, and paired ratios (the median of
the per-round ratios) follow the load of the moment less.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).parent / "results"
NEW_TOKENS = 32
PROMPTS_PER_STEP = 8
GROUP_SIZE = 8
RAY_CPUS = 4  # logical CPUs of the private local cluster; roles ask for fractions of them
_LOAD_AT_START = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3


@dataclasses.dataclass
class BenchModel:
    """A saved benchmark model: its size label, directory and parameter count."""

    name: str
    path: str
    parameters: int


def model_specs() -> dict[str, Any]:
    """The two sizes: troupe's default tiny model and a 4M-parameter one (same tokenizer)."""
    from troupe.actors.models import TinyLMSpec

    return {
        "150k": TinyLMSpec(),
        "4M": TinyLMSpec(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=1024),
    }


def build_models(root: str | Path, sizes: Sequence[str] = ("150k", "4M"), seed: int = 0) -> dict[str, BenchModel]:
    """Build, and save under ``root``, an untrained model per size that always samples exactly
    `NEW_TOKENS` tokens.

    The length is forced in the model's own generation config (EOS is suppressed until
    `NEW_TOKENS` are out, the pad token always), so that every arm of a comparison, troupe's
    rollout actor, a raw ``generate`` and TRL alike, does the same work."""
    from troupe.actors.models import build_tiny_lm, count_parameters, save_model, train_tokenizer
    from troupe.envs.arithmetic import ArithmeticTask

    specs = model_specs()
    tokenizer = train_tokenizer(ArithmeticTask().corpus(4000, seed=seed), specs["150k"].vocab_size)
    out = {}
    for name in sizes:
        model = build_tiny_lm(specs[name], tokenizer, seed=seed)
        model.generation_config.min_new_tokens = NEW_TOKENS
        model.generation_config.suppress_tokens = [tokenizer.pad_token_id]
        path = Path(root) / name
        save_model(model, tokenizer, path)
        out[name] = BenchModel(name, str(path), count_parameters(model))
    return out


def bench_rows(seed: int = 0, n: int = PROMPTS_PER_STEP) -> list[dict]:
    """``n`` arithmetic training rows ``{"prompt", "answer"}``."""
    from troupe.envs.arithmetic import ArithmeticTask

    return ArithmeticTask().sample(n, "train", np.random.default_rng(seed))


def grouped_prompts(rows: list[dict], group_size: int = GROUP_SIZE) -> tuple[list[str], list[dict]]:
    """Each row repeated ``group_size`` times (one GRPO group per prompt)."""
    from troupe.algorithms.policy_graph import group_rows

    prompts, rep, _ = group_rows(rows, group_size)
    return prompts, rep


def sampling() -> Any:
    """Temperature-1 sampling of `NEW_TOKENS` tokens, no stop strings."""
    from troupe.actors.sampling import SamplingConfig

    return SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=NEW_TOKENS)


def add_size_arguments(ap: Any, repeats: dict[str, int] | int, warmup: int = 1) -> None:
    """The arguments every size-sweeping benchmark takes: ``--sizes``, ``--repeats``, ``--warmup``."""
    per = (", ".join(f"{n} at {s}" for s, n in repeats.items()) if isinstance(repeats, dict) else str(repeats))
    ap.add_argument("--sizes", nargs="+", default=["150k", "4M"], choices=["150k", "4M"])
    ap.add_argument("--repeats", type=int, default=None, help=f"timed rounds per size (default: {per})")
    ap.add_argument("--warmup", type=int, default=warmup)
    ap.add_argument("--result-name", default=None,
                    help="write results/NAME.json instead of the benchmark's own name (a run under another setting)")


def repeats_for(size: str, override: int | None, repeats: dict[str, int] | int) -> int:
    """Timed rounds at ``size``: ``--repeats`` if given, else the benchmark's default."""
    if override is not None:
        return override
    return repeats[size] if isinstance(repeats, dict) else repeats


def per_size(label: str, sizes: Sequence[str], threads: int, bench: Callable[[BenchModel], dict]) -> dict:
    """Start the private cluster, build the models, and run ``bench`` on each size in turn."""
    import tempfile

    set_threads(threads)
    init_ray()
    results = {}
    with tempfile.TemporaryDirectory(prefix="troupe-bench-") as tmp:
        models = build_models(tmp, sizes)
        for name in sizes:
            print(f"{label}, {name} ({models[name].parameters:,} parameters)", flush=True)
            results[name] = bench(models[name])
    return results


def set_threads(n: int) -> int:
    """Give this process's torch ``n`` threads (what an actor with ``num_cpus=n`` gets)."""
    import torch

    torch.set_num_threads(n)
    return torch.get_num_threads()


def init_ray(num_cpus: int = RAY_CPUS) -> None:
    """A private local Ray cluster (never joins, or stops, a cluster someone else started)."""
    import ray

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Actors import benchmark modules by name when a class defined here is sent to them.
    here = str(Path(__file__).parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)


# -- timing ---------------------------------------------------------------------------------
def time_interleaved(arms: dict[str, Callable[[], float]], repeats: int, warmup: int = 1,
                     log: Callable[[str], None] | None = print) -> dict[str, list[float]]:
    """Run each arm ``warmup`` times untimed, then ``repeats`` rounds of one call per arm, the
    order rotating each round. An arm returns the seconds it measured."""
    names = list(arms)
    for _ in range(warmup):
        for name in names:
            arms[name]()
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            samples[name].append(float(arms[name]()))
        if log:
            log(f"  round {r + 1}/{repeats}: " + ", ".join(f"{n} {samples[n][-1]:.3f}s" for n in names))
    return samples


def timed(fn: Callable[[], Any]) -> Callable[[], float]:
    """An arm that times ``fn`` with a monotonic clock."""

    def arm() -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    return arm


def stats(samples: Sequence[float]) -> dict[str, Any]:
    """Median, min and max of a list of measurements (and the measurements)."""
    return {"median": float(statistics.median(samples)), "min": float(min(samples)), "max": float(max(samples)),
            "n": len(samples), "samples": [float(s) for s in samples]}


def rate_stats(work: float, seconds: Sequence[float]) -> dict[str, Any]:
    """`stats` of ``work / seconds`` (e.g. tokens/s from per-call seconds)."""
    return stats([work / s for s in seconds])


def ratio(numerator: dict[str, Any], denominator: dict[str, Any]) -> float:
    """Ratio of medians."""
    return float(numerator["median"] / denominator["median"])


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> dict[str, Any]:
    """`stats` of the per-round ratios: arms measured in the same round share the machine's
    load of that moment, so these drift less than a ratio of medians on a busy machine."""
    return stats([a / b for a, b in zip(numerator, denominator, strict=True)])


# -- raw in-process baselines ----------------------------------------------------------------
def encode_prompts(tokenizer: Any, prompts: list[str]) -> dict[str, Any]:
    """Chat-formatted, left-padded prompt ids, exactly as troupe's HF rollout engine encodes them."""
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                           add_generation_prompt=True) for p in prompts]
    return dict(tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False))


def raw_generate(model: Any, tokenizer: Any, enc: dict[str, Any], sampling_cfg: Any) -> Any:
    """A plain ``model.generate`` of the encoded batch: the sampled ids ``[B, P + C]``."""
    import torch

    with torch.no_grad():
        return model.generate(**enc, max_new_tokens=sampling_cfg.max_new_tokens, do_sample=True,
                              temperature=sampling_cfg.temperature, top_p=sampling_cfg.top_p, top_k=0,
                              pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)


def positions(mask: Any) -> Any:
    """Position ids of left-padded rows (0 at the first real token)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def token_logprobs(model: Any, prompt_ids: Any, prompt_mask: Any, completion_ids: Any,
                   completion_mask: Any) -> Any:
    """log π(completion token | prefix) ``[B, C]`` from one forward pass."""
    import torch

    ids = torch.cat([prompt_ids, completion_ids], 1)
    mask = torch.cat([prompt_mask, completion_mask], 1)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=False).logits
    logits = logits[:, prompt_ids.shape[1] - 1: -1].float()
    return torch.log_softmax(logits, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


def raw_update(model: Any, optimizer: Any, batch: dict[str, Any], advantages: Any, clip: float = 0.2,
               grad_clip: float = 1.0) -> float:
    """One raw torch GRPO step: forward, PPO-clip loss with GRPO aggregation (mean over each
    sequence's tokens, then over sequences), backward, gradient clipping, AdamW step.

    Without ``batch["logprobs"]`` the step is on-policy: π_old is this forward pass, detached."""
    import torch

    mask = batch["completion_mask"].float()
    logp = token_logprobs(model, batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"],
                          batch["completion_mask"])
    old = batch.get("logprobs")
    ratio_ = torch.exp(logp - (logp.detach() if old is None else old))
    adv = advantages.unsqueeze(-1)
    per_token = -torch.min(ratio_ * adv, ratio_.clamp(1 - clip, 1 + clip) * adv)
    loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return float(loss.detach())


def adamw(model: Any, lr: float = 5e-4, betas: tuple[float, float] = (0.9, 0.99)) -> Any:
    """AdamW with troupe's learner defaults."""
    import torch

    return torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=0.0)


def load_model(path: str) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a saved benchmark model, in this process."""
    from troupe.actors.models import load_causal_lm

    return load_causal_lm(path)


# -- output ------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    """Where the figures were measured."""
    import torch

    from troupe.platform.placement import ALLOCATOR_ENV

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    # A busy shared machine is the main source of spread in these figures: say how busy it was.
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "torch": torch.__version__, "load_avg_1_5_15min_at_start": [round(x, 2) for x in _LOAD_AT_START],
            # troupe's actors always run with ALLOCATOR_ENV; the in-process arms with this process's own
            "driver_allocator_env": {k: os.environ[k] for k in ALLOCATOR_ENV if k in os.environ},
            "load_avg_1_5_15min_at_end": [round(x, 2) for x in load]}


def fmt_stats(s: dict[str, Any], digits: int = 3) -> str:
    """``median [min–max]``."""
    return f"{s['median']:.{digits}g} [{s['min']:.{digits}g}–{s['max']:.{digits}g}]"


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A plain-text table with columns as wide as their widest cell."""
    cells = [list(map(str, header))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    for i, r in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


# The figure each runtime goal is judged on, by the goal's text in a size's result.
GOAL_FIGURES = {
    "actor/generate >= 0.95": "ratio_actor_vs_generate",
    "raw_s/actor_s >= 0.95": "ratio_raw_vs_actor",
    "troupe_s/numpy_s <= 1.5": "ratio_troupe_vs_numpy",
    "troupe <= 1.1 x limit": "ratio_troupe_vs_limit",
    "troupe faster than trl": "ratio_troupe_vs_trl",
    "outside share < 0.1": "outside_share",
    "async <= 0.75 x limit": "ratio_async_vs_limit",
    "async <= 0.75 x trl": "ratio_async_vs_trl",
}


def runtime_claims(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """One ``{claim, measured, holds}`` per goal and size (and pass, for grpo's whole-machine
    pass): the goals each runtime benchmark already judges, as the top-level claims list."""
    claims = []
    for section, label in (("sizes", ""), ("whole_machine", "whole machine, ")):
        for size, r in (payload.get(section) or {}).items():
            goals = r.get("goals") or ({r["goal"]: r["goal_met"]} if "goal" in r else {})
            for goal, holds in goals.items():
                measured = r.get(GOAL_FIGURES.get(goal, ""))
                if isinstance(measured, dict):  # a figure with its spread: the claim is on the median
                    measured = measured.get("median")
                claims.append({"claim": f"{label}{size}: {goal}", "measured": measured, "holds": bool(holds)})
    return claims


def write_result(name: str, payload: dict[str, Any]) -> Path:
    """Write ``benchmarks/results/<name>.json`` atomically (with the machine it ran on); a
    payload without its own ``claims`` gets the runtime goals as claims."""
    from troupe.platform.checkpoint import atomic_write_json

    path = RESULTS / f"{name}.json"
    claims = payload.get("claims", runtime_claims(payload))
    atomic_write_json(path, {"benchmark": name, "machine": machine(), **payload, "claims": claims})
    print(f"wrote {path}")
    return path


# -- the half of an algorithm benchmark that runs `troupe run <algorithm>` once per seed ---------------
def add_run_args(ap: Any, algorithm: str, default_seeds: int = 3) -> None:
    """The ``--lm-seeds``, ``--lm-override`` and ``--lm-runs`` options of that half."""
    ap.add_argument("--lm-seeds", type=int, default=default_seeds,
                    help=f"runs of `troupe run {algorithm}` (0 skips them)")
    ap.add_argument("--lm-override", action="append", default=[], help="a key=value for every run")
    ap.add_argument("--lm-runs", help="keep the runs' directories here (default: a temporary folder)")


def add_run_half(result: dict, args: Any, run_seeds: Callable[[list[int], list[str], Path], dict],
                 run_claims: Callable[[dict], list[dict]], prefix: str) -> None:
    """Run ``run_seeds(seeds, overrides, workdir)`` as ``args`` say, into ``result["lm_task"]``, and
    add its claims to ``result["claims"]``."""
    import tempfile

    if not args.lm_seeds:
        result["lm_task"] = "not run (--lm-seeds 0)"
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as work:
        result["lm_task"] = run_seeds(list(range(args.lm_seeds)), args.lm_override, Path(args.lm_runs or work))
    result["claims"] += run_claims(result["lm_task"])
