"""§G.6's check that the SMC posterior matches the exact one on small streams (TV < 0.02 on n ≤ 12).

The Pyro counterpart for large n is `pyro_reference.smc_vs_pyro`.
"""

from __future__ import annotations

import time

import numpy as np

from troupe.algorithms.judge.exact import exact_posterior
from troupe.algorithms.judge.model import EncodedStream, PriorArrays
from troupe.algorithms.judge.smc import SMCConfig, run_smc


def total_variation(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """TV = ½ Σ_v |p_v − q_v|, per row."""
    return 0.5 * np.abs(np.asarray(p) - np.asarray(q)).sum(-1)


def smc_vs_exact(stream: EncodedStream, prior: PriorArrays, config: SMCConfig = SMCConfig()) -> dict[str, float]:
    """TV between SMC's and the exact verdict marginals on one stream (the exact side is exponential in n)."""
    t0 = time.perf_counter()
    exact = exact_posterior(stream, prior)
    t1 = time.perf_counter()
    smc = run_smc(stream, prior, config)
    t2 = time.perf_counter()
    tv = total_variation(smc.marginals(), exact.marginals())
    return {
        "n": stream.n_items,
        "tv_mean": float(tv.mean()),
        "tv_max": float(tv.max()),
        "exact_components": exact.n_components,
        "exact_s": t1 - t0,
        "smc_s": t2 - t1,
        "min_ess": float(min(smc.ess_history)) if smc.ess_history else float("nan"),
    }
