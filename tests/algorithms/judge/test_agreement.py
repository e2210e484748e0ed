"""§G.6's SMC-vs-exact check as the benchmark calls it."""

import numpy as np
import pytest
from conftest import make_toy

from troupe.algorithms.judge import model as M
from troupe.algorithms.judge.agreement import smc_vs_exact, total_variation
from troupe.algorithms.judge.smc import SMCConfig


def test_total_variation_is_half_the_l1_distance():
    assert total_variation([1, 0, 0], [0, 1, 0]) == 1.0
    assert total_variation(np.array([[0.5, 0.3, 0.2]]), np.array([[0.4, 0.4, 0.2]])) == pytest.approx([0.1])


def test_smc_vs_exact_reports_tv_below_002_on_a_toy_stream():
    s = M.encode_stream(make_toy(n=7, seed=21, set_labels=True))
    out = smc_vs_exact(s, M.prior_arrays(M.JudgePrior(), s), SMCConfig(n_particles=2000, seed=0))
    assert out["n"] == 7 and out["tv_max"] < 0.02 and 0 < out["tv_mean"] <= out["tv_max"]
    assert out["exact_components"] > 1 and out["min_ess"] <= 2000
