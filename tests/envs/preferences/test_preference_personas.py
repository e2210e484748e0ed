"""§C.5's synthetic personas in numbers: the persona splits, the Bradley–Terry labels, the episodes'
shape and masks, and a persona of the wrong dimension as a clear error."""

import numpy as np
import pytest
from scipy.special import expit

from troupe.envs.preferences.personas import (
    PersonaConfig,
    bt_probability,
    check_personas,
    sample_feature_episodes,
    sample_personas,
)
from troupe.platform.errors import ConfigError

CFG = PersonaConfig()


def test_train_personas_are_unit_and_live_on_the_seen_coordinates():
    w = sample_personas(CFG, 500, "train", np.random.default_rng(0))
    assert w.shape == (500, 8)
    assert np.allclose(np.linalg.norm(w, axis=1), 1.0)
    assert np.all(w[:, 6:] == 0)
    # the shared direction: the mean persona has equal positive weights on the seen coordinates
    assert np.all(w[:, :6].mean(0) > 0.1)


def test_test_personas_put_at_least_half_their_mass_on_the_unseen_coordinates():
    w = sample_personas(CFG, 500, "test", np.random.default_rng(1))
    assert np.allclose(np.linalg.norm(w, axis=1), 1.0)
    mass = (w[:, 6:] ** 2).sum(1)
    assert mass.min() >= 0.5 and mass.max() <= 1.0
    assert mass.mean() == pytest.approx(0.75, abs=0.03)  # uniform on [0.5, 1]


def test_bt_probability_is_the_logistic_of_the_scaled_margin_and_antisymmetric():
    rng = np.random.default_rng(2)
    w, a, b = sample_personas(CFG, 1, "train", rng)[0], rng.standard_normal(8), rng.standard_normal(8)
    p = bt_probability(w, a, b, 3.0)
    assert p == pytest.approx(1 / (1 + np.exp(-3.0 * w @ (a - b))))
    assert bt_probability(w, b, a, 3.0) == pytest.approx(1 - p)


@pytest.mark.parametrize("beta0", [3.0, 0.7])
def test_query_labels_are_drawn_at_their_bt_probability(beta0):
    cfg = PersonaConfig(beta0=beta0)
    w = sample_personas(cfg, 20, "train", np.random.default_rng(3))
    ep = sample_feature_episodes(cfg, w, 40_000, np.random.default_rng(4), k=0)
    want = expit(beta0 * np.einsum("nd,nd->n", w[ep.objective], ep.query_a - ep.query_b))
    assert np.allclose(ep.p_true, want)
    assert ep.label.mean() == pytest.approx(ep.p_true.mean(), abs=0.01)
    # labels follow p: among confident pairs the label agrees with the sign of p − 1/2 at rate E[max(p, 1−p)]
    agree = (ep.label == 1) == (ep.p_true > 0.5)
    assert agree.mean() == pytest.approx(np.maximum(ep.p_true, 1 - ep.p_true).mean(), abs=0.01)


def test_demos_are_chosen_over_rejected_at_the_persona_bt_rate_and_masked_past_k():
    w = sample_personas(CFG, 5, "train", np.random.default_rng(5))
    ep = sample_feature_episodes(CFG, w, 3000, np.random.default_rng(6), k=(0, 6))
    assert ep.capacity == 6 and set(np.unique(ep.k)) == set(range(7))
    assert np.all(ep.demo_mask == (np.arange(6)[None] < ep.k[:, None]))
    off = ~ep.demo_mask
    assert np.all(ep.demo_chosen[off] == 0) and np.all(ep.demo_rejected[off] == 0) and np.all(ep.demo_label[off] == 0)
    on = ep.demo_mask
    p_chosen = bt_probability(w[ep.objective][:, None].repeat(6, 1), ep.demo_chosen, ep.demo_rejected, 3.0)[on]
    # the chosen response won a BT draw: its mean win probability is E[p²+(1−p)²]/… > 1/2, and
    # every demo was shown in its drawn order, so about half of the labels are 1
    assert p_chosen.mean() > 0.75
    assert ep.demo_label[on].mean() == pytest.approx(0.5, abs=0.02)


def test_fixed_k_gives_every_episode_k_demos():
    w = sample_personas(CFG, 3, "test", np.random.default_rng(7))
    ep = sample_feature_episodes(CFG, w, 10, np.random.default_rng(8), k=4)
    assert np.all(ep.k == 4) and ep.demo_chosen.shape == (10, 4, 8) and ep.dim == 8


def test_a_persona_with_the_wrong_dimension_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"a persona has 7 weights but the responses have personas.dim=8 features"):
        sample_feature_episodes(CFG, np.ones((2, 7)) / np.sqrt(7), 4, np.random.default_rng(0))


def test_a_persona_that_is_not_a_unit_vector_is_named():
    w = sample_personas(CFG, 3, "train", np.random.default_rng(0))
    w[2] *= 2
    with pytest.raises(ConfigError, match=r"persona 2 has norm 2; personas are unit vectors: divide it by its norm"):
        check_personas(CFG, w)


@pytest.mark.parametrize(("key", "value"), [("seen_dims", 8), ("unseen_mass", 0.0), ("beta0", 0.0), ("dim", 1)])
def test_bad_generator_settings_name_their_key(key, value):
    with pytest.raises(ConfigError, match=rf"personas.{key}="):
        PersonaConfig(**{key: value})
