"""Learner options a post-training user expects: the learning-rate schedule (and its resume),
gradient accumulation, gradient checkpointing, bf16 autocast and the entropy bonus."""

import math

import pytest
import torch

from troupe.actors.learner import Learner, LearnerConfig
from troupe.actors.lr_schedule import lr_factor
from troupe.actors.rollout_hf import HFRolloutEngine
from troupe.actors.sampling import SamplingConfig
from troupe.platform.errors import ConfigError

PROMPTS = ["12+34=", "5+7=", "99+1=", "40+2="]
SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=6)
ADV = torch.linspace(-1, 1, 8)


@pytest.fixture(scope="module")
def batch(tiny_model_dir):
    return HFRolloutEngine(tiny_model_dir).generate(PROMPTS * 2, SAMPLING, seed=3)


def learner(path, run_steps=None, device="cpu", **cfg):
    return Learner(path, {"lr": 1e-2, **cfg}, max_len=6, run_steps=run_steps, device=device)


def grads(lrn):
    return {n: p.grad.clone() for n, p in lrn.model.named_parameters() if p.grad is not None}


# -- the schedule -------------------------------------------------------------------------------
def test_lr_factor_warms_up_from_zero_then_decays_to_the_floor():
    assert [lr_factor(s, "constant", warmup_steps=4) for s in range(6)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    # warm-up 2, decay over steps 2..6: half way (step 4) is 1/2 for both; the floor from step 6 on
    for schedule in ("linear", "cosine"):
        f = [lr_factor(s, schedule, 2, 6, min_lr_ratio=0.1) for s in range(9)]
        assert f[:3] == pytest.approx([0.0, 0.5, 1.0]) and f[4] == pytest.approx(0.55)
        assert f[6:] == pytest.approx([0.1] * 3)
    assert lr_factor(3, "linear", 2, 6) == pytest.approx(0.75)
    assert lr_factor(3, "cosine", 2, 6) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))


def test_schedule_length_defaults_to_run_steps_times_minibatches(tiny_model_dir):
    assert learner(tiny_model_dir, run_steps=5, lr_schedule="linear", num_minibatches=2).total_steps == 10
    assert learner(tiny_model_dir, run_steps=5, lr_schedule="linear", total_steps=3).total_steps == 3
    with pytest.raises(ConfigError, match="learner.total_steps"):
        learner(tiny_model_dir, lr_schedule="cosine")


def test_bad_learner_options_name_their_key():
    for kw, key in [({"lr_schedule": "step"}, "lr_schedule"), ({"warmup_steps": -1}, "warmup_steps"),
                    ({"total_steps": 0}, "total_steps"), ({"min_lr_ratio": 1.5}, "min_lr_ratio"),
                    ({"entropy_coef": -0.1}, "entropy_coef"), ({"autocast": "fp16"}, "autocast"),
                    ({"gradient_checkpointing": "yes"}, "gradient_checkpointing")]:
        with pytest.raises(ConfigError, match=rf"'learner\.{key}'"):
            LearnerConfig(**kw)


@pytest.mark.timeout(120)
def test_lr_is_logged_per_update_and_resumes_exactly_from_a_checkpoint(tiny_model_dir, batch):
    cfg = {"lr_schedule": "cosine", "warmup_steps": 1, "min_lr_ratio": 0.1}
    a = learner(tiny_model_dir, run_steps=4, **cfg)
    lrs = [a.update(batch, {"advantages": ADV})["lr"] for _ in range(2)]
    packed, meta = a.get_state()
    state = ({k: (arr.copy(), name) for k, (arr, name) in packed.items()}, meta)  # a checkpoint, not views of `a`
    lrs.append(a.update(batch, {"advantages": ADV})["lr"])
    assert lrs == pytest.approx([0.0, 1e-2, 1e-2 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 3)))])
    b = learner(tiny_model_dir, run_steps=4, **cfg)
    b.set_state(*state)
    assert b.update(batch, {"advantages": ADV})["lr"] == lrs[2]
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb), name


# -- the gradient ---------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_micro_batches_accumulate_to_the_gradient_of_one_batch(tiny_model_dir, batch):
    small = learner(tiny_model_dir, micro_batch_size=2, grad_clip=0.0)  # 4 micro-batches of 2
    whole = learner(tiny_model_dir, micro_batch_size=64, grad_clip=0.0)  # 1 batch of 8
    ms, mw = small.update(batch, {"advantages": ADV}), whole.update(batch, {"advantages": ADV})
    gs, gw = grads(small), grads(whole)
    assert gs.keys() == gw.keys() and ms["grad_norm"] > 0
    # The same sum in another order and other matmul shapes: float32 roundoff, a few ulps of the
    # largest terms (about 1e-7 relative), never a missing or doubled micro-batch (25% or 100% off).
    assert ms["grad_norm"] == pytest.approx(mw["grad_norm"], rel=1e-5)
    for name, g in gs.items():
        torch.testing.assert_close(g, gw[name], rtol=1e-4, atol=1e-6 * float(gw[name].abs().max()) + 1e-12)


@pytest.mark.timeout(120)
def test_gradient_checkpointing_gives_the_same_gradient(tiny_model_dir, batch):
    plain = learner(tiny_model_dir, grad_clip=0.0)
    ckpt = learner(tiny_model_dir, grad_clip=0.0, gradient_checkpointing=True)
    assert any(getattr(m, "gradient_checkpointing", False) for m in ckpt.model.modules())
    plain.update(batch, {"advantages": ADV})
    ckpt.update(batch, {"advantages": ADV})
    gp = grads(plain)
    for name, g in grads(ckpt).items():  # the recomputed forward is the same forward
        torch.testing.assert_close(g, gp[name], rtol=1e-5, atol=1e-7)


@pytest.mark.timeout(120)
def test_entropy_coef_alone_moves_the_policy(tiny_model_dir, batch):
    zero = {"advantages": torch.zeros(8)}
    assert learner(tiny_model_dir).update(batch, zero)["grad_norm"] == 0.0  # no advantage, no gradient
    m = learner(tiny_model_dir, entropy_coef=0.1).update(batch, zero)
    assert m["grad_norm"] > 0 and m["loss/entropy"] < 0  # the bonus has a graph, and lowers the loss


# -- bf16 autocast --------------------------------------------------------------------------------
def check_autocast_step(lrn, batch):
    before = lrn.logprobs(batch)
    m = lrn.update(batch, {"advantages": ADV})
    assert all(math.isfinite(v) for v in m.values()) and m["grad_norm"] > 0
    assert all(p.dtype == torch.float32 for p in lrn.model.parameters())  # autocast leaves the weights alone
    after = lrn.logprobs(batch)
    assert torch.isfinite(after).all() and not torch.equal(before, after)


@pytest.mark.timeout(180)
def test_bf16_autocast_trains_on_cpu_with_a_finite_loss(tiny_model_dir, batch):
    check_autocast_step(learner(tiny_model_dir, autocast="bf16"), batch)


@pytest.mark.gpu
@pytest.mark.timeout(180)
def test_bf16_autocast_with_gradient_checkpointing_trains_on_cuda(tiny_model_dir, batch):
    check_autocast_step(learner(tiny_model_dir, device="cuda", autocast="bf16", gradient_checkpointing=True), batch)
