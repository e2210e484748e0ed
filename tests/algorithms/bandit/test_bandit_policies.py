"""Learners: each plays exactly the horizon, the σ→0 limits, and the directions §E claims."""

from __future__ import annotations

import math

import numpy as np
import pytest

from troupe.actors.bandit_agent import BanditAgent, LocalChannel
from troupe.algorithms.bandit.onebit import bisection_margin, probit_bits
from troupe.algorithms.bandit.policies import POLICIES, BitPE, PolicyParams, Unquantised
from troupe.algorithms.bandit.sweep import ENV_PATH, Cell, run_cell


def test_the_registry_holds_every_policy_and_only_baselines_see_rewards():
    assert set(POLICIES) == {"bitpe", "bitpe_safe", "unquantised", "sign_bit", "dither", "linucb", "etc"}
    assert {p for p, c in POLICIES.items() if c.feedback == "full"} == {"unquantised", "linucb"}


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("batch,horizon", [(16, 2**12), (64, 2**14)])
def test_every_policy_plays_exactly_the_horizon_in_whole_batches(policy, batch, horizon):
    res = run_cell(Cell(policy, 0, batch, horizon, 4, 20), PolicyParams())
    b = res["batch"] if POLICIES[policy].batched else 1
    assert res["pulls"] == horizon and res["batches"] * b == horizon
    assert res["curve_t"][-1] == horizon and math.isclose(res["curve_regret"][-1], res["regret"])
    assert np.all(np.diff(res["curve_regret"]) >= -1e-9) and res["regret"] >= 0
    if POLICIES[policy].feedback == "full":
        assert res["bits"] == 0


def _play(policy_cls, sigma, batch=16, horizon=2**16, seed=0):
    agent = BanditAgent()
    key = agent.reset(ENV_PATH,
                      {"d": 4, "k": 20, "sigma": sigma, "instance_seed": seed}, batch, horizon,
                      policy_cls.feedback, "closed_form", seed)
    stats = policy_cls(PolicyParams(), sigma, np.random.default_rng(0)).run(LocalChannel(agent))
    return stats, agent.report(key)


def test_noise_free_unquantised_elimination_finds_the_best_arm_in_the_first_phase():
    stats, rep = _play(Unquantised, sigma=1e-9)
    assert stats["phases"] == 1 and stats["active"] == [rep["best_arm"]]


def test_noise_free_bitpe_needs_about_log_one_over_w_bits_per_design_arm():
    sigma, b = 1e-7, 16
    stats, rep = _play(BitPE, sigma=sigma, batch=b)
    assert stats["phases"] == 1 and stats["active"] == [rep["best_arm"]]
    delta_prime = 0.05 / (20 * 2)  # phase 1
    w = bisection_margin(sigma / math.sqrt(b), delta_prime)
    per_arm = math.log2(2 / w) + 1 + probit_bits(1, 1, delta_prime)
    assert rep["bits"] <= 20 * per_arm  # at most k = 20 design arms, each localised once


def test_bitpe_regret_grows_with_the_batch_size():
    # every bit costs a whole batch, so a larger B costs more at the same horizon
    small = run_cell(Cell("bitpe", 1, 16, 2**16, 4, 20), PolicyParams())["regret"]
    large = run_cell(Cell("bitpe", 1, 1024, 2**16, 4, 20), PolicyParams())["regret"]
    assert large > small


def test_claimed_directions_on_a_small_sweep():
    p, t, seeds = PolicyParams(), 2**18, range(3)

    def mean(policy, b):
        return np.mean([run_cell(Cell(policy, s, b, t, 5, 50), p)["regret"] for s in seeds])

    unq, bit16, bit1024 = mean("unquantised", 16), mean("bitpe", 16), mean("bitpe", 1024)
    assert bit16 < 4 * unq  # within a small factor at small B
    assert bit1024 > 4 * bit16  # the excess grows with B
    assert mean("bitpe_safe", 1024) < bit1024  # padding with the safe arm helps at large B
    assert mean("sign_bit", 1024) > bit1024  # a fixed sign bit cannot localise


def test_bitpe_with_localised_dithering_plays_the_horizon_and_finds_the_best_arm():
    res = run_cell(Cell("bitpe", 0, 16, 2**16, 4, 20, sigma=0.2), PolicyParams(refine="dither"))
    assert res["pulls"] == 2**16 and res["bits"] > 0 and res["best_eliminated"] is False
