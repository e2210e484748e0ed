"""The linear bandit environment: arm sets, θ, noise, seeding, and errors that name the bad value."""

from __future__ import annotations

import math

import numpy as np
import pytest

from troupe.envs.linear_bandit import LinearBanditEnv, check_arms, check_rewards, hypercube_arms, load_arms
from troupe.platform.errors import ConfigError, DataError
from troupe.platform.registry import ENVIRONMENTS


def test_sphere_arms_have_unit_norm_and_the_instance_is_fixed_by_its_seed():
    a, b = LinearBanditEnv(d=4, k=30, instance_seed=3), LinearBanditEnv(d=4, k=30, instance_seed=3)
    c = LinearBanditEnv(d=4, k=30, instance_seed=4)
    assert a.arms.shape == (30, 4)
    np.testing.assert_allclose(np.linalg.norm(a.arms, axis=1), 1.0)
    np.testing.assert_array_equal(a.arms, b.arms)
    np.testing.assert_array_equal(a.theta, b.theta)
    assert not np.allclose(a.theta, c.theta)
    assert math.isclose(np.linalg.norm(a.theta), 1.0)
    assert a.gaps[a.best_arm] == 0 and (a.gaps >= 0).all()


def test_hypercube_arms_are_all_sign_patterns_and_theta_is_one_of_them():
    env = LinearBanditEnv(arms="hypercube", d=5, k=8, theta_norm=0.9, instance_seed=1)
    patterns = {tuple(np.sign(a[:3]).astype(int)) for a in env.arms}
    assert len(patterns) == 8 and np.all(env.arms[:, 3:] == 0)
    np.testing.assert_allclose(np.linalg.norm(env.arms, axis=1), 1.0)
    assert math.isclose(env.means[env.best_arm], 0.9)
    # neighbouring patterns differ by 2 * theta_norm / m
    assert math.isclose(np.min(env.gaps[env.gaps > 1e-12]), 2 * 0.9 / 3)


def test_hypercube_gap_sets_the_smallest_gap_for_every_k():
    for m in (1, 2, 4):
        env = LinearBanditEnv(arms="hypercube", d=4, k=2**m, gap=0.4, instance_seed=0)
        assert math.isclose(np.min(env.gaps[env.gaps > 1e-12]), 0.4)
    with pytest.raises(ConfigError, match="gap"):
        LinearBanditEnv(arms="hypercube", d=5, k=32, gap=0.5)


def test_hypercube_needs_a_power_of_two_no_larger_than_two_to_the_d():
    with pytest.raises(ConfigError, match="k=6"):
        hypercube_arms(6, 5)
    with pytest.raises(ConfigError, match="m <= d"):
        hypercube_arms(16, 3)


def test_arms_from_npy_and_csv_files(tmp_path):
    arms = np.array([[0.6, 0.8], [1.0, 0.0], [0.0, -0.5]])
    np.save(tmp_path / "a.npy", arms)
    (tmp_path / "a.csv").write_text("# one arm per row\n0.6,0.8\n1.0,0.0\n0.0,-0.5\n")
    np.testing.assert_allclose(load_arms(tmp_path / "a.npy"), arms)
    np.testing.assert_allclose(load_arms(tmp_path / "a.csv"), arms)
    env = LinearBanditEnv(arms="file", path=str(tmp_path / "a.csv"), theta=[1.0, 0.0])
    assert env.best_arm == 1 and env.k == 3 and env.d == 2


def test_arms_of_mixed_dimension_are_refused_naming_the_arm(tmp_path):
    (tmp_path / "bad.csv").write_text("0.1,0.2,0.3\n0.1,0.2\n")
    with pytest.raises(DataError, match=r"mixed dimension: arm 1 has 2 coordinates"):
        load_arms(tmp_path / "bad.csv")
    with pytest.raises(DataError, match="mixed dimension"):
        check_arms([[0.1, 0.2], [0.3]])
    with pytest.raises(DataError, match="mixed dimension"):
        LinearBanditEnv(arms=[[0.1, 0.2], [0.3, 0.1, 0.0]])


def test_bad_arms_and_theta_name_the_value():
    with pytest.raises(DataError, match="arm 1 has norm 2"):
        check_arms([[0.5, 0.0], [2.0, 0.0]])
    with pytest.raises(DataError, match="non-finite"):
        check_arms([[0.5, float("nan")]])
    with pytest.raises(ConfigError, match="zero norm"):
        LinearBanditEnv(arms=[[1.0, 0.0], [0.0, 1.0]], theta=[0.0, 0.0])
    with pytest.raises(ConfigError, match="theta_norm=0"):
        LinearBanditEnv(theta_norm=0.0)
    with pytest.raises(ConfigError, match="sigma"):
        LinearBanditEnv(sigma=float("inf"))


def test_non_finite_rewards_raise_naming_the_value():
    with pytest.raises(DataError, match=r"non-finite reward inf at position 2"):
        check_rewards(np.array([0.1, 0.2, np.inf]))


def test_gymnasium_api_and_registration():
    from gymnasium.utils.env_checker import check_env

    env = LinearBanditEnv(d=3, k=5, horizon=3)
    check_env(env, skip_render_check=True)
    obs, info = env.reset(seed=0)
    assert obs.shape == (5, 3) and info["k"] == 5
    truncated = False
    for _ in range(3):
        obs, reward, terminated, truncated, info = env.step(0)
        assert np.isfinite(reward) and not terminated and info["gap"] >= 0
    assert truncated
    assert ENVIRONMENTS.get("linear_bandit") is LinearBanditEnv


def test_closed_form_batch_means_match_averages_of_exact_pulls():
    env = LinearBanditEnv(d=3, k=4, sigma=1.0, instance_seed=2)
    env.reset(seed=0)
    n, reps = 16, 4000
    exact = env.pull(np.full((reps, n), 1)).mean(axis=1)
    closed = env.sample_means(np.full(reps, 1), np.full(reps, n))
    for z in (exact, closed):
        assert abs(z.mean() - env.means[1]) < 4 * 0.25 / math.sqrt(reps)
        assert abs(z.std() - 0.25) < 0.02


def test_closed_form_is_refused_for_non_gaussian_noise():
    env = LinearBanditEnv(d=3, k=4, noise="rademacher", sigma=1.0)
    env.reset(seed=0)
    assert set(np.round(np.abs(env.pull(np.zeros(50, dtype=int)) - env.means[0]), 9)) == {1.0}
    with pytest.raises(ConfigError, match="exact only for Gaussian"):
        env.sample_means(np.array([0]), np.array([4]))
