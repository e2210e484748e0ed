"""§C.5's personas in text: every attribute is counted exactly from the text, the features are the
standardised attributes, and the labels are BT on the features read back from the text."""

import numpy as np
import pytest

from troupe.envs.preferences.personas import PersonaConfig, bt_probability, sample_personas
from troupe.envs.preferences.text_personas import ATTRIBUTES, VOCAB, TextPersonas, attribute_values
from troupe.platform.errors import ConfigError

GEN = TextPersonas()


def test_attributes_are_counted_exactly_from_a_hand_written_response():
    text = "Therefore the atom and 12 photons, perhaps PLEASE bake 7 cool atom garlic moreover."
    v = dict(zip(ATTRIBUTES, attribute_values(text), strict=True))
    # tokens: therefore the atom and 12 photons perhaps please bake 7 cool atom garlic moreover
    assert v["length"] == 14
    assert v["science"] == pytest.approx(2 / 14)  # atom twice; "photons" is not the vocabulary's "photon"
    assert v["formality"] == 2 and v["numbers"] == 2 and v["hedging"] == 1 and v["politeness"] == 1
    assert v["casual"] == 1 and v["cooking"] == pytest.approx(2 / 14)


def test_an_empty_response_has_zero_attributes():
    assert np.all(attribute_values("") == 0)


def test_written_responses_hold_their_drawn_word_counts():
    rng = np.random.default_rng(0)
    for text in GEN.write(rng, 50):
        v = dict(zip(ATTRIBUTES, attribute_values(text), strict=True))
        assert 4 <= v["length"] <= 4 + 16 + 8 + 4 * 5 + 8 + 12
        for name in ("formality", "numbers", "hedging", "politeness", "casual"):
            assert 0 <= v[name] <= 4 and v[name] == int(v[name])
        assert 0 <= v["science"] * v["length"] <= 8


def test_features_are_standardised_over_the_generator_responses():
    phi = GEN.features(GEN.write(np.random.default_rng(1), 4000))
    assert phi.shape == (4000, 8)
    assert np.abs(phi.mean(0)).max() < 0.06
    assert np.abs(phi.std(0) - 1).max() < 0.05


def test_vocabularies_are_disjoint_so_every_word_has_one_attribute():
    words = [w for ws in VOCAB.values() for w in ws]
    assert len(words) == len(set(words))


def test_episode_labels_follow_bt_on_the_features_read_from_the_text():
    rng = np.random.default_rng(2)
    w = sample_personas(GEN.cfg, 4, "train", rng)
    episodes = GEN.episodes(w, 600, rng, k=3)
    fe = GEN.feature_episodes(episodes, w)
    assert fe.demo_chosen.shape == (600, 3, 8) and np.all(fe.k == 3)
    e = episodes[0]
    assert np.allclose(fe.query_a[0], GEN.features(e.query.a))
    assert np.allclose(fe.demo_chosen[0, 1], GEN.features(e.demos[1].chosen))
    assert list(fe.demo_label[0]) == [d.label for d in e.demos]
    p = bt_probability(w[fe.objective], fe.query_a, fe.query_b, 3.0)
    assert np.allclose(fe.p_true, p)
    # labels drawn at p: agreement with the persona's side is E[max(p, 1−p)] within sampling error
    agree = np.mean((fe.label == 1) == (p > 0.5))
    assert agree == pytest.approx(np.maximum(p, 1 - p).mean(), abs=0.05)
    assert {ep.objective for ep in episodes} <= {f"persona-{i}" for i in range(4)}


def test_a_test_persona_prefers_the_casual_response_it_weights():
    w = np.zeros(8)
    w[ATTRIBUTES.index("casual")] = 1.0
    plain, casual = "the note is here.", "yeah the note is cool here."
    # two casual markers more: a margin of 2 / scale, the standard deviation of a uniform count on {0..4}
    assert GEN.features(casual)[6] - GEN.features(plain)[6] == pytest.approx(2 / np.sqrt(2))
    assert bt_probability(w, GEN.features(casual), GEN.features(plain), 3.0) == pytest.approx(
        1 / (1 + np.exp(-3 * np.sqrt(2))))


def test_a_persona_with_the_wrong_dimension_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"a persona has 6 weights but the responses have personas.dim=8"):
        GEN.episodes(np.eye(6)[:2], 2, np.random.default_rng(0))


def test_text_personas_need_eight_features():
    with pytest.raises(ConfigError, match=r"personas.dim=6: text responses have 8 attributes"):
        TextPersonas(PersonaConfig(dim=6, seen_dims=4))


def test_the_length_feature_is_standardised_by_the_closed_form_of_the_drawn_counts():
    # 8 word classes and numbers, each uniform on {lo..hi}: mean Σ(lo+hi)/2, variance Σ((hi−lo+1)²−1)/12
    assert GEN.center[0] == 10 + 4 + 2 * 5 + 4
    assert GEN.scale[0] ** 2 == pytest.approx((168 + 2 * 80 + 5 * 24) / 12)


def test_feature_episodes_need_the_persona_names_the_episodes_were_drawn_with():
    rng = np.random.default_rng(3)
    w = sample_personas(GEN.cfg, 2, "test", rng)
    episodes = GEN.episodes(w, 3, rng, k=1, names=["terse", "casual"])
    assert GEN.feature_episodes(episodes, w, names=["terse", "casual"]).objective.max() <= 1
    with pytest.raises(ConfigError, match=r"not among the persona names \['persona-0', 'persona-1'\]"):
        GEN.feature_episodes(episodes, w)
