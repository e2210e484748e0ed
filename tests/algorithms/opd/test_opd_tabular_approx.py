"""§B.5's function-approximation variant: an MLP student over hashed prefix n-grams."""

import numpy as np
import pytest
import scipy.sparse

from troupe.algorithms.opd import noise, tabular


def test_features_are_the_depth_and_the_last_three_tokens_only():
    f = tabular.ngram_features((0, 1, 2, 1), buckets=256, ngrams=3)
    assert 1 <= len(f) <= 4 and all(0 <= b < 256 for b in f) and list(f) == sorted(set(f))
    assert f == tabular.ngram_features((2, 1, 2, 1), 256, 3)  # same depth and last three tokens
    assert f != tabular.ngram_features((0, 0, 2, 1), 256, 3)  # another trigram
    assert f != tabular.ngram_features((1, 2, 1), 256, 3)  # another depth
    assert len(tabular.ngram_features((), 256, 3)) == 1  # the root has its depth alone
    assert tabular.ngram_features((0, 1, 2, 1), 256, 3) == f  # a fixed hash: the same on every call and run


def test_aggregate_sums_the_targets_of_states_the_student_cannot_tell_apart():
    data = tabular.Aggregate(buckets=8, vocab=3)
    data.add((1, 4), noise.one_hot(0, 3))
    data.add((2,), noise.one_hot(2, 3))
    data.add((1, 4), np.array([0.2, 0.3, 0.5]))
    x, t = data.arrays()
    assert x.shape == (2, 8) and np.array_equal(x.toarray()[0], [0, 1, 0, 0, 1, 0, 0, 0])
    assert np.allclose(t, [[1.2, 0.3, 0.5], [0, 0, 1]])
    for i in range(100):  # growing past the first block keeps every row
        data.add((i % 8, (i + 1) % 8) if i % 8 != 7 else (7,), noise.one_hot(1, 3))
    x, t = data.arrays()
    assert x.shape[0] == t.shape[0] == len(data.rows) and np.allclose(t.sum(), 3 + 100)


def test_cross_entropy_gradients_match_finite_differences():
    rng = np.random.default_rng(0)
    params = {"w1": rng.normal(size=(6, 5)), "b1": rng.normal(size=5), "w2": rng.normal(size=(5, 3)),
              "b2": rng.normal(size=3)}
    x = scipy.sparse.csr_matrix((rng.random((4, 6)) < 0.4).astype(float))
    w = rng.random((4, 3))
    _, grads = tabular.cross_entropy_grads(params, x, w)
    h = 1e-6
    for k, p in params.items():
        numeric = np.zeros_like(p)
        for i in np.ndindex(p.shape):
            p[i] += h
            up, _ = tabular.cross_entropy_grads(params, x, w)
            p[i] -= 2 * h
            down, _ = tabular.cross_entropy_grads(params, x, w)
            p[i] += h
            numeric[i] = (up - down) / (2 * h)
        assert np.allclose(grads[k], numeric, atol=1e-5), k


def test_the_cross_entropy_to_a_distribution_is_the_forward_kl_plus_its_entropy():
    rng = np.random.default_rng(1)
    student = tabular.MLPStudent(3, tabular.ApproxConfig(buckets=8, hidden=4), rng)
    x = scipy.sparse.csr_matrix(np.eye(8)[:2])
    teacher = np.array([[0.8, 0.1, 0.1], [0.1, 0.1, 0.8]])
    ce, _ = tabular.cross_entropy_grads(student.params, x, teacher)
    hid = np.tanh(x.toarray() @ student.params["w1"] + student.params["b1"])
    z = hid @ student.params["w2"] + student.params["b2"]
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    kl = (teacher * np.log(teacher / p)).sum()
    assert ce == pytest.approx(kl - (teacher * np.log(teacher)).sum())


@pytest.mark.parametrize("context", [0, 2])
@pytest.mark.parametrize("method", tabular.APPROX_METHODS)
def test_the_mlp_student_learns_a_clean_expert(method, context):
    """ε = 0: BC's data, OPD-KL's and NE-OPD's targets are all the clean expert's, and the MLP fits them."""
    cfg = tabular.TabularConfig(eps=0.0, episodes=40, context=context)
    out = tabular.run_approx(method, 6, cfg, seed=1)
    assert out["j_greedy"] == 1.0 and out["agreement"] == 1.0
    assert out["j_t1"] > 0.9
    assert out["teacher_tokens"] == 40 * 6


def test_an_untrained_student_is_near_uniform_and_fails_a_long_horizon():
    cfg = tabular.TabularConfig()
    student = tabular.MLPStudent(3, tabular.ApproxConfig(), np.random.default_rng(0))
    assert np.allclose(student((0, 1)), 1 / 3, atol=0.05)
    assert tabular.success(student, tabular.Expert(3, cfg.eps, salt=0), 24)["j_t1"] < 1e-9


def test_bad_approx_settings_name_the_key():
    for key, bad in (("buckets", 0), ("ngrams", 0), ("hidden", 0), ("steps", 0), ("lr", 0.0)):
        with pytest.raises(ValueError, match=f"opd.approx.{key}"):
            tabular.ApproxConfig(**{key: bad})
    with pytest.raises(ValueError, match="opd method"):
        tabular.run_approx("tm_opd", 4, tabular.TabularConfig(), 0)
