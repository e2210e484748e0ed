"""§G.7 tests 3, 5, 6, 8 on the exact recursion of §G.3(a)."""

import dataclasses

import numpy as np
import pytest
from conftest import make_toy

from troupe.algorithms.judge import model as M
from troupe.algorithms.judge.exact import ExactRecursion, enumerate_posterior, exact_posterior
from troupe.algorithms.judge.model import Comparison, HumanLabel, JudgePair, JudgePrior
from troupe.platform.errors import ConfigError


def posterior(comps, judge_model="joint", prior=JudgePrior()):
    s = M.encode_stream(comps, judge_model=judge_model)
    p = M.prior_arrays(prior, s)
    return s, p, exact_posterior(s, p)


@pytest.mark.parametrize(
    ("n", "kw"),
    [
        (7, {"judge_model": "joint"}),
        (6, {"judge_model": "factorised"}),
        (5, {"judge_model": "joint", "set_labels": True}),
        (6, {"judge_model": "factorised", "set_labels": True, "raters": 3, "per_item": 2}),
    ],
)
def test_merged_recursion_equals_full_enumeration(n, kw):
    jm = kw.pop("judge_model")
    comps = make_toy(n=n, seed=n, **kw)
    s, p, rec = posterior(comps, jm)
    brute = enumerate_posterior(s.by_item(), p)
    assert np.allclose(rec.marginals(), brute.marginals, atol=1e-12)
    assert rec.log_evidence == pytest.approx(brute.log_evidence, rel=1e-12)
    assert np.allclose(rec.posterior_mean()["pi"], brute.pi_mean, atol=1e-12)
    unmerged = np.prod([3 * np.prod([len(o.cells) for o in obs]) for obs in s.by_item()])
    assert rec.n_components < unmerged  # merging happened


def test_half_parsed_judge_pairs_match_enumeration():
    comps = make_toy(n=5, seed=3)
    comps[1] = dataclasses.replace(comps[1], judge=JudgePair(None, "B"))
    comps[3] = dataclasses.replace(comps[3], judge=JudgePair("T", None))
    s, p, rec = posterior(comps)
    assert np.allclose(rec.marginals(), enumerate_posterior(s.by_item(), p).marginals, atol=1e-12)


def test_identical_comparisons_merge_to_one_component_per_verdict_count():
    c = (HumanLabel("r", "A", "crowd"),)
    comps = [Comparison(f"c{i}", c, JudgePair("A", "A")) for i in range(6)]
    _, _, rec = posterior(comps)
    assert rec.n_components == 28  # (n_A, n_B, n_T) with sum 6: C(8, 2)
    m = rec.marginals()
    assert np.allclose(m, m[0])  # exchangeable items share one marginal


def test_first_item_is_the_closed_form_one_step_predictive():
    comps = make_toy(n=1, seed=2)
    s, p, rec = posterior(comps)
    (obs,) = s.by_item()
    w = p.alpha_pi / p.alpha_pi.sum()
    for o in obs:
        a = p.alpha_theta[o.owner] if o.family == M.THETA else p.alpha_phi[o.owner]
        w = w * a[:, list(o.cells)].sum(-1) / a.sum(-1)
    assert np.allclose(rec.marginals()[0], w / w.sum())
    assert rec.log_evidence == pytest.approx(np.log(w.sum()))


def test_posterior_is_invariant_to_arrival_order():
    comps = make_toy(n=6, seed=11, set_labels=True)
    perm = [3, 0, 5, 1, 4, 2]
    _, _, a = posterior(comps)
    _, _, b = posterior([comps[k] for k in perm])
    assert np.allclose(a.marginals()[perm], b.marginals(), atol=1e-12)
    assert a.log_evidence == pytest.approx(b.log_evidence, rel=1e-12)
    for k in ("pi", "theta", "phi"):
        assert np.allclose(a.posterior_mean()[k], b.posterior_mean()[k], atol=1e-12)


def test_late_labels_fold_into_their_comparison():
    comps = make_toy(n=5, seed=4)
    head, tail = comps[2].labels[:1], comps[2].labels[1:]
    late = comps[:2] + [dataclasses.replace(comps[2], labels=head)] + comps[3:] + [Comparison("c2", tail)]
    _, _, a = posterior(comps)
    _, _, b = posterior(late)
    assert np.allclose(a.marginals(), b.marginals(), atol=1e-12)


SW = np.array([1, 0, 2])  # the A↔B relabelling of verdicts


def cell_perm(f):
    return np.array([M.cell(*f(c // 3, c % 3)) for c in range(9)])


def test_swapping_a_and_b_everywhere_negates_the_order_bias():
    comps = make_toy(n=6, seed=8)
    _, _, a = posterior(comps)
    _, _, b = posterior(M.swap_ab(comps))
    assert np.allclose(b.marginals(), a.marginals()[:, SW], atol=1e-12)
    pa, pb = a.posterior_mean()["phi"][0], b.posterior_mean()["phi"][0]
    perm = cell_perm(lambda x, y: (SW[x], SW[y]))
    assert np.allclose(pb[SW][:, perm], pa, atol=1e-12)  # Φ'[σv, σc] = Φ[v, c]
    beta_a, beta_b = M.beta_ord(pa[None]), M.beta_ord(pb[None])
    assert np.allclose(beta_b[SW], -beta_a, atol=1e-12)
    assert abs(beta_a).max() > 0.01  # the toy judge has a first-position lean to negate


def test_swapping_the_responses_keeps_the_order_bias():
    # the content swap: A is the old B, and the judge's order AB is the old order BA
    comps = make_toy(n=6, seed=8)
    sw = {"A": "B", "B": "A", "T": "T"}
    swapped = [
        dataclasses.replace(c, labels=tuple(dataclasses.replace(h, label=sw[h.label]) for h in c.labels),
                            judge=JudgePair(sw[c.judge.ba], sw[c.judge.ab]))
        for c in comps
    ]
    _, _, a = posterior(comps)
    _, _, b = posterior(swapped)
    assert np.allclose(M.beta_ord(b.posterior_mean()["phi"])[SW], M.beta_ord(a.posterior_mean()["phi"]), atol=1e-12)


def test_the_uninformative_label_set_leaves_the_posterior_unchanged():
    comps = make_toy(n=5, seed=6)
    padded = [dataclasses.replace(c, labels=(*c.labels, HumanLabel("x", frozenset("ABT"), "crowd"))) for c in comps]
    _, _, a = posterior(comps)
    _, _, b = posterior(padded)
    assert np.allclose(a.marginals(), b.marginals(), atol=1e-12)
    assert a.log_evidence == pytest.approx(b.log_evidence, abs=1e-12)


def test_exact_sampling_matches_its_mixture_means():
    _, _, rec = posterior(make_toy(n=4, seed=1))
    draws = rec.sample(20000, np.random.default_rng(0))
    assert np.allclose(draws["pi"].mean(0), rec.posterior_mean()["pi"], atol=0.01)


def test_pooled_group_means_are_refused():
    s = M.encode_stream(make_toy(n=2))
    with pytest.raises(ConfigError, match="group_means='fixed'"):
        ExactRecursion(M.prior_arrays(JudgePrior(group_means="pooled"), s))
