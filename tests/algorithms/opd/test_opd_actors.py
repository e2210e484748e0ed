"""The OPD roles in process: the noisy teacher (program and LM), the buffer, the distillation learner."""

import numpy as np
import pytest
import torch

from troupe.actors.distill_learner import DistillLearner, one_hot_logprobs
from troupe.actors.learner import LearnerConfig
from troupe.actors.models import TinyLMSpec, build_tiny_lm, save_model, train_tokenizer
from troupe.actors.rollout_hf import HFRolloutEngine
from troupe.actors.sampling import SamplingConfig
from troupe.algorithms.opd import losses
from troupe.algorithms.opd.buffer import DistillBuffer
from troupe.algorithms.opd.teacher import NoisyTeacher
from troupe.envs.chain import ChainTask, chain_exact
from troupe.platform.errors import ConfigError

TASK = ChainTask(ChainTask.Config(kind="recurrence", horizon=4))
SPEC = TinyLMSpec(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    d = tmp_path_factory.mktemp("student")
    tok = train_tokenizer(TASK.corpus(500), 384)
    save_model(build_tiny_lm(SPEC, tok, seed=0), tok, d)
    return str(d)


def rows(n, seed=0):
    return TASK.train_rows(n, np.random.default_rng(seed))


def rollout(student, n=6, temperature=1.0):
    engine = HFRolloutEngine(student)
    r = rows(n)
    return engine.generate([x["prompt"] for x in r], SamplingConfig(temperature=temperature, max_new_tokens=8), r,
                           seed=1)


def test_a_clean_program_teacher_writes_the_answer_and_puts_all_mass_on_it(student):
    teacher = NoisyTeacher("program", student, {"eps": 0.0})
    r = rows(5)
    traj = teacher.trajectories(r, 1.0, 8, key="bc")
    assert [chain_exact(t, x["steps"]) for t, x in zip(traj["completion"], r, strict=True)] == [1.0] * 5
    assert torch.equal(traj["target_ids"], traj["completion_ids"])
    scored = teacher.distributions(traj, key="bc")
    mask = traj["completion_mask"].bool()
    # the teacher's log-prob of its own clean answer is 0 at every position (but for the floor)
    assert float(scored["teacher_logprobs"][mask].abs().max()) < 1e-5
    assert teacher.usage() == {"bc": 2 * int(mask.sum())}


def test_a_noisy_program_teacher_fails_as_often_as_its_closed_form(student):
    eps = 0.2
    teacher = NoisyTeacher("program", student, {"eps": eps, "kernel": "step"})
    r = rows(600, seed=4)
    traj = teacher.trajectories(r, 1.0, 8, seed=3)
    success = np.mean([chain_exact(t, x["steps"]) for t, x in zip(traj["completion"], r, strict=True)])
    # four steps a chain, each wrong w.p. ε; the end token is no step
    assert success == pytest.approx((1 - eps) ** 4, abs=0.06)
    assert teacher.trajectories(r[:50], 0.0, 8)["completion"] == [x["answer"] for x in r[:50]]  # greedy: the mode


def test_the_teacher_scores_the_students_own_tokens_and_votes(student):
    batch = rollout(student)
    teacher = NoisyTeacher("program", student, {"eps": 0.3})
    scored = teacher.distributions(batch)
    t = scored["targets"]
    assert t.shape == (*batch["completion_ids"].shape, teacher.vocab)
    assert torch.allclose(t.exp().sum(-1), torch.ones(t.shape[:2]), atol=1e-5)
    picked = t.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1) * batch["completion_mask"]
    assert torch.allclose(scored["teacher_logprobs"], picked)
    votes = teacher.votes(batch, 41)["target_ids"]
    assert torch.equal(votes, t.argmax(-1))  # 41 draws at ε = 0.3: the mode, every time here


def test_an_arms_teacher_draws_depend_on_its_seed_alone_not_on_other_arms_calls(student):
    """Each call's draws come from its own seed (the driver's (run seed, step, arm)): an arm's noisy
    trajectories are the same whether or not another arm asked the teacher first, so arms run
    apart compare with arms run together, and a resumed run draws the same."""
    r = rows(64, seed=5)
    alone = NoisyTeacher("program", student, {"eps": 0.5, "kernel": "step"})
    shared = NoisyTeacher("program", student, {"eps": 0.5, "kernel": "step"})
    shared.trajectories(rows(64, seed=6), 1.0, 8, key="other", seed=11)
    shared.votes(rollout(student), 5, key="other", seed=12)
    first = alone.trajectories(r, 1.0, 8, key="bc", seed=7)["completion"]
    assert shared.trajectories(r, 1.0, 8, key="bc", seed=7)["completion"] == first
    assert alone.trajectories(r, 1.0, 8, key="bc", seed=8)["completion"] != first  # the seed does draw


def test_an_lm_teacher_shares_the_scoring_path_and_must_share_the_vocabulary(student, tmp_path):
    batch = rollout(student)
    teacher = NoisyTeacher(student, student, {"eps": 0.0})  # the student as its own clean teacher
    from troupe.actors.scorer import Scorer

    own = Scorer(student).logprobs(batch)["logprobs"]
    scored = teacher.distributions(batch)
    assert torch.allclose(scored["teacher_logprobs"], own, atol=1e-5)
    other = train_tokenizer(["completely different words only"] * 50, 300)
    save_model(build_tiny_lm(SPEC, other, seed=0), other, tmp_path / "other")
    with pytest.raises(ConfigError, match="distillation needs a shared tokenizer"):
        NoisyTeacher(str(tmp_path / "other"), student, {"eps": 0.1})


def test_the_buffer_aggregates_samples_and_survives_a_checkpoint(student, tmp_path):
    teacher = NoisyTeacher("program", student, {"eps": 0.3})
    buf = DistillBuffer()
    a = teacher.distributions(rollout(student, 4))
    b = teacher.distributions(rollout(student, 3, temperature=0.0))
    assert buf.add("arm", a) == 4 and buf.add("arm", b) == 7
    draw = buf.sample("arm", 5, seed=11)
    assert len(draw) == 5 and draw["targets"].shape[-1] == teacher.vocab
    buf.save(str(tmp_path / "buf"))
    again = DistillBuffer()
    again.load(str(tmp_path / "buf"))
    same = again.sample("arm", 5, seed=11)
    for k in draw.tensors:
        assert torch.equal(draw[k], same[k]), k
    capped = DistillBuffer(capacity=5)
    capped.add("x", a)
    assert capped.add("x", b) == 5


def test_distill_steps_lower_each_loss_and_hard_targets_need_no_distribution(student):
    teacher = NoisyTeacher("program", student, {"eps": 0.3})
    batch = teacher.distributions(rollout(student, 8))
    for loss, kwargs in (("hard", {}), ("tl", {}), ("rkl", {}), ("jsd", {"beta": 0.5})):
        learner = DistillLearner(student, LearnerConfig(lr=1e-2))
        first = learner.distill(batch, loss, kwargs)["loss/distill"]
        for _ in range(15):
            last = learner.distill(batch, loss, kwargs)["loss/distill"]
        assert last < first, loss
    learner = DistillLearner(student, LearnerConfig(lr=1e-2))
    votes = batch.with_fields()
    votes.tensors.pop("targets")
    votes["target_ids"] = batch["targets"].argmax(-1)
    with pytest.raises(ConfigError, match="needs the teacher's distributions"):
        learner.distill(votes, "tl")
    with pytest.raises(ConfigError, match="takes"):
        learner.distill(batch, "hard", {"beta": 0.5})
    assert learner.distill(votes, "hard")["loss/distill"] > 0


def test_the_distill_loss_is_the_registered_function_averaged_over_completion_tokens(student):
    teacher = NoisyTeacher("program", student, {"eps": 0.3})
    batch = teacher.distributions(rollout(student, 5))
    learner = DistillLearner(student, LearnerConfig(lr=1e-9))
    from troupe.actors.logprobs import completion_forward

    with torch.no_grad():
        dist = completion_forward(learner.model, batch, 1.0, with_distribution=True)["distribution"]
    m = batch["completion_mask"].float()
    expected = float((losses.reverse_kl(dist, batch["targets"]) * m).sum() / m.sum())
    assert learner.distill(batch, "rkl")["loss/distill"] == pytest.approx(expected, rel=1e-5)
    ids = torch.tensor([[1, 2]])
    assert one_hot_logprobs(ids, 4).exp().tolist() == [[[0, 1, 0, 0], [0, 0, 1, 0]]]


def test_sampled_rkl_is_a_policy_gradient_step_with_the_teachers_log_ratio(student):
    teacher = NoisyTeacher("program", student, {"eps": 0.3})
    batch = teacher.distributions(rollout(student, 6))
    learner = DistillLearner(student, LearnerConfig(lr=1e-2, loss="reinforce", aggregation="dapo"))
    m = batch["completion_mask"].float()
    kl = float(((batch["logprobs"] - batch["teacher_logprobs"]) * m).sum() / m.sum())
    out = learner.sampled_rkl(batch)
    assert out["opd/reverse_kl"] == pytest.approx(kl, rel=1e-5)


def test_top_k_targets_rebuild_the_distribution_the_learner_fits(student):
    from troupe.actors.distill_learner import targets_from_topk

    full = torch.log(torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04]]))
    vals, idx = full.topk(2, -1)
    rebuilt = targets_from_topk(idx, vals, 5).exp()
    assert rebuilt.tolist()[0] == pytest.approx([0.5, 0.3, 0.2 / 3, 0.2 / 3, 0.2 / 3])
    teacher = NoisyTeacher("program", student, {"eps": 0.3}, top_k=8)
    batch = teacher.distributions(rollout(student, 4))
    assert batch["targets_topk_ids"].shape[-1] == 8 and "targets" not in batch
    full_teacher = NoisyTeacher("program", student, {"eps": 0.3})
    whole = full_teacher.distributions(rollout(student, 4))["targets"]
    # uniform noise: the rest of the mass is spread evenly already, so the top-k loses nothing
    assert torch.allclose(targets_from_topk(batch["targets_topk_ids"], batch["targets_topk_logprobs"], whole.shape[-1]),
                          whole, atol=1e-4)
    learner = DistillLearner(student, LearnerConfig(lr=1e-2))
    assert learner.distill(batch, "rkl")["loss/distill"] > 0


def test_a_teacher_with_a_padded_embedding_is_cut_to_the_students_width(student, tmp_path):
    from troupe.actors.models import load_tokenizer

    tok = load_tokenizer(student)
    padded = build_tiny_lm(SPEC, tok, seed=1)
    padded.resize_token_embeddings(len(tok) + 64)  # as a larger model of one family pads its vocabulary
    save_model(padded, tok, tmp_path / "padded")
    teacher = NoisyTeacher(str(tmp_path / "padded"), student, {"eps": 0.1})
    scored = teacher.distributions(rollout(student, 3))
    assert scored["targets"].shape[-1] == len(tok)
    assert torch.allclose(scored["targets"].exp().sum(-1), torch.ones(scored["targets"].shape[:2]), atol=1e-5)
