"""The agent alone holds rewards: bit rules read only their pulls, learners get bits, regret adds up."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from troupe.actors.bandit_agent import (
    BanditAgent,
    Batch,
    BitQuery,
    BitRule,
    BudgetExceededError,
    LocalChannel,
    RewardAccessError,
    evaluate_bit_rule,
)
from troupe.algorithms.bandit.sweep import ENV_PATH
from troupe.platform.errors import ConfigError, DataError

ARMS = [[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]


def agent(sigma=1.0, b=4, t=64, feedback="bit", mode="closed_form", seed=0, **env):
    a = BanditAgent()
    key = a.reset(ENV_PATH, {"arms": ARMS, "theta": [0.5, 0.2], "sigma": sigma, **env}, b, t, feedback, mode, seed)
    return a, key


def test_a_bit_rule_reads_only_its_pulls():
    batch = Batch((0, 2), (3, 5))
    rule = BitRule(reads=(0, 3), threshold=0.4)
    rewards = np.array([0.5, 0.3, 0.6, 9.0, -9.0, 9.0, -9.0, 9.0])
    bit = evaluate_bit_rule(rule, batch, rewards, np.array(ARMS))
    assert bit == 1  # mean of the first three pulls is 0.4667
    outside = rewards.copy()
    outside[3:] = [np.nan, np.inf, -np.inf, 1e300, np.nan]
    assert evaluate_bit_rule(rule, batch, outside, np.array(ARMS)) == bit
    inside = rewards.copy()
    inside[0] = -1.0
    assert evaluate_bit_rule(rule, batch, inside, np.array(ARMS)) == 0
    with pytest.raises(DataError, match="non-finite reward nan at batch position 1"):
        evaluate_bit_rule(rule, batch, np.array([0.5, np.nan, 0.6, 0, 0, 0, 0, 0]), np.array(ARMS))


def test_the_exact_agent_never_reads_padding_pulls(monkeypatch):
    # Algorithm 2 padding: 3 pulls of arm 1 are read, 5 pulls of the safe arm 0 are not.
    a, _ = agent(sigma=0.0, b=8, t=64, mode="exact")
    real_pull = a.env.pull

    def poisoned(idx):
        out = real_pull(idx).astype(float)
        out[..., 3:] = np.nan  # a rule that touched the padding would raise
        return out

    monkeypatch.setattr(a.env, "pull", poisoned)
    q = BitQuery(Batch((1, 0), (3, 5)), BitRule(reads=(0, 3)), np.array([0.19, 0.21]))
    (bits,) = a.answer([q])
    assert bits.tolist() == [1, 0]  # mu_1 = 0.2


def test_learners_get_bits_never_rewards():
    a, key = agent()
    ch = LocalChannel(a)
    (bits,) = ch.query([BitQuery(Batch((0,), (4,)), BitRule(reads=(0, 4)), np.zeros(5))])
    assert bits.dtype == np.int8 and set(bits.tolist()) <= {0, 1}
    with pytest.raises(RewardAccessError, match="one bit per batch"):
        ch.observe(Batch((0,), (4,)))
    with pytest.raises(RewardAccessError, match="key"):
        a.report("a guess")
    public = {k for k in vars(ch) if not k.startswith("_")}
    assert public == {"arms", "batch_size", "horizon", "feedback", "batches_left"}
    assert set(a.describe()) == {"arms", "batch_size", "horizon", "feedback"}
    assert a.report(key)["bits"] == 5


def test_full_feedback_agents_return_per_arm_means():
    a, key = agent(sigma=0.0, feedback="full")
    obs = a.observe(Batch((0, 1), (6, 2)), repeat=2)
    assert obs["arms"].tolist() == [0, 1] and obs["counts"].tolist() == [12, 4]
    np.testing.assert_allclose(obs["means"], [0.5, 0.2])
    assert a.report(key)["pulls"] == 16


def test_regret_accounting_counts_every_pull_and_stops_at_the_horizon():
    a, key = agent(b=4, t=32)
    a.answer([BitQuery(Batch((1, 2), (1, 3)), BitRule(reads=(0, 1)), np.zeros(2))])  # 2 batches
    a.pull(Batch((1,), (4,)), repeat=3)
    rep = a.report(key)
    gaps = 0.5 - np.array(ARMS) @ [0.5, 0.2]
    assert rep["pulls"] == 20 and rep["batches"] * 4 == rep["pulls"]
    assert math.isclose(rep["regret"], 2 * (gaps[1] + 3 * gaps[2]) + 12 * gaps[1])
    assert a.batches_left() == 3
    with pytest.raises(BudgetExceededError, match="12 of T=32 left"):
        a.pull(Batch((0,), (4,)), repeat=4)
    a.pull(Batch((0,), (4,)), repeat=3)
    assert a.report(key)["pulls"] == 32 and a.batches_left() == 0


def test_bad_queries_and_settings_name_the_value():
    a, _ = agent(b=4, t=32)
    with pytest.raises(DataError, match="exactly B=4"):
        a.answer([BitQuery(Batch((0,), (3,)), BitRule(reads=(0, 3)))])
    with pytest.raises(DataError, match=r"reads positions \[2, 6\)"):
        a.answer([BitQuery(Batch((0,), (4,)), BitRule(reads=(2, 6)))])
    with pytest.raises(DataError, match="finite"):
        a.answer([BitQuery(Batch((0,), (4,)), BitRule(reads=(0, 4), threshold=math.nan))])
    with pytest.raises(ConfigError, match="B=48 does not divide the horizon T=1000"):
        BanditAgent().reset(ENV_PATH, {"arms": ARMS, "theta": [0.5, 0.2]}, 48, 1000)
    with pytest.raises(ConfigError, match="exact only for Gaussian"):
        agent(noise="rademacher")


@pytest.mark.parametrize("mode", ["closed_form", "exact"])
def test_threshold_bits_have_the_probit_frequency_in_both_modes(mode):
    a, _ = agent(sigma=1.0, b=16, t=16 * 6000, mode=mode, seed=1)
    tau = 0.3
    (bits,) = a.answer([BitQuery(Batch((0,), (16,)), BitRule(reads=(0, 16)), np.full(6000, tau))])
    p = norm.cdf((0.5 - tau) / 0.25)
    assert abs(bits.mean() - p) < 4 * math.sqrt(p * (1 - p) / 6000)


def test_halving_rule_picks_the_half_with_the_best_arm_identically_in_both_modes():
    for mode in ("closed_form", "exact"):
        a, _ = agent(sigma=0.0, b=4, t=16, mode=mode)
        rule = BitRule(reads=(0, 4), kind="argmax_half", halves=((1, 2), (0,)))
        (bit,) = a.answer([BitQuery(Batch((0, 1), (2, 2)), rule)])
        assert bit.tolist() == [1]  # arm 0 (mean 0.5) beats arms 1, 2 (0.2, 0.46)
