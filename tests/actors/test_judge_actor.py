"""The LLM judge: a tiny real causal LM asked A / B / tie in both presentation orders, its verdict
distribution read from the letters' first-token log-probs, batched, counted, and refusing answers
whose letters hold too little mass (counted as unparsed)."""

from __future__ import annotations

import numpy as np
import pytest

from troupe.actors.judge import (
    DEFAULT_TEMPLATE,
    LETTERS,
    LLMJudge,
    check_judge_path,
    check_template,
    judge_prompt,
    position_distribution,
    to_content,
)
from troupe.actors.rollout_hf import HFRolloutEngine
from troupe.actors.sampling import SamplingConfig
from troupe.platform.errors import ConfigError

PROMPTS = ["3+4=", "12+9=", "7+7=", "20+5=", "1+1="]
FIRSTS = ["7", "21", "15", "25", "2"]
SECONDS = ["8", "21", "14", "30", "11"]


class RecordingEngine(HFRolloutEngine):
    """The HF engine, recording the questions of each generate call."""

    questions: list[list[str]] = []

    def generate(self, prompts, sampling, rows=None, seed=None, option_letters=None):
        RecordingEngine.questions.append(list(prompts))
        return super().generate(prompts, sampling, rows, seed, option_letters)


def _direct(engine: HFRolloutEngine, question: str) -> np.ndarray:
    """The engine's letter log-probs for one question, renormalised: the judge's expected reading."""
    batch = engine.generate([question], SamplingConfig(temperature=0.0, max_new_tokens=1), option_letters=[LETTERS])
    lp = batch["option_logprobs"][0].double().numpy()
    return np.exp(lp) / np.exp(lp).sum()


def test_position_distribution_renormalises_the_letters_and_refuses_little_mass():
    lp = np.log([0.2, 0.1, 0.1])
    np.testing.assert_allclose(position_distribution(lp, 0.3), [0.5, 0.25, 0.25])
    assert position_distribution(lp, 0.41) is None  # 0.4 of the token's mass is on a verdict
    assert position_distribution([-np.inf] * 3, 0.0) is None  # no mass at all: no verdict


def test_order_ba_maps_first_to_b_in_content_space():
    q = np.array([0.6, 0.3, 0.1])  # first, second, tie
    np.testing.assert_allclose(to_content("AB", q), [0.6, 0.3, 0.1])
    np.testing.assert_allclose(to_content("BA", q), [0.3, 0.6, 0.1])
    assert to_content("BA", None) is None


def test_both_orders_are_asked_with_the_responses_swapped_and_read_from_letter_logprobs(tiny_model_dir):
    RecordingEngine.questions = []
    judge = LLMJudge(tiny_model_dir, backend="test_judge_actor:RecordingEngine", batch_size=2, min_mass=0.0)
    calls = judge.compare(PROMPTS, FIRSTS, SECONDS)
    asked = [q for chunk in RecordingEngine.questions for q in chunk]
    ab = [judge_prompt(DEFAULT_TEMPLATE, p, a, b) for p, a, b in zip(PROMPTS, FIRSTS, SECONDS, strict=True)]
    ba = [judge_prompt(DEFAULT_TEMPLATE, p, b, a) for p, a, b in zip(PROMPTS, FIRSTS, SECONDS, strict=True)]
    assert asked == ab + ba
    assert [len(c) for c in RecordingEngine.questions] == [2, 2, 1, 2, 2, 1]  # batch_size questions per call
    assert judge.stats()["calls"] == 6 and judge.stats()["judgments"] == 10 and judge.stats()["unparsed"] == 0
    plain = HFRolloutEngine(tiny_model_dir)
    for call, q_ab, q_ba in zip(calls, ab, ba, strict=True):
        np.testing.assert_allclose(call.ab, _direct(plain, q_ab), atol=1e-5)
        # Order BA shows the second response first: its "first" is response b, content B.
        np.testing.assert_allclose(call.ba, _direct(plain, q_ba)[[1, 0, 2]], atol=1e-5)
        assert call.ab.sum() == pytest.approx(1.0) and call.unparsed == 0
    # An untrained model still tells the orders apart: the two readings are not one distribution.
    assert max(np.abs(c.ab - c.ba).max() for c in calls) > 1e-3


def test_batched_verdicts_equal_verdicts_one_at_a_time(tiny_model_dir):
    batched = LLMJudge(tiny_model_dir, batch_size=5, min_mass=0.0).compare(PROMPTS, FIRSTS, SECONDS)
    single = LLMJudge(tiny_model_dir, batch_size=1, min_mass=0.0)
    alone = [single.compare([p], [a], [b])[0] for p, a, b in zip(PROMPTS, FIRSTS, SECONDS, strict=True)]
    for x, y in zip(batched, alone, strict=True):
        np.testing.assert_allclose(x.ab, y.ab, atol=1e-5)
        np.testing.assert_allclose(x.ba, y.ba, atol=1e-5)
    assert single.stats()["calls"] == 10


def test_answers_with_too_little_letter_mass_are_counted_as_unparsed_never_dropped(tiny_model_dir):
    # The letters' mass of each question (order AB, then BA), from the engine itself.
    engine = HFRolloutEngine(tiny_model_dir)
    questions = [judge_prompt(DEFAULT_TEMPLATE, p, a, b) for p, a, b in zip(PROMPTS, FIRSTS, SECONDS, strict=True)] + \
                [judge_prompt(DEFAULT_TEMPLATE, p, b, a) for p, a, b in zip(PROMPTS, FIRSTS, SECONDS, strict=True)]
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=1)
    lp = engine.generate(questions, greedy, option_letters=[LETTERS] * 10)["option_logprobs"].double()
    mass = lp.exp().sum(1).numpy()
    threshold = float(np.median(mass))
    judge = LLMJudge(tiny_model_dir, min_mass=threshold)
    calls = judge.compare(PROMPTS, FIRSTS, SECONDS)
    below = mass < threshold
    assert 0 < below.sum() < 10
    assert judge.stats()["unparsed"] == int(below.sum())
    assert len(calls) == len(PROMPTS)  # every comparison comes back, its unparsed orders as None
    assert [c.ab is None for c in calls] == below[:5].tolist()
    assert [c.ba is None for c in calls] == below[5:].tolist()
    assert sum(c.unparsed for c in calls) == int(below.sum())
    none = LLMJudge(tiny_model_dir, min_mass=1.0)
    assert all(c.unparsed == 2 for c in none.compare(PROMPTS, FIRSTS, SECONDS))
    assert none.stats()["unparsed"] == 10


def test_a_judge_path_or_template_that_cannot_judge_is_a_config_error(tmp_path, tiny_model_dir):
    check_judge_path(tiny_model_dir)
    with pytest.raises(ConfigError, match=r"reward.path=.*no config.json"):
        check_judge_path(str(tmp_path))
    with pytest.raises(ConfigError, match=r"reward.path=.*does not exist"):
        check_judge_path(str(tmp_path / "missing" / "model"))
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(tiny_model_dir)
    cfg.architectures = ["Qwen2ForSequenceClassification"]
    cfg.save_pretrained(tmp_path / "rm")
    with pytest.raises(ConfigError, match=r"reward.path=.*Qwen2ForSequenceClassification.*not a causal LM"):
        check_judge_path(str(tmp_path / "rm"))
    with pytest.raises(ConfigError, match=r"judge_template lacks \{second\}"):
        check_template("Q: {prompt} A: {first}")
    with pytest.raises(ConfigError, match="judge_min_mass"):
        LLMJudge(tiny_model_dir, min_mass=1.5)
