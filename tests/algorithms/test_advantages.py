import pytest
import torch

from troupe.algorithms.advantages import dr_grpo_advantage, grpo_advantage, rloo_advantage
from troupe.platform.registry import ADVANTAGES


def test_grpo_advantage_hand_values():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 5.0, 5.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1])
    a = grpo_advantage(r, g, eps=0.0 + 1e-12)
    std = torch.tensor([1.0, 0.0, 0.0, 1.0]).std()  # Bessel-corrected, as in DeepSeekMath / TRL
    assert torch.allclose(a[:4], (torch.tensor([1.0, 0.0, 0.0, 1.0]) - 0.5) / std, atol=1e-5)
    assert torch.equal(a[4:], torch.zeros(2))  # a group with one reward has no signal


def test_dr_grpo_is_mean_centred_only():
    r = torch.tensor([3.0, 1.0, 2.0])
    assert torch.allclose(dr_grpo_advantage(r, torch.zeros(3, dtype=torch.long)), torch.tensor([1.0, -1.0, 0.0]))


def test_rloo_leave_one_out():
    r = torch.tensor([3.0, 1.0, 2.0])
    # r_i - mean of the others: 3-1.5, 1-2.5, 2-2
    assert torch.allclose(rloo_advantage(r, torch.zeros(3, dtype=torch.long)), torch.tensor([1.5, -1.5, 0.0]))


def test_groups_need_not_be_contiguous_and_match_trl_formula():
    torch.manual_seed(0)
    r = torch.rand(12)
    g = torch.tensor([0, 1, 2] * 4)
    a = grpo_advantage(r, g)
    for k in range(3):
        rk = r[g == k]
        assert torch.allclose(a[g == k], (rk - rk.mean()) / (rk.std() + 1e-4), atol=1e-6)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_advantages_sum_to_zero_per_group(name):
    r = torch.rand(8)
    a = ADVANTAGES.get(name)(r, torch.arange(2).repeat_interleave(4))
    assert torch.allclose(a.view(2, 4).sum(1), torch.zeros(2), atol=1e-5)
