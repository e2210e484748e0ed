"""§B.6: the distillation losses, the noisy expert and the tabular benchmark's methods."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from troupe.algorithms.opd import losses, noise, tabular


# -- 1. the noisy expert ---------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [0.0, 0.3, 0.6, 0.99])
def test_noisy_expert_rows_sum_to_one_and_uniform_noise_preserves_the_mode(eps):
    clean = noise.one_hot(np.array([0, 2, 1]), 3)
    noisy = noise.noisy_expert(clean, eps)
    assert np.allclose(noisy.sum(-1), 1.0)
    # with uniform noise the margin is exactly 1 - eps, positive for every eps < 1
    assert np.allclose(noise.mode_margin(noisy, np.array([0, 2, 1])), 1.0 - eps)


def test_mode_is_lost_under_adversarial_noise_above_one_half():
    clean = noise.one_hot(0, 3)
    nu = noise.one_hot(1, 3)  # all noise on one wrong action
    assert noise.mode_margin(noise.noisy_expert(clean, 0.4, nu), 0) > 0
    assert noise.mode_margin(noise.noisy_expert(clean, 0.6, nu), 0) < 0


# -- 2. closed form of the noisy expert's own success -------------------------------------------------
def test_sampling_success_closed_form_matches_monte_carlo():
    eps, V, H = 0.3, 3, 8
    expert = tabular.Expert(V, eps, salt=7)
    rng = np.random.default_rng(0)
    n = 20_000
    hits = 0
    for _ in range(n):
        traj = tabular.sample_trajectory(expert.noisy, H, rng)
        hits += all(a == expert.clean(s) for s, a in traj)
    want = noise.success_prob_sampling(eps, V, H)
    assert want == pytest.approx(0.8**8)
    assert abs(hits / n - want) < 4 * math.sqrt(want * (1 - want) / n)


# -- 3. tabular BC coverage ---------------------------------------------------------------------------
def test_bc_visits_of_clean_states_match_n_q_to_the_h_minus_one():
    eps, V, H, n = 0.3, 3, 6, 4000
    expert = tabular.Expert(V, eps, salt=1)
    rng = np.random.default_rng(1)
    _, counts = tabular.behaviour_cloning([tabular.sample_trajectory(expert.noisy, H, rng) for _ in range(n)], V)
    for h, s in enumerate(expert.clean_path(H), start=1):
        want = noise.expected_clean_visits(n, eps, V, h)
        got = counts[s].sum()
        assert abs(got - want) < 4 * math.sqrt(want), (h, got, want)


# -- 4. GKD's generalised JSD, with TRL's implementation as the oracle --------------------------------------
def _logits(seed, shape=(2, 5, 7)):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_generalized_jsd_endpoints_are_the_two_kls():
    s, t = _logits(0), torch.log_softmax(_logits(1), -1)
    ps, pt = torch.softmax(s, -1), t.exp()
    fkl = (pt * (t - torch.log(ps))).sum(-1)  # KL(T||S)
    rkl = (ps * (torch.log(ps) - t)).sum(-1)  # KL(S||T)
    assert torch.allclose(losses.generalized_jsd(s, t, beta=0.0), fkl, atol=1e-6)
    assert torch.allclose(losses.generalized_jsd(s, t, beta=1.0), rkl, atol=1e-6)
    assert torch.allclose(losses.reverse_kl(s, t), rkl, atol=1e-6)


@pytest.mark.parametrize("beta", [0.0, 0.25, 0.5, 1.0])
def test_generalized_jsd_matches_trl(beta):
    gkd = pytest.importorskip("trl.experimental.gkd.gkd_trainer")
    s, t = _logits(2), _logits(3)
    want = gkd.GKDTrainer.generalized_jsd_loss(s, t, beta=beta, reduction="sum")
    assert torch.allclose(losses.generalized_jsd(s, torch.log_softmax(t, -1), beta).sum(), want, atol=1e-5)


def test_jsd_is_nonnegative_zero_iff_equal_and_symmetric_at_one_half():
    s, t = _logits(4), _logits(5)
    jsd = losses.generalized_jsd(s, torch.log_softmax(t, -1), 0.5)
    assert (jsd > 0).all()
    assert torch.allclose(losses.generalized_jsd(s, torch.log_softmax(s, -1), 0.5), torch.zeros(2, 5), atol=1e-6)
    swapped = losses.generalized_jsd(t, torch.log_softmax(s, -1), 0.5)
    assert torch.allclose(jsd, swapped, atol=1e-6)


def test_kl_gradient_is_finite_when_a_top_k_teacher_excludes_tokens():
    s = _logits(6, (3, 7)).requires_grad_()
    t = torch.log_softmax(_logits(7, (3, 7)), -1)
    t[:, 4:] = float("-inf")  # a top-4 teacher
    losses.generalized_jsd(s, t, 0.0).sum().backward()
    assert torch.isfinite(s.grad).all()


# -- 5. sampled reverse KL ----------------------------------------------------------------------------
def test_sampled_rkl_advantage_is_minus_the_log_ratio_and_averages_to_minus_kl():
    s, t = _logits(8, (4, 6)), torch.log_softmax(_logits(9, (4, 6)), -1)
    lps = torch.log_softmax(s, -1)
    adv = losses.sampled_rkl_advantage(lps, t)  # at every token, as if each were sampled
    assert torch.equal(adv, -(lps - t))
    expectation = (lps.exp() * adv).sum(-1)
    assert torch.allclose(expectation, -losses.reverse_kl(s, t), atol=1e-6)


# -- 6. minimisers over the simplex, by gradient descent on the loss functions ---------------------------
def _minimise(loss_name, teacher_probs, steps=3000, lr=0.5):
    z = torch.zeros(len(teacher_probs), requires_grad=True)
    opt = torch.optim.Adam([z], lr=lr)
    t = torch.log(torch.tensor(teacher_probs, dtype=torch.float32))
    for _ in range(steps):
        opt.zero_grad()
        losses.ne_loss(loss_name, z, t).backward()
        opt.step()
    return torch.softmax(z, -1).detach().numpy()


def test_teacher_likelihood_and_hard_ce_minimisers_are_the_teachers_mode_and_rkl_is_the_teacher():
    teacher = noise.noisy_expert(noise.one_hot(1, 3), 0.3)  # (0.1, 0.8, 0.1)
    for name in ("tl", "hard"):
        p = _minimise(name, teacher)
        assert p[1] > 0.99, (name, p)
    assert np.allclose(_minimise("rkl", teacher), teacher, atol=1e-3)
    # the tabular methods use exactly these minimisers
    assert np.array_equal(noise.one_hot(int(teacher.argmax()), 3), [0, 1, 0])
    with pytest.raises(ValueError, match="opd.ne_loss"):
        losses.ne_loss("fkl", torch.zeros(3), torch.zeros(3))


# -- 7. NE-OPD with a clean teacher is DAgger -----------------------------------------------------------
def test_ne_opd_with_a_clean_teacher_is_dagger_and_learns_one_depth_per_episode():
    H = 10
    cfg = tabular.TabularConfig(eps=0.0, episodes=H)
    out = tabular.run_method("ne_opd", H, cfg, seed=3)
    assert out["j_greedy"] == 1.0 and out["j_t1"] == 1.0 and out["agreement"] == 1.0
    assert out["teacher_tokens"] == H * H
    # with fewer episodes than depths the greedy roll-in cannot have reached the last state
    short = tabular.run_method("ne_opd", H, tabular.TabularConfig(eps=0.0, episodes=H // 2), seed=3)
    assert short["agreement"] < 1.0


# -- 8. majority votes against the Hoeffding bound ------------------------------------------------------
def test_majority_vote_errs_less_often_than_the_hoeffding_bound():
    eps, V, H, delta = 0.6, 3, 8, 0.2
    gamma = 1 - eps
    m = noise.votes_needed(gamma, V, H, delta)
    assert m == math.ceil(2 / gamma**2 * math.log(2 * V * H / delta))
    teacher = noise.noisy_expert(noise.one_hot(0, V), eps)
    rng = np.random.default_rng(0)
    trials = 4000
    errors = sum(noise.majority_vote(rng.choice(V, size=m, p=teacher), V, rng) != 0 for _ in range(trials))
    assert errors / trials <= delta / H
    with pytest.raises(ValueError, match="gamma"):
        noise.votes_needed(0.0, V, H, delta)


# -- the §B.5 claim at smoke scale ----------------------------------------------------------------------
def test_tabular_claim_at_smoke_scale():
    """H=24, N=200 (4 of the benchmark's 20 seeds): BC and OPD-KL sample the clean sequence about
    as often as the noisy teacher does (0.8^24 = 0.005) and mostly fail greedily too, since
    neither has seen the deep clean states often enough; NE-OPD is exact, with logit or sample access."""
    cfg = tabular.TabularConfig()
    res = tabular.sweep(("bc", "opd_kl", "ne_opd", "ne_opd_vote"), (24,), seeds=4, cfg=cfg)
    mean = {m: {k: float(np.mean(v)) for k, v in res[m]["24"].items()} for m in res}
    for m in ("ne_opd", "ne_opd_vote"):
        assert mean[m]["j_t1"] == 1.0 and mean[m]["j_greedy"] == 1.0 and mean[m]["agreement"] == 1.0
    for m in ("bc", "opd_kl"):
        assert mean[m]["j_t1"] < 0.05
        assert mean[m]["j_greedy"] < 0.9
    assert mean["opd_kl"]["j_greedy"] < 0.2  # its T=1 roll-in reaches the deep states more rarely still
    assert res["ne_opd_vote"]["24"]["teacher_tokens"][0] > res["ne_opd"]["24"]["teacher_tokens"][0]


def test_an_expert_of_the_last_tokens_lets_offline_data_generalise():
    """§B.5's caveat: when the expert depends on the last 2 tokens and the student shares that
    view, every deep state is one the data has taught, and BC recovers the expert at H=24."""
    cfg = tabular.TabularConfig(context=2)
    expert = tabular.Expert(3, 0.3, salt=0, context=2)
    assert expert.clean((0, 1, 2, 1)) == expert.clean((2, 2, 1))  # same last two tokens
    res = tabular.sweep(("bc", "ne_opd"), (24,), seeds=4, cfg=cfg)
    assert np.mean(res["bc"]["24"]["j_greedy"]) == 1.0
    assert np.mean(res["ne_opd"]["24"]["j_greedy"]) == 1.0


def test_bad_config_names_the_key():
    with pytest.raises(ValueError, match="opd.eps"):
        tabular.TabularConfig(eps=1.0)
    with pytest.raises(ValueError, match="opd.context"):
        tabular.TabularConfig(context=-1)
    for key, bad in (("kd_temperature", 0.0), ("explore", 1.5), ("delta", 0.0), ("votes", -1)):
        with pytest.raises(ValueError, match=f"opd.{key}"):
            tabular.TabularConfig(**{key: bad})
    with pytest.raises(ValueError, match="opd method"):
        tabular.run_method("dpo", 4, tabular.TabularConfig(), 0)


# -- noise kernels (§B.1: ν uniform, a wrong step, or a fixed confusion) -----------------------------------
@pytest.mark.parametrize("vocab", [2, 3, 5])
@pytest.mark.parametrize("kernel", tabular.KERNELS)
def test_every_kernel_and_its_noisy_teacher_have_rows_that_sum_to_one(kernel, vocab):
    nu = tabular.kernel_matrix(kernel, vocab)
    assert nu.shape == (vocab, vocab) and (nu >= 0).all()
    assert np.allclose(nu.sum(1), 1.0)
    rows = tabular.TabularConfig(vocab=vocab, eps=0.4, kernel=kernel).teacher_rows()
    assert np.allclose(rows.sum(1), 1.0)
    assert np.allclose(rows.diagonal(), 0.6 + 0.4 * nu.diagonal())


def test_kernel_shapes_the_noise_exactly():
    assert np.array_equal(tabular.kernel_matrix("confusion", 3), [[0, 1, 0], [0, 0, 1], [1, 0, 0]])  # a -> a+1
    assert np.allclose(tabular.kernel_matrix("step", 3), [[0, 0.5, 0.5], [0.5, 0, 0.5], [0.5, 0.5, 0]])
    # the uniform kernel is the default expert, row for row
    uniform = tabular.Expert(3, 0.3, nu=tabular.kernel_matrix("uniform", 3))
    assert np.array_equal(uniform._rows, tabular.Expert(3, 0.3)._rows)
    assert tabular.TabularConfig().kernel == "uniform"


@pytest.mark.parametrize("eps", [0.0, 0.2, 0.45, 0.7])
def test_kernel_margin_matches_each_closed_form(eps):
    V = 4
    assert tabular.kernel_margin(eps, tabular.kernel_matrix("uniform", V)) == pytest.approx(1 - eps)
    assert tabular.kernel_margin(eps, tabular.kernel_matrix("step", V)) == pytest.approx(1 - eps - eps / (V - 1))
    assert tabular.kernel_margin(eps, tabular.kernel_matrix("confusion", V)) == pytest.approx(1 - 2 * eps)
    c = np.random.default_rng(0).dirichlet(np.ones(V), size=V)
    want = min((1 - eps + eps * c[jj, jj]) - max(eps * c[jj, k] for k in range(V) if k != jj) for jj in range(V))
    assert tabular.kernel_margin(eps, c) == pytest.approx(want)


def test_the_cyclic_confusion_loses_the_mode_at_one_half_and_majority_vote_then_learns_the_wrong_action():
    """§B.1's condition is necessary: below ε = 1/2 the vote finds a*, above it finds a*+1."""
    nu = tabular.kernel_matrix("confusion", 3)
    assert tabular.kernel_margin(0.5, nu) == 0.0 and tabular.kernel_margin(0.6, nu) < 0
    rng = np.random.default_rng(0)
    for a in range(3):
        teacher = noise.noisy_expert(noise.one_hot(a, 3), 0.6, nu[a])
        assert noise.majority_vote(rng.choice(3, size=400, p=teacher), 3, rng) == (a + 1) % 3
    H, votes = 6, 400
    for method in ("ne_opd", "ne_opd_vote"):
        lost = tabular.run_method(method, H, tabular.TabularConfig(kernel="confusion", eps=0.6, votes=votes), seed=2)
        assert lost["j_greedy"] == 0.0 and lost["agreement"] == 0.0, method
        kept = tabular.run_method(method, H, tabular.TabularConfig(kernel="confusion", eps=0.4, votes=votes), seed=2)
        assert kept["j_greedy"] == 1.0 and kept["agreement"] == 1.0, method
    # BC's argmax follows the same mode (its deep states see few trajectories, so only J is exact)
    assert tabular.run_method("bc", H, tabular.TabularConfig(kernel="confusion", eps=0.6), seed=2)["j_greedy"] == 0.0
    # without a margin there is no Hoeffding number of votes to fall back on
    with pytest.raises(ValueError, match="opd.votes"):
        tabular.run_method("ne_opd_vote", H, tabular.TabularConfig(kernel="confusion", eps=0.6), seed=2)


def test_the_hoeffding_votes_follow_the_kernels_margin():
    for kernel in tabular.KERNELS:
        cfg = tabular.TabularConfig(kernel=kernel, eps=0.3)
        want = noise.votes_needed(tabular.kernel_margin(0.3, cfg.nu()), 3, 8, cfg.delta)
        assert tabular.votes_per_visit(cfg, 8) == want
        assert tabular.run_method("ne_opd_vote", 8, dataclasses.replace(cfg, episodes=3), 0)["teacher_tokens"] == 3 * 8 * want


def test_bad_kernel_settings_name_the_key():
    with pytest.raises(ValueError, match="opd.kernel"):
        tabular.TabularConfig(kernel="gaussian")
    with pytest.raises(ValueError, match="opd.confusion has shape"):
        tabular.TabularConfig(kernel="confusion", confusion=[[0.0, 1.0], [1.0, 0.0]])
    with pytest.raises(ValueError, match="opd.confusion"):
        tabular.TabularConfig(kernel="confusion", confusion=[[1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    with pytest.raises(ValueError, match="opd.confusion row 1 sums to 0.9"):
        tabular.TabularConfig(kernel="confusion", confusion=[[0, 1, 0], [0, 0, 0.9], [1, 0, 0]])
    with pytest.raises(ValueError, match="opd.confusion"):
        tabular.TabularConfig(kernel="confusion", confusion=[[0, 1.5, -0.5], [0, 0, 1], [1, 0, 0]])
    with pytest.raises(ValueError, match="opd.kernel=confusion"):
        tabular.TabularConfig(kernel="uniform", confusion=tabular.cyclic_confusion(3))
    ok = tabular.TabularConfig(kernel="confusion", confusion=[[0.5, 0.5, 0], [0, 0.5, 0.5], [0.5, 0, 0.5]])
    assert tabular.kernel_margin(0.3, ok.nu()) == pytest.approx(0.7 + 0.15 - 0.15)


# -- §B.5's N sweep: BC's clean-path chain --------------------------------------------------------------
def test_bc_on_the_clean_path_has_the_distribution_of_tabular_bc():
    H, N, seeds = 4, 5, 1500
    cfg = tabular.TabularConfig(episodes=N)
    runs = [tabular.run_method("bc", H, cfg, seed) for seed in range(seeds)]
    e = tabular.Expert(3, 0.3, salt=0)
    clean = np.array([[e.clean(s) for s in e.clean_path(H)]] * 100_000)
    chain = tabular.bc_on_clean_path(N, clean, cfg.teacher_rows(), np.random.default_rng(0))
    for metric in ("j_t1", "j_greedy"):
        got = np.array([r[metric] for r in runs])
        assert abs(got.mean() - chain[metric].mean()) < 4 * got.std() / math.sqrt(seeds), metric


def test_bc_needs_one_clean_trajectory_and_more_noisy_ones_the_deeper_the_horizon():
    assert tabular.bc_episodes_needed(12, tabular.TabularConfig(eps=0.0), experts=50) == 1
    cfg = tabular.TabularConfig()
    shallow, deep = (tabular.bc_episodes_needed(h, cfg, experts=500) for h in (4, 12))
    assert 1 < shallow < deep
    assert tabular.bc_episodes_needed(12, cfg, experts=500, grid=(1, 2, 3)) is None
    with pytest.raises(ValueError, match="opd.context"):
        tabular.bc_episodes_needed(4, tabular.TabularConfig(context=2))
