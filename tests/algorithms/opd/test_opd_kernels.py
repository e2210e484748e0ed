"""The noisy expert over a vocabulary: kernels, margins, majority votes (ALGORITHMS.md §B.1, §B.6)."""

import math

import pytest
import torch

from troupe.algorithms.opd import kernels, noise
from troupe.algorithms.opd.kernels import NoiseConfig
from troupe.platform.errors import ConfigError

V = 12
ANSWER = list(range(2, 12))  # ten answer tokens (the digits), two others (say, the end token and a letter)


def one_hot_log(ids, vocab=V):
    out = torch.full((len(ids), vocab), float("-inf"))
    out[torch.arange(len(ids)), torch.tensor(ids)] = 0.0
    return out


@pytest.mark.parametrize("kernel", ["uniform", "topk", "step"])
@pytest.mark.parametrize("eps", [0.0, 0.3, 0.9])
def test_noisy_rows_are_distributions_that_keep_the_clean_mode(kernel, eps):
    cfg = NoiseConfig(eps=eps, kernel=kernel, top_k=4, floor=0.0)
    clean = torch.log_softmax(torch.randn(6, V) * 3, -1)
    noisy = kernels.noisy_logprobs(clean, cfg, ANSWER).exp()
    assert torch.allclose(noisy.sum(-1), torch.ones(6, dtype=noisy.dtype), atol=1e-6)
    # a deterministic expert: the clean action stays the mode, by the margin of §B.1
    ids = [0, 3, 7, 11]
    noisy = kernels.noisy_logprobs(one_hot_log(ids), cfg, ANSWER).exp().double()
    for row, a in zip(noisy, ids, strict=True):
        others = torch.cat([row[:a], row[a + 1:]])
        gamma = float(row[a] - others.max())
        # the step kernel leaves positions off the steps (the end token) noiseless
        expected = kernels.mode_margin_of(cfg, V) if (kernel != "step" or a in ANSWER) else 1.0
        assert gamma == pytest.approx(expected, abs=1e-6)


def test_uniform_kernel_is_the_tabular_one():
    cfg = NoiseConfig(eps=0.3, floor=0.0)
    noisy = kernels.noisy_logprobs(one_hot_log([4]), cfg).exp()[0].double()
    expected = noise.noisy_expert(torch.eye(V)[4].numpy(), 0.3)
    assert torch.allclose(noisy, torch.tensor(expected), atol=1e-12)
    assert float(noisy[4]) == pytest.approx(noise.clean_step_prob(0.3, V))


def test_topk_kernel_spreads_its_mass_over_the_experts_top_k_only():
    cfg = NoiseConfig(eps=0.5, kernel="topk", top_k=3, floor=0.0)
    clean = torch.log(torch.tensor([[0.6, 0.25, 0.1, 0.05] + [0.0] * (V - 4)]))
    noisy = kernels.noisy_logprobs(clean, cfg).exp()[0].double()
    assert noisy[:3].tolist() == pytest.approx([0.5 * 0.6 + 0.5 / 3, 0.5 * 0.25 + 0.5 / 3, 0.5 * 0.1 + 0.5 / 3])
    assert float(noisy[3]) == pytest.approx(0.5 * 0.05)
    assert float(noisy[4:].sum()) == 0.0


def test_step_kernel_writes_a_wrong_step_and_leaves_the_end_alone():
    cfg = NoiseConfig(eps=0.3, kernel="step", floor=0.0)
    noisy = kernels.noisy_logprobs(one_hot_log([5, 0]), cfg, ANSWER).exp().double()
    assert float(noisy[0, 5]) == pytest.approx(0.7)
    assert float(noisy[0, [a for a in ANSWER if a != 5]].sum()) == pytest.approx(0.3)
    assert float(noisy[0, 0]) == 0.0 and float(noisy[0, 1]) == 0.0  # never a non-answer token
    assert float(noisy[1, 0]) == pytest.approx(1.0)  # the end token is not a step: no noise


def test_confusion_kernel_follows_its_row_and_its_margin():
    A = len(ANSWER)
    m = torch.full((A, A), 0.0)
    for j in range(A):
        m[j, (j + 1) % A] = 1.0  # always the next digit
    cfg = NoiseConfig(eps=0.4, kernel="confusion", confusion=m.tolist(), floor=0.0)
    noisy = kernels.noisy_logprobs(one_hot_log([ANSWER[3]]), cfg, ANSWER).exp().double()[0]
    assert float(noisy[ANSWER[3]]) == pytest.approx(0.6)
    assert float(noisy[ANSWER[4]]) == pytest.approx(0.4)
    assert kernels.mode_margin_of(cfg, V) == pytest.approx(0.2)  # 0.6 - 0.4: mode kept while ε < 1/2


def test_majority_vote_errs_less_often_than_hoeffding_allows():
    cfg = NoiseConfig(eps=0.6)
    gamma = kernels.mode_margin_of(cfg, V)
    delta, horizon = 0.2, 4
    m = noise.votes_needed(gamma, V, horizon, delta)
    noisy = kernels.noisy_logprobs(one_hot_log([7] * 2000), cfg)
    got = kernels.majority_targets(noisy, m, torch.Generator().manual_seed(0))
    error = float((got != 7).double().mean())
    assert error <= delta / horizon
    # a single draw errs at the noise rate
    one = kernels.majority_targets(noisy, 1, torch.Generator().manual_seed(0))
    assert float((one != 7).double().mean()) == pytest.approx(0.6 * (1 - 1 / V), abs=0.04)
    assert m == math.ceil(2 / gamma**2 * math.log(2 * V * horizon / delta))


@pytest.mark.parametrize("bad, match", [
    ({"eps": 1.0}, "teacher.noise.eps"),
    ({"eps": -0.1}, "teacher.noise.eps"),
    ({"kernel": "gaussian"}, "teacher.noise.kernel"),
    ({"kernel": "confusion"}, "teacher.noise.confusion"),
    ({"kernel": "confusion", "confusion": [[1.0, 0.0], [0.0, 1.0]]}, r"shape \(2, 2\): expected \(10, 10\)"),
    ({"kernel": "confusion", "confusion": [[0.5] * 10] * 10}, "row sums"),
    ({"top_k": 0}, "teacher.noise.top_k"),
    ({"floor": 0.5}, "teacher.noise.floor"),
])
def test_bad_noise_settings_name_their_key(bad, match):
    with pytest.raises(ConfigError, match=match):
        NoiseConfig(**bad)


def test_the_floor_keeps_every_reverse_kl_finite():
    from troupe.algorithms.opd import losses

    student = torch.randn(3, V)
    sparse = kernels.noisy_logprobs(one_hot_log([2, 5, 9]), NoiseConfig(eps=0.3, kernel="step", floor=0.0), ANSWER)
    assert torch.isinf(losses.reverse_kl(student, sparse)).all()
    floored = kernels.noisy_logprobs(one_hot_log([2, 5, 9]), NoiseConfig(eps=0.3, kernel="step"), ANSWER)
    rkl = losses.reverse_kl(student.requires_grad_(), floored)
    rkl.sum().backward()
    assert torch.isfinite(rkl).all() and torch.isfinite(student.grad).all()
    assert (floored.exp() - sparse.exp()).abs().max() < 1e-5  # the floor moves nothing visibly


def test_a_top_k_larger_than_the_vocabulary_is_refused():
    with pytest.raises(ConfigError, match="teacher.noise.top_k=50 is larger than the vocabulary"):
        kernels.noisy_logprobs(one_hot_log([1]), NoiseConfig(kernel="topk", top_k=50))
