"""§C.6 item 4 and the k = 0 limit on the network itself: swapping the query pair maps μ to 1 − μ
and keeps τ and the loss, r(y_a; C) never sees y_b, the demos are a set (order and padding do not
matter), k = 0 ignores demo contents; and the context limits as clear errors."""

import dataclasses

import numpy as np
import pytest
import torch

from troupe.algorithms.icrm import posterior
from troupe.algorithms.icrm.model import (
    ICRM,
    ICRMConfig,
    ICRMHeads,
    demo_direction,
    episode_batch,
    swap_query,
)
from troupe.envs.preferences.personas import PersonaConfig, sample_feature_episodes, sample_personas
from troupe.platform.errors import ConfigError

CFG = ICRMConfig(d_model=32, layers=2, heads=4, kl_weight=0.3)
PERSONAS = PersonaConfig(max_demos=6)


@pytest.fixture(scope="module", params=[False, True], ids=["encoder", "bilinear"])
def model(request):
    # Every invariance holds with the bilinear reading of the demos too (icrm.bilinear), set
    # away from its zero start so that it counts.
    torch.manual_seed(0)
    m = ICRM(dataclasses.replace(CFG, bilinear=request.param)).eval()
    if request.param:
        with torch.no_grad():
            m.read.copy_(0.1 * torch.randn_like(m.read))
    return m


def episodes(n=64, k=(0, 6), seed=0):
    rng = np.random.default_rng(seed)
    return sample_feature_episodes(PERSONAS, sample_personas(PERSONAS, 10, "train", rng), n, rng, k=k)


@torch.no_grad()
def test_swapping_the_query_pair_maps_mu_to_one_minus_mu_and_keeps_tau_and_the_loss(model):
    batch = episode_batch(episodes(), CFG)
    out, swapped = model(batch), model(swap_query(batch))
    assert torch.allclose(swapped["mu"], 1 - out["mu"], atol=1e-6)
    assert torch.allclose(swapped["tau"], out["tau"], atol=1e-5)
    assert torch.allclose(swapped["r_a"], out["r_b"], atol=1e-5)
    assert float(model.loss(swapped, swap_query(batch))) == pytest.approx(float(model.loss(out, batch)), rel=1e-5)


@torch.no_grad()
def test_the_reward_of_a_response_does_not_depend_on_the_other_response(model):
    batch = episode_batch(episodes(), CFG)
    other = {**batch, "query_b": torch.randn_like(batch["query_b"])}
    assert torch.allclose(model(other)["r_a"], model(batch)["r_a"], atol=1e-6)
    assert not torch.allclose(model(other)["r_b"], model(batch)["r_b"], atol=1e-3)


@torch.no_grad()
def test_the_demos_are_a_set_their_order_and_padding_do_not_matter(model):
    batch = episode_batch(episodes(k=6), CFG)
    perm = torch.randperm(6)
    shuffled = {**batch, "demo_chosen": batch["demo_chosen"][:, perm], "demo_rejected": batch["demo_rejected"][:, perm]}
    assert torch.allclose(model(shuffled)["mu"], model(batch)["mu"], atol=1e-6)
    pad = lambda t, v: torch.cat([t, torch.full((t.shape[0], 3, *t.shape[2:]), v, dtype=t.dtype)], 1)  # noqa: E731
    padded = {**batch, "demo_chosen": pad(batch["demo_chosen"], 5.0), "demo_rejected": pad(batch["demo_rejected"], -5.0),
              "demo_mask": pad(batch["demo_mask"], False), "demo_label": pad(batch["demo_label"], 1.0)}
    assert torch.allclose(model(padded)["mu"], model(batch)["mu"], atol=1e-6)
    assert float(model.loss(model(padded), padded)) == pytest.approx(float(model.loss(model(batch), batch)), rel=1e-5)


@torch.no_grad()
def test_with_k_zero_the_demo_contents_are_ignored_and_the_demos_do_matter_otherwise(model):
    empty = episode_batch(episodes(k=0), CFG)
    noise = {**empty, "demo_chosen": torch.randn_like(empty["demo_chosen"]),
             "demo_rejected": torch.randn_like(empty["demo_rejected"])}
    assert torch.allclose(model(noise)["mu"], model(empty)["mu"], atol=1e-6)
    full = episode_batch(episodes(k=4), CFG)
    other = {**full, "demo_chosen": full["demo_rejected"], "demo_rejected": full["demo_chosen"]}
    assert not torch.allclose(model(other)["mu"], model(full)["mu"], atol=1e-4)


@torch.no_grad()
def test_the_outputs_are_a_beta_posterior_with_confidence_above_tau_min(model):
    out = model(episode_batch(episodes(), CFG))
    assert torch.all((out["mu"] > 0) & (out["mu"] < 1)) and torch.all(out["tau"] >= CFG.tau_min)
    assert torch.allclose(out["alpha"] + out["beta"], out["tau"], atol=1e-5)
    assert torch.allclose(out["alpha"] / out["tau"], out["mu"], atol=1e-5)


def test_the_confidence_head_is_symmetric_on_any_states():
    torch.manual_seed(1)
    heads = ICRMHeads(16)
    z_a, z_b = torch.randn(5, 16), torch.randn(5, 16)
    out, swapped = heads(z_a, z_b), heads(z_b, z_a)
    assert torch.allclose(out["tau"], swapped["tau"]) and torch.allclose(out["mu"], 1 - swapped["mu"], atol=1e-6)


@pytest.mark.parametrize("episode_elbo", [False, True])
def test_the_loss_is_the_mean_negative_elbo_of_the_flag_chosen_reading(episode_elbo):
    cfg = ICRMConfig(d_model=16, layers=1, heads=2, kl_weight=0.5, a0=1.5, b0=0.8, episode_elbo=episode_elbo)
    torch.manual_seed(2)
    m = ICRM(cfg)
    batch = episode_batch(episodes(), cfg)
    with torch.no_grad():
        out = m(batch)
    args = (out["alpha"], out["beta"], batch["label"])
    if episode_elbo:
        want = posterior.episode_negative_elbo(*args, batch["demo_label"], batch["demo_mask"], 0.5, 1.5, 0.8)
    else:
        want = posterior.negative_elbo(*args, 0.5, 1.5, 0.8)
    assert float(m.loss(out, batch)) == pytest.approx(float(want.mean()), rel=1e-6)
    if episode_elbo:  # the demo labels enter the loss, and only through it
        flipped = {**batch, "demo_label": 1 - batch["demo_label"]}
        assert float(m.loss(out, flipped)) != pytest.approx(float(m.loss(out, batch)), rel=1e-3)


# -- bad input -------------------------------------------------------------------------------------
def test_k_above_the_model_context_is_a_clear_error():
    cfg = ICRMConfig(max_demos=4)
    with pytest.raises(ConfigError, match=r"episode \d+ has k=[56] demonstrations; the model's context holds "
                                          r"icrm.max_demos=4: give at most 4 demos per episode or raise icrm.max_demos"):
        episode_batch(episodes(k=(5, 6)), cfg)


def test_features_of_another_size_are_a_clear_error():
    with pytest.raises(ConfigError, match=r"episodes have 8 features per response; the model reads "
                                          r"icrm.feature_dim=6: set icrm.feature_dim=8"):
        episode_batch(episodes(), ICRMConfig(feature_dim=6))


@pytest.mark.parametrize(("key", "value"), [("d_model", 30), ("kl_weight", 0.0), ("max_demos", -1), ("layers", 0)])
def test_bad_model_settings_name_their_key(key, value):
    with pytest.raises(ConfigError, match=rf"icrm.{key}="):
        ICRMConfig(**{key: value})


def test_the_demo_direction_is_the_summed_chosen_minus_rejected_over_k_plus_one():
    chosen = torch.tensor([[[1.0, 2.0], [3.0, 0.0], [9.0, 9.0]]])
    rejected = torch.tensor([[[0.0, 1.0], [1.0, 1.0], [-9.0, 9.0]]])
    mask = torch.tensor([[True, True, False]])  # the third slot is padding
    assert demo_direction(chosen, rejected, mask).tolist() == [[1.0, 0.0]]  # ((1, 1) + (2, -1)) / 3
    assert demo_direction(chosen, rejected, torch.zeros(1, 3, dtype=torch.bool)).tolist() == [[0.0, 0.0]]


@torch.no_grad()
def test_the_bilinear_reading_starts_at_zero_and_then_adds_e_read_phi_to_each_reward():
    torch.manual_seed(0)
    plain = ICRM(CFG).eval()
    torch.manual_seed(0)
    bilinear = ICRM(dataclasses.replace(CFG, bilinear=True)).eval()
    batch = episode_batch(episodes(k=4), CFG)
    assert torch.equal(bilinear(batch)["r_a"], plain(batch)["r_a"])  # same weights, the term is 0
    bilinear.read.copy_(torch.eye(CFG.feature_dim))
    e = demo_direction(batch["demo_chosen"], batch["demo_rejected"], batch["demo_mask"])
    want = plain(batch)["r_a"] + (e * batch["query_a"]).sum(-1)
    assert torch.allclose(bilinear(batch)["r_a"], want, atol=1e-5)
