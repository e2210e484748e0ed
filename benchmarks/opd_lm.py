"""The language-model part of the OPD benchmark (`python benchmarks/opd.py --parts lm`).

§B's comparison where a user runs it: ``troupe run opd`` (student rollout engines, the noisy
teacher, the DAgger buffer, distillation learners) once per seed and horizon, every method's
arm in one graph from one student and one teacher-token budget. Per method and H: held-out
success greedy and at T=1 (mean over seeds; 95% intervals by resampling the prompts within each
seed), per-step agreement with the clean expert, teacher tokens used, and the teacher tokens
spent by the first evaluation at which greedy success reached 0.9 ("examples needed").
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

METHODS = ("bc", "clean_bc", "seq_kd", "gkd_fkl", "gkd_rkl", "gkd_jsd", "tm_opd", "ne_opd_hard", "ne_opd_tl",
           "ne_opd_rkl", "ne_opd_vote")
HORIZONS = (4, 8, 16, 32)
TARGET = 0.9


def add_args(ap: Any) -> None:
    ap.add_argument("--lm-seeds", type=int, default=3,
                    help="seeds of the LM sweep (one `troupe run opd` per seed and H)")
    ap.add_argument("--lm-horizons", default=",".join(map(str, HORIZONS)), help="comma list of H")
    ap.add_argument("--lm-methods", default=",".join(METHODS), help="comma list of methods")
    ap.add_argument("--lm-override", action="append", default=[], help="a key=value for every run")
    ap.add_argument("--lm-kept-only", action="store_true",
                    help="read the finished runs under --lm-runs and run none (a seed and H not there is left out)")
    ap.add_argument("--lm-runs", help="keep the runs' directories here (default: a temporary folder); a run "
                                      "already finished there with the same settings is read, not run again")
    ap.add_argument("--lm-merge", action="store_true",
                    help="keep the horizons of the last lm section of opd.json that are not run now (its seeds, "
                         "methods and overrides must be these): a new H joins a sweep whose run folders are gone")


def _interval(per_seed: list[list[float]], resamples: int = 1000, seed: int = 0) -> dict[str, float]:
    """Mean over seeds of each seed's success rate, with a 95% interval from resampling the
    prompts within every seed."""
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(v, dtype=float) for v in per_seed]
    boot = np.mean([a[rng.integers(0, len(a), (resamples, len(a)))].mean(1) for a in arrays], axis=0)
    return {"mean": float(np.mean([a.mean() for a in arrays])), "lo": float(np.quantile(boot, 0.025)),
            "hi": float(np.quantile(boot, 0.975))}


def _finished(out: Path, overrides: list[str]) -> bool:
    """Whether ``out`` holds a finished run of these overrides (``--lm-runs`` makes a sweep resumable)."""
    done = out / "overrides.json"
    return (out / "summary.json").is_file() and done.is_file() and json.loads(done.read_text()) == overrides


def run(args: Any) -> dict:
    from troupe import Run
    from troupe.algorithms.opd.analysis import tokens_to_target

    seeds = list(range(args.lm_seeds))
    horizons = [int(h) for h in args.lm_horizons.split(",")]
    methods = args.lm_methods.split(",")
    raw: dict[str, dict[str, dict[str, list]]] = {}
    runs: list[dict] = []
    missing: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="opd-lm-") as work:
        root = Path(args.lm_runs or work)
        for seed in seeds:
            for h in horizons:
                t0 = time.perf_counter()
                out = root / f"seed{seed}-h{h}"
                over = ["run.progress=false", f"run.seed={seed}", f"opd.horizons=[{h}]",
                        f"opd.methods=[{','.join(methods)}]", *args.lm_override]
                if getattr(args, "lm_kept_only", False) and not _finished(out, over):
                    missing.append({"seed": seed, "horizon": h})
                    continue
                if not _finished(out, over):  # a kept run with these settings is read, not run again
                    shutil.rmtree(out, ignore_errors=True)
                    with Run("opd", overrides=over, out=out) as r:
                        r.run()
                    (out / "overrides.json").write_text(json.dumps(over))
                record = json.loads((out / "eval.json").read_text())
                history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
                # The run's own span (its config written first, its summary last): right for a kept run too.
                wall = (out / "summary.json").stat().st_mtime - (out / "config.yaml").stat().st_mtime
                runs.append({"seed": seed, "horizon": h, "wall_s": round(wall, 1),
                             "reused": time.perf_counter() - t0 < 0.5 * wall})
                for m in methods:
                    arm = f"{m}_h{h}"
                    cell = raw.setdefault(m, {}).setdefault(str(h), {"greedy": [], "t1": [], "steps": [],
                                                                      "tokens": [], "to_target": []})
                    got = record["arms"][arm]
                    cell["greedy"].append(got["greedy"]["success"])
                    cell["t1"].append(got["t1"]["success"])
                    cell["steps"].append(float(np.mean(got["greedy"]["steps"])))
                    cell["tokens"].append(max(r.get(f"{arm}/teacher_tokens", 0.0) for r in history))
                    cell["to_target"].append(tokens_to_target(history, arm, TARGET))
                teacher = raw.setdefault("teacher", {}).setdefault(str(h), {"t1": []})
                teacher["t1"].append(record["teacher_t1"][str(h)])
    # Per-seed means beside the intervals: resampling prompts within seeds says nothing of how
    # far apart the seeds' runs land.
    summary = {m: {h: {"seeds": len(c["greedy"]), "greedy": _interval(c["greedy"]), "t1": _interval(c["t1"]),
                       "greedy_per_seed": [float(np.mean(v)) for v in c["greedy"]],
                       "t1_per_seed": [float(np.mean(v)) for v in c["t1"]],
                       "steps_greedy": float(np.mean(c["steps"])), "teacher_tokens": float(np.mean(c["tokens"])),
                       "tokens_to_greedy_0.9": c["to_target"]}
                   for h, c in per_h.items()} for m, per_h in raw.items() if m != "teacher"}
    summary["teacher"] = {h: {"t1": _interval(c["t1"])} for h, c in raw.get("teacher", {}).items()}
    horizons = [h for h in horizons if str(h) in summary.get("teacher", {})]
    result = {"seeds": seeds, "horizons": horizons, "methods": methods, "overrides": args.lm_override,
              "runs": runs, "missing": missing, "summary": summary}
    if getattr(args, "lm_merge", False):
        result = merge(_previous(args), result)
    return result


def _previous(args: Any) -> dict:
    """The lm section of the opd.json this run will replace ({} when there is none)."""
    path = Path(args.out) / "opd.json"
    return json.loads(path.read_text()).get("lm", {}) if path.exists() else {}


def merge(previous: dict, new: dict) -> dict:
    """``new`` with the horizons of ``previous`` it did not run. A horizon's cells depend on its own
    runs only, so they carry over as they are, provided both sweeps ran the same seeds, methods and
    overrides; otherwise the intervals would pool unlike runs, and the merge is refused."""
    if not previous:
        return new
    for key in ("seeds", "methods", "overrides"):
        if previous.get(key) != new[key]:
            raise SystemExit(f"opd.py --lm-merge: the kept lm section has {key}={previous.get(key)}, this sweep "
                             f"{new[key]}; run it with the same --lm-seeds, --lm-methods and --lm-override, "
                             "or without --lm-merge")
    kept = [h for h in previous["horizons"] if h not in new["horizons"]]
    old, now = previous["summary"], new["summary"]
    # horizons in increasing order, as the claims read them
    summary = {m: dict(sorted(({h: c for h, c in old.get(m, {}).items() if int(h) in kept} | now.get(m, {})).items(),
                              key=lambda kv: int(kv[0])))
               for m in [*now, *(m for m in old if m not in now)]}
    runs = [{**r, "kept_from_earlier_results": True} for r in previous["runs"] if r["horizon"] in kept] + new["runs"]
    return {**new, "horizons": sorted(kept + new["horizons"]), "runs": runs, "summary": summary}


def claims(result: dict) -> list[dict]:
    """§B's direction on the language model, judged on the sweep (issue: NE-OPD ≥ 0.9 greedy as H
    grows, BC and standard OPD falling with intervals apart at the largest H, BC at T=1 tracking
    the noisy teacher)."""
    s, hs = result["summary"], [str(h) for h in result["horizons"]]
    top = hs[-1]
    out = []
    ne = next((m for m in ("ne_opd_hard", "ne_opd_tl", "ne_opd_vote") if m in s), None)
    if ne:
        vals = [s[ne][h]["greedy"]["mean"] for h in hs]
        out.append({"claim": f"LM: {ne}'s greedy success stays >= 0.9 at every H",
                    "measured": ", ".join(f"H={h}: {v:.3f}" for h, v in zip(hs, vals, strict=True)),
                    "holds": bool(min(vals) >= TARGET)})
    for base in (m for m in ("bc", "tm_opd", "gkd_rkl", "gkd_fkl") if m in s):
        first, last = s[base][hs[0]]["greedy"], s[base][top]["greedy"]
        holds = len(hs) > 1 and last["mean"] < first["mean"]
        measured = f"H={hs[0]}: {first['mean']:.3f}, H={top}: {last['mean']:.3f}"
        if ne:
            best = s[ne][top]["greedy"]
            holds = holds and best["lo"] > last["hi"]
            measured += f"; at H={top} {ne} [{best['lo']:.3f}, {best['hi']:.3f}] vs [{last['lo']:.3f}, {last['hi']:.3f}]"
        out.append({"claim": f"LM: {base}'s greedy success falls as H grows, its interval below {ne}'s at H={top}",
                    "measured": measured, "holds": bool(holds)})
    if "bc" in s and "teacher" in s:
        parts, ok = [], True
        for h in hs:
            bc, t = s["bc"][h]["t1"], s["teacher"][h]["t1"]
            ok = ok and bc["lo"] <= t["hi"] and t["lo"] <= bc["hi"]
            parts.append(f"H={h}: BC {bc['mean']:.3f}, teacher {t['mean']:.3f}")
        out.append({"claim": "LM: at T=1 BC tracks the noisy teacher's own success (intervals overlap at every H)",
                    "measured": "; ".join(parts), "holds": bool(ok)})
    return out
