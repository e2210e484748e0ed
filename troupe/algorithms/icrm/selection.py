"""Reading a reward model by what it selects (ALGORITHMS.md §C.4): best-of-N and its KL, the
over-optimisation curve, and the 2-objective Pareto front and hypervolume of demo mixing.

Pure functions of arrays: a (prompts, N) matrix of proxy scores and one of gold rewards in, mean
gold of the selections out. The benchmark and ``troupe run icrm`` both read their models through
them, so the two report the same quantities.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def best_of_n_kl(n: int | np.ndarray) -> np.ndarray:
    """KL(π_BoN ‖ π_0) of best-of-n sampling, the analytic log n − (n − 1)/n (§C.4)."""
    n = np.asarray(n, dtype=float)
    if np.any(n < 1):
        raise ValueError(f"best-of-n needs n >= 1, got {n.tolist()}")
    return np.log(n) - (n - 1) / n


def best_of_n(proxy: np.ndarray, gold: np.ndarray, ns: Sequence[int]) -> np.ndarray:
    """Mean over rows of the gold reward of each row's argmax-proxy candidate among its first n,
    for every n in ``ns``. ``proxy`` and ``gold`` are (rows, N) with N >= max(ns); a tie goes
    to the earlier candidate, so n = 1 is the first candidate, a draw of the base policy."""
    proxy, gold = np.asarray(proxy, dtype=float), np.asarray(gold, dtype=float)
    if proxy.shape != gold.shape or proxy.ndim != 2:
        raise ValueError(f"proxy {proxy.shape} and gold {gold.shape}: expected the same (rows, N) shape")
    if max(ns) > proxy.shape[1] or min(ns) < 1:
        raise ValueError(f"ns={list(ns)}: each must be in 1..{proxy.shape[1]} (the candidates per row)")
    rows = np.arange(len(proxy))
    return np.array([gold[rows, np.argmax(proxy[:, :n], 1)].mean() for n in ns])


def pareto_front(points: np.ndarray) -> np.ndarray:
    """The points no other point dominates (both objectives maximised), sorted by the first."""
    p = np.asarray(points, dtype=float).reshape(-1, 2)
    keep = [i for i, q in enumerate(p)
            if not np.any(np.all(p >= q, 1) & np.any(p > q, 1))]
    front = np.unique(p[keep], axis=0)
    return front[np.argsort(front[:, 0])]


def hypervolume_2d(points: np.ndarray, reference: Sequence[float]) -> float:
    """Area dominated by ``points`` and dominating ``reference`` (both objectives maximised): the
    union of the rectangles [ref, p]; points not above the reference in both add nothing."""
    ref = np.asarray(reference, dtype=float)
    front = pareto_front(points)
    front = front[np.all(front > ref, 1)]
    area, top = 0.0, ref[1]
    for x, y in front[::-1]:  # from the largest first objective down: y rises along the front
        if y > top:
            area += (x - ref[0]) * (y - top)
            top = y
    return float(area)


def mixed_counts(k: int, rhos: Sequence[float]) -> list[int]:
    """Demos of the second objective in a context of ``k`` at each mix ρ: round(ρ k), the rest of
    the first (§C.2's multi-objective steering, ρ ∈ {0, 0.1, …, 1})."""
    if any(not 0 <= r <= 1 for r in rhos):
        raise ValueError(f"rhos={list(rhos)}: each mix must be in [0, 1]")
    return [int(round(r * k)) for r in rhos]
