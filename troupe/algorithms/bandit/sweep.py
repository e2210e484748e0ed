"""Sweeps: many learner–agent pairs, one per cell (policy × seed × B × T × d × k × instance).

A cell runs either in-process (`run_cell`) or on Ray as a learner actor (`CellLearner`) paired
with an agent actor (`troupe.actors.bandit_agent.BanditAgent`): the driver resets the agent and
keeps the report key, the learner plays the cell through a `RemoteChannel`, and the driver
then reads the regret with the key. `run_pairs` keeps every pair busy and bounds every wait.

Rewards are simulated pull by pull (``mode="exact"``) or, for Gaussian noise, as closed-form
block means (``mode="closed_form"``); both go through the same agent code.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from troupe.actors.bandit_agent import BanditAgent, LocalChannel, RemoteChannel
from troupe.algorithms.bandit.policies import POLICIES, PolicyParams
from troupe.envs.linear_bandit import LinearBanditEnv
from troupe.platform.config import from_dict, to_dict
from troupe.platform.errors import ConfigError, RemoteCallError
from troupe.platform.metrics import mean_se

# The agent resolves its environment by import path, so it needs no registry import of its own.
ENV_PATH = f"{LinearBanditEnv.__module__}:{LinearBanditEnv.__qualname__}"


@dataclasses.dataclass(frozen=True)
class Cell:
    """One learner–agent experiment."""

    policy: str
    seed: int
    batch: int
    horizon: int
    d: int
    k: int
    group: str = "main"  # "main" (§E.7 sweep) or "hypercube" (lower-bound instances)
    arms: str = "sphere"
    sigma: float = 1.0
    theta_norm: float = 1.0
    noise: str = "gaussian"
    path: str | None = None
    mode: str = "closed_form"
    gap: float | None = None  # hypercube: the smallest gap, fixed across k

    @property
    def effective_batch(self) -> int:
        """Unbatched baselines run with B = 1 whatever the sweep's B."""
        return self.batch if POLICIES[self.policy].batched else 1

    def env_kwargs(self) -> dict[str, Any]:
        return {"arms": self.arms, "d": self.d, "k": self.k, "theta_norm": self.theta_norm,
                "noise": self.noise, "sigma": self.sigma, "path": self.path, "instance_seed": self.seed,
                "gap": self.gap}

    def agent_kwargs(self) -> dict[str, Any]:
        return {"env": ENV_PATH, "env_kwargs": self.env_kwargs(), "batch_size": self.effective_batch,
                "horizon": self.horizon, "feedback": POLICIES[self.policy].feedback, "mode": self.mode,
                "seed": self.seed}


def check_grid(batches: Iterable[int], horizons: Iterable[int]) -> None:
    """Every B divides every T, or a `ConfigError` naming the pair and a fix."""
    for t in horizons:
        if t < 1:
            raise ConfigError(f"sweep horizon T={t}: expected an integer >= 1")
        for b in batches:
            if b < 1:
                raise ConfigError(f"sweep batch size B={b}: expected an integer >= 1")
            if t % b:
                raise ConfigError(f"batch size B={b} does not divide the horizon T={t}: the horizon is split "
                                  f"into T/B whole batches; use powers of two, e.g. T={2 ** math.ceil(math.log2(t))}")


def curve_grid(horizon: int, batch: int, points: int) -> np.ndarray:
    """Log-spaced pull counts from one batch to T (ends included)."""
    return np.unique(np.round(np.geomspace(max(batch, 1), horizon, points)).astype(np.int64))


def summarize_cell(cell: Cell, stats: dict[str, Any], report: dict[str, Any], points: int,
                   wall_s: float) -> dict[str, Any]:
    """A JSON-ready record of one cell: the regret, its curve, bits, and whether the best arm went."""
    grid = curve_grid(cell.horizon, cell.effective_batch, points)
    curve = np.interp(grid, report["events_t"], report["events_regret"])
    if report["pulls"] != cell.horizon or report["batches"] * cell.effective_batch != report["pulls"]:
        raise RuntimeError(f"cell {cell}: {report['pulls']} pulls in {report['batches']} batches, expected "
                           f"T={cell.horizon} (a learner must play exactly the horizon)")
    eliminated = None
    if POLICIES[cell.policy].eliminates:
        eliminated = report["best_arm"] not in stats["active"]
    return {**dataclasses.asdict(cell), "regret": float(report["regret"]), "pulls": int(report["pulls"]),
            "batches": int(report["batches"]), "bits": int(report["bits"]), "phases": int(stats["phases"]),
            "best_eliminated": eliminated, "committed_best": stats["commit_arm"] == report["best_arm"],
            "curve_t": grid.tolist(), "curve_regret": curve.tolist(), "wall_s": round(wall_s, 4)}


def make_policy(cell: Cell, params: PolicyParams):
    return POLICIES[cell.policy](params, sigma=cell.sigma, rng=np.random.default_rng([cell.seed, 0xB17]))


def run_cell(cell: Cell, params: PolicyParams, points: int = 48) -> dict[str, Any]:
    """Run one cell in this process: an agent, a channel to it, a learner."""
    t0 = time.perf_counter()
    agent = BanditAgent()
    key = agent.reset(**cell.agent_kwargs())
    stats = make_policy(cell, params).run(LocalChannel(agent))
    return summarize_cell(cell, stats, agent.report(key), points, time.perf_counter() - t0)


class CellLearner:
    """The learner role: plays a cell against an agent actor it reaches only through a channel."""

    def __init__(self, params: dict[str, Any] | None = None, call_timeout_s: float = 300.0) -> None:
        self.params = from_dict(PolicyParams, params or {})
        self.call_timeout_s = call_timeout_s

    def play(self, cell: Cell, agent: Any) -> tuple[dict[str, Any], float]:
        """Run the cell's policy to the horizon; returns its own record and the wall time."""
        t0 = time.perf_counter()
        stats = make_policy(cell, self.params).run(RemoteChannel(agent, self.call_timeout_s))
        return stats, time.perf_counter() - t0


def run_local(cells: list[Cell], params: PolicyParams, points: int = 48,
              on_result: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Every cell in this process, in order."""
    out = []
    for cell in cells:
        res = run_cell(cell, params, points)
        out.append(res)
        if on_result:
            on_result(res)
    return out


def run_pairs(cells: list[Cell], learners: list[Any], agents: list[Any], points: int = 48,
              timeout_s: float = 900.0) -> list[dict[str, Any]]:
    """Cells over ``len(learners)`` learner–agent actor pairs; results in the order of ``cells``.

    Each wait is bounded: a cell that runs past ``timeout_s`` raises `RemoteCallError` naming it.
    """
    import ray

    if len(learners) != len(agents) or not learners:
        raise ValueError(f"need as many agents as learners (got {len(learners)} and {len(agents)})")

    def get(ref: Any, what: str) -> Any:
        try:
            return ray.get(ref, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            raise RemoteCallError(f"{what} did not answer within {timeout_s:.0f}s") from e
        except ray.exceptions.RayTaskError as e:
            raise RemoteCallError(f"{what} failed: {e.cause!r}") from e.cause

    results: list[dict[str, Any] | None] = [None] * len(cells)
    todo = list(range(len(cells)))[::-1]
    running: dict[Any, tuple[int, int, str, float]] = {}  # ref -> (cell index, pair, key, deadline)

    def submit(pair: int) -> None:
        i = todo.pop()
        key = get(agents[pair].reset.remote(**cells[i].agent_kwargs()), f"agent {pair}.reset for {cells[i]}")
        ref = learners[pair].play.remote(cells[i], agents[pair])
        running[ref] = (i, pair, key, time.monotonic() + timeout_s)

    for pair in range(min(len(learners), len(todo))):
        submit(pair)
    while running:
        ready, _ = ray.wait(list(running), num_returns=1, timeout=min(10.0, timeout_s))
        now = time.monotonic()
        if not ready:
            late = [(i, p) for _, (i, p, _, dl) in running.items() if dl < now]
            if late:
                i, p = late[0]
                raise RemoteCallError(f"learner {p} did not finish cell {cells[i]} within {timeout_s:.0f}s "
                                      f"(raise run.call_timeout_s, or shrink the cell's horizon)")
            continue
        ref = ready[0]
        i, pair, key, _ = running.pop(ref)
        stats, wall = get(ref, f"learner {pair}.play for {cells[i]}")
        report = get(agents[pair].report.remote(key), f"agent {pair}.report")
        results[i] = summarize_cell(cells[i], stats, report, points, wall)
        if todo:
            submit(pair)
    return [r for r in results if r is not None]


# -- aggregation -----------------------------------------------------------------------

def loglog_slope(x: Iterable[float], y: Iterable[float]) -> tuple[float, float]:
    """Least-squares fit of ``log y = slope * log x + c``; returns ``(slope, c)`` (nan if < 2 points)."""
    xa, ya = np.asarray(list(x), dtype=float), np.asarray(list(y), dtype=float)
    ok = (xa > 0) & (ya > 0) & np.isfinite(xa) & np.isfinite(ya)
    if ok.sum() < 2 or np.unique(xa[ok]).size < 2:
        return math.nan, math.nan
    slope, c = np.polyfit(np.log(xa[ok]), np.log(ya[ok]), 1)
    return float(slope), float(c)


def group_results(results: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[tuple, list[dict[str, Any]]]:
    out: dict[tuple, list[dict[str, Any]]] = {}
    for r in results:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out


def mean_curve(rows: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """The seed-average regret curve of rows that share a grid."""
    t = np.asarray(rows[0]["curve_t"], dtype=float)
    return t, np.mean([r["curve_regret"] for r in rows], axis=0)


def curve_slope(t: np.ndarray, regret: np.ndarray, burn_in: float) -> float:
    """Log–log slope of a regret curve over ``t >= burn_in * T``."""
    keep = t >= burn_in * t[-1]
    return loglog_slope(t[keep], regret[keep])[0]


def params_dict(params: PolicyParams) -> dict[str, Any]:
    return to_dict(params)


def summarize_sweep(results: list[dict[str, Any]], burn_in: float = 1 / 64, small_factor: float = 3.0,
                    shape: tuple[int, int] | None = None) -> dict[str, Any]:
    """Figures of a finished sweep: regret tables, log–log slopes, the hypercube check, the claims.

    ``shape = (d, k)`` picks the instance size the tables report (default: the smallest).
    """
    main = [r for r in results if r["group"] == "main"]
    cube = [r for r in results if r["group"] == "hypercube"]
    out: dict[str, Any] = {"cells": len(results)}
    if main:
        out["main"] = _summarize_main(main, burn_in, shape)
    if cube:
        out["hypercube"] = _summarize_hypercube(cube)
    out["claims"] = _claims(out, small_factor)
    return out


def _summarize_main(rows: list[dict[str, Any]], burn_in: float, shape: tuple[int, int] | None) -> dict[str, Any]:
    t_max = max(r["horizon"] for r in rows)
    d0, k0 = shape if shape is not None else (min(r["d"] for r in rows), min(r["k"] for r in rows))
    at = [r for r in rows if r["horizon"] == t_max and r["d"] == d0 and r["k"] == k0]
    table = []
    unq = {b: mean_se(r["regret"] for r in g)[0]
           for (p, b), g in group_results(at, ("policy", "batch")).items() if p == "unquantised"}
    by_pb = group_results(at, ("policy", "batch"))
    for (p, b), g in sorted(by_pb.items()):
        m, se, n = mean_se(r["regret"] for r in g)
        elim = [r["best_eliminated"] for r in g if r["best_eliminated"] is not None]
        table.append({"policy": p, "B": b, "regret": m, "se": se, "n": n,
                      "bits": mean_se(r["bits"] for r in g)[0],
                      "best_eliminated_rate": float(np.mean(elim)) if elim else None,
                      "committed_best_rate": float(np.mean([r["committed_best"] for r in g])),
                      "ratio_to_unquantised": m / unq[b] if b in unq and unq[b] > 0 else None})
    policies = sorted({r["policy"] for r in at})
    slope_b, excess_b, curve_slope_, slope_t, local_t = {}, {}, {}, {}, {}
    for p in policies:
        pts = sorted((row["B"], row["regret"]) for row in table if row["policy"] == p)
        if len(pts) > 1:
            slope_b[p] = loglog_slope(*zip(*pts, strict=True))[0]
            ex = [(b, m - unq[b]) for b, m in pts if b in unq]
            if p != "unquantised" and len(ex) > 1:
                excess_b[p] = loglog_slope(*zip(*ex, strict=True))[0]
        curve_slope_[p] = {}
        for (pp, b), g in by_pb.items():
            if pp == p:
                t, reg = mean_curve(g)
                curve_slope_[p][str(b)] = curve_slope(t, reg, burn_in)
        slope_t[p], local_t[p] = {}, {}
        over_t = [r for r in rows if r["policy"] == p and r["d"] == d0 and r["k"] == k0
                  and r["horizon"] >= burn_in * t_max]
        for (b,), g in group_results(over_t, ("batch",)).items():
            pts_t = sorted((t, mean_se(r["regret"] for r in gt)[0])
                           for (t,), gt in group_results(g, ("horizon",)).items())
            if len(pts_t) > 1:
                slope_t[p][str(b)] = loglog_slope(*zip(*pts_t, strict=True))[0]
                # slope between consecutive horizons: where sqrt(T) holds and where it flattens
                local_t[p][str(b)] = [[t0, t1, loglog_slope([t0, t1], [r0, r1])[0]]
                                      for (t0, r0), (t1, r1) in zip(pts_t, pts_t[1:], strict=False)]
    out = {"T": t_max, "d": d0, "k": k0, "table": table, "slope_vs_B": slope_b,
           "excess_slope_vs_B": excess_b, "curve_slope_vs_t": curve_slope_, "slope_vs_T": slope_t,
           "local_slopes_vs_T": local_t}
    for dim, other, fixed in (("d", "k", k0), ("k", "d", d0)):
        sub = [r for r in rows if r["horizon"] == t_max and r[other] == fixed]
        vals = sorted({r[dim] for r in sub})
        if len(vals) > 1:
            slopes = {}
            for (p, b), g in group_results(sub, ("policy", "batch")).items():
                pts = sorted((v if dim == "d" else math.log(v), mean_se(r["regret"] for r in gv)[0])
                             for (v,), gv in group_results(g, (dim,)).items())
                if len(pts) > 1:
                    slopes[f"{p}@B{b}"] = loglog_slope(*zip(*pts, strict=True))[0]
            out[f"slope_vs_{'d' if dim == 'd' else 'log_k'}"] = slopes
    return out


def _summarize_hypercube(rows: list[dict[str, Any]]) -> dict[str, Any]:
    table, growth = [], {}
    for (p, b), g in sorted(group_results(rows, ("policy", "batch")).items()):
        per_m = []
        for (k,), gk in sorted(group_results(g, ("k",)).items()):
            m, se, n = mean_se(r["regret"] / b for r in gk)
            bits = mean_se(r["bits"] for r in gk)[0]
            log2_k = int(round(math.log2(k)))
            gap = gk[0].get("gap")
            table.append({"policy": p, "B": b, "log2_k": log2_k, "k": k, "regret_per_B": m, "se": se, "n": n,
                          "bits": bits, "lower_bound_per_B": None if gap is None else log2_k * gap / 2})
            per_m.append(m)
        ms = [row["log2_k"] for row in table if row["policy"] == p and row["B"] == b]
        growth[f"{p}@B{b}"] = {"increasing": bool(np.all(np.diff(per_m) > 0)),
                               "slope_vs_log_k": loglog_slope(ms, per_m)[0]}
    return {"table": table, "growth": growth}


def _claims(summary: dict[str, Any], small_factor: float) -> list[dict[str, Any]]:
    """Each §E claim with the figure measured for it and whether its direction reproduced."""
    claims: list[dict[str, Any]] = []
    main = summary.get("main")
    if main and any(POLICIES[r["policy"]].batched for r in main["table"]):
        rows = {(r["policy"], r["B"]): r for r in main["table"]}
        bs = sorted({b for p, b in rows if POLICIES[p].batched})
        if ("bitpe", bs[0]) in rows and rows[("bitpe", bs[0])]["ratio_to_unquantised"] is not None:
            ratio = rows[("bitpe", bs[0])]["ratio_to_unquantised"]
            claims.append({"claim": f"bitpe within a small factor (<= {small_factor:g}x) of unquantised at B={bs[0]}",
                           "measured": ratio, "reproduced": bool(ratio <= small_factor)})
        if "bitpe" in main["excess_slope_vs_B"]:
            s = main["excess_slope_vs_B"]["bitpe"]
            claims.append({"claim": "bitpe excess regret over unquantised grows about linearly in B "
                                    "(log-log slope in [0.6, 1.4])",
                           "measured": s, "reproduced": bool(0.6 <= s <= 1.4)})
        if ("bitpe", bs[-1]) in rows and ("bitpe_safe", bs[-1]) in rows and len(bs) > 1:
            a, b = rows[("bitpe_safe", bs[-1])]["regret"], rows[("bitpe", bs[-1])]["regret"]
            claims.append({"claim": f"bitpe_safe beats bitpe at the largest B={bs[-1]}",
                           "measured": a / b, "reproduced": bool(a < b)})
        sign = main["curve_slope_vs_t"].get("sign_bit", {})
        if sign:
            s = sign[str(bs[-1])]
            claims.append({"claim": f"sign bit regret is linear in t at B={bs[-1]} (curve slope >= 0.8)",
                           "measured": s, "reproduced": bool(s >= 0.8)})
        slope_t = main["slope_vs_T"].get("bitpe", {}).get(str(bs[0]))
        if slope_t is None:
            slope_t = main["curve_slope_vs_t"].get("bitpe", {}).get(str(bs[0]))
        if slope_t is not None and math.isfinite(slope_t):
            claims.append({"claim": f"bitpe regret vs T log-log slope near 1/2 after burn-in at B={bs[0]} "
                                    "(in [0.3, 0.7])",
                           "measured": slope_t, "reproduced": bool(0.3 <= slope_t <= 0.7)})
    cube = summary.get("hypercube")
    if cube:
        by_policy: dict[str, list[bool]] = {}
        for name, v in cube["growth"].items():
            by_policy.setdefault(name.split("@")[0], []).append(v["increasing"])
        for p, inc in sorted(by_policy.items()):
            claims.append({"claim": f"hypercube instances: {p} regret/B grows with log k at every B "
                                    "(measured: fraction of B where it does)",
                           "measured": float(np.mean(inc)), "reproduced": bool(all(inc))})
    return claims
