"""The reward-model role: a tiny real sequence classifier (and a causal LM with a value head) built
from a config and saved, scored in batches and one row at a time, steered by the demos in a row,
refused when the path holds no reward head, and used by GRPO as its reward."""

from __future__ import annotations

import time

import pytest
import torch

from troupe.actors.models import TinyLMSpec, build_tiny_lm, save_model, train_tokenizer
from troupe.actors.reward_model import RewardModel, reward_model_kind
from troupe.platform.batch import Batch
from troupe.platform.errors import ConfigError, DataError

CORPUS = [f"{a}+{b}={a + b}" for a in range(30) for b in range(30)] + [
    "Preferences to follow, shown as pairs of responses: Example Prompt Preferred Rejected",
    "a short answer; a long and careful answer with numbers 1 2 3",
]


def _tokenizer():
    return train_tokenizer(CORPUS, vocab_size=200)


def _tiny_config(tok, num_labels: int = 1):
    from transformers import Qwen2Config

    spec = TinyLMSpec(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                      max_position_embeddings=512)
    return Qwen2Config(vocab_size=len(tok), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
                       num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
                       num_key_value_heads=spec.num_kv_heads, max_position_embeddings=spec.max_position_embeddings,
                       pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, num_labels=num_labels)


def build_classifier_rm(path, num_labels: int = 1, seed: int = 0):
    """A randomly initialised Qwen2 sequence classifier: a real reward model, only untrained."""
    from transformers import Qwen2ForSequenceClassification

    tok = _tokenizer()
    torch.manual_seed(seed)
    model = Qwen2ForSequenceClassification(_tiny_config(tok, num_labels))
    with torch.no_grad():  # a larger head spreads the scores, so rows are told apart clearly
        model.score.weight.mul_(50.0)
    save_model(model, tok, path)
    return path


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory):
    return str(build_classifier_rm(tmp_path_factory.mktemp("rm") / "tiny-rm"))


def _batch(prompts, completions, rows=None):
    rows = rows or [{} for _ in prompts]
    return Batch({"x": torch.zeros(len(prompts), 1)}, {"prompt": list(prompts), "completion": list(completions),
                                                      "row": list(rows)})


DEMOS = [{"prompt": "1+1=", "a": "2", "b": "11", "label": 1}, {"prompt": "2+3=", "a": "23", "b": "5", "label": 0}]


def test_batched_scores_equal_scores_of_each_row_alone(rm_path):
    rm = RewardModel(rm_path, batch_size=3)
    prompts = ["12+3=", "7+8=", "1+1=", "25+25=", "3+4=", "9+9="]
    completions = ["15", "1", "2 and a long and careful answer", "50", "", "18 18 18"]
    rows = [{}, {"demos": DEMOS}, {}, {"demos": DEMOS[:1]}, {}, {}]
    batched = rm.score(_batch(prompts, completions, rows))["rewards"]
    alone = torch.cat([rm.score(_batch([p], [c], [r]))["rewards"]
                       for p, c, r in zip(prompts, completions, rows, strict=True)])
    assert batched.shape == (6,) and batched.dtype == torch.float32
    torch.testing.assert_close(batched, alone, rtol=1e-4, atol=1e-4)
    assert batched.std() > 0.1  # rows of different lengths in one batch: padding must not leak into scores


def test_demos_in_the_row_change_what_the_model_reads_and_its_score(rm_path):
    rm = RewardModel(rm_path)
    plain, steered = rm.texts(_batch(["12+3="] * 2, ["15"] * 2, [{}, {"demos": DEMOS}]))
    assert "12+3=" in plain and "15" in plain and "Preferred" not in plain
    # Each demo is read as (chosen, rejected): label 0 means response b was preferred.
    assert steered.index("Preferred: 2\n") < steered.index("Rejected: 11")
    assert steered.index("Preferred: 5\n") < steered.index("Rejected: 23")
    assert steered.endswith(plain[plain.index("12+3="):])
    scores = rm.score(_batch(["12+3="] * 2, ["15"] * 2, [{}, {"demos": DEMOS}]))["rewards"]
    assert abs(float(scores[0] - scores[1])) > 1e-3


def test_a_malformed_demo_is_an_error_naming_the_row():
    from troupe.actors.reward_model import reward_input

    tok = _tokenizer()
    with pytest.raises(DataError, match=r"row 4: demo 0.*label"):
        reward_input(tok, "1+1=", "2", {"demos": [{"a": "2", "b": "3", "label": 2}]}, "row 4")


def test_a_causal_lm_without_a_reward_head_is_refused_naming_reward_path(tmp_path):
    tok = _tokenizer()
    lm = tmp_path / "plain-lm"
    save_model(build_tiny_lm(TinyLMSpec(hidden_size=32, intermediate_size=64), tok), tok, lm)
    with pytest.raises(ConfigError, match=r"reward.path=.*plain-lm.*Qwen2ForCausalLM.*no reward head.*num_labels=1"):
        reward_model_kind(str(lm))
    with pytest.raises(ConfigError, match="reward.path"):
        RewardModel(str(lm))
    with pytest.raises(ConfigError, match=r"reward.path=.*3 labels"):
        reward_model_kind(str(build_classifier_rm(tmp_path / "three-way", num_labels=3)))
    with pytest.raises(ConfigError, match=r"reward.path=.*no config.json"):
        reward_model_kind(str(tmp_path))


def test_grpo_config_checks_the_reward_model_path_before_any_actor_starts(tmp_path, rm_path):
    from troupe.platform.driver import resolve_config

    tok = _tokenizer()
    save_model(build_tiny_lm(TinyLMSpec(hidden_size=32, intermediate_size=64), tok), tok, tmp_path / "lm")
    with pytest.raises(ConfigError, match=r"reward.path=.*no reward head"):
        resolve_config("grpo", "smoke", ["reward.kind=model", f"reward.path={tmp_path / 'lm'}"])
    with pytest.raises(ConfigError, match="reward.path"):
        resolve_config("grpo", "smoke", ["reward.kind=model"])
    with pytest.raises(ConfigError, match="reward.kind=model"):
        resolve_config("grpo", "smoke", [f"reward.path={rm_path}"])
    cfg = resolve_config("grpo", "smoke", ["reward.kind=model", f"reward.path={rm_path}"])
    assert cfg.reward.kind == "model" and cfg.reward.fn  # the task's checker stays, for eval accuracy


def test_a_causal_lm_with_a_value_head_is_a_reward_model_read_at_its_last_token(tmp_path):
    from safetensors.torch import load_file, save_file

    tok = _tokenizer()
    path = tmp_path / "vhead"
    save_model(build_tiny_lm(TinyLMSpec(hidden_size=32, intermediate_size=64), tok, seed=1), tok, path)
    # The layout TRL's AutoModelForCausalLMWithValueHead saves: the LM's weights plus v_head.summary.
    weights = load_file(path / "model.safetensors")
    torch.manual_seed(2)
    weights["v_head.summary.weight"] = torch.randn(1, 32)
    weights["v_head.summary.bias"] = torch.tensor([0.5])
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    assert reward_model_kind(str(path)) == "value_head"

    rm = RewardModel(str(path), batch_size=2)
    prompts, completions = ["1+2=", "10+20=", "3+3="], ["3", "30 and a long answer", "6"]
    batched = rm.score(_batch(prompts, completions))["rewards"]
    # The score by hand: the backbone's last hidden state at the last token, through the head.
    from transformers import AutoModel

    backbone = AutoModel.from_pretrained(path).eval()
    expect = []
    for text in rm.texts(_batch(prompts, completions)):
        ids = rm.tokenizer(text, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            h = backbone(**ids).last_hidden_state[0, -1]
        expect.append(float(h @ weights["v_head.summary.weight"][0] + 0.5))
    torch.testing.assert_close(batched, torch.tensor(expect), rtol=1e-4, atol=1e-4)


@pytest.mark.timeout(600)
def test_grpo_with_reward_kind_model_trains_on_the_models_scores(ray_local, troupe_cache, rm_path, tmp_path,
        replay_first_rollout):
    from troupe import Run

    overrides = ["run.progress=false", "eval.num_prompts=8", "grpo.prompts_per_step=2", "grpo.group_size=4",
                 "run.steps=2", "run.eval_every=0",
                 "run.checkpoint_every=0", "reward.kind=model", f"reward.path={rm_path}"]
    with Run("grpo", preset="smoke", overrides=overrides, out=tmp_path / "run") as run:
        assert "checker" in run.graph.groups  # eval accuracy stays the task's exact checker
        replay, batch = replay_first_rollout(run)
        metrics = run.step()
        run.step()
        evaluated = run.evaluate()
        summary = run.finish()
    own = RewardModel(rm_path).score(batch)["rewards"]
    torch.testing.assert_close(replay.rewards, own, rtol=1e-4, atol=1e-4)
    assert metrics["reward/mean"] == pytest.approx(float(own.mean()), abs=1e-4)
    assert not set(own.tolist()) <= {0.0, 1.0}  # a model's scores, not the 0/1 checker's
    assert 0.0 <= evaluated["eval/accuracy"] <= 1.0
    assert summary["eval_accuracy_end"] == evaluated["eval/accuracy"]


class SlowEngine:
    """A rollout engine with no model that takes a while, so a reward call waits on its batch."""

    def generate(self, prompts: list[str], sampling: object, rows: list[dict] | None = None, seed: int = 0) -> Batch:
        time.sleep(3)
        return _batch(prompts, [p.split("+")[0] for p in prompts], rows)

    def get_version(self) -> int:
        return 0


@pytest.mark.timeout(180)
def test_a_reward_model_killed_mid_call_is_restarted_and_its_call_reissued(ray_local, rm_path):
    from troupe.algorithms.policy_graph import PolicyGraph
    from troupe.platform.driver import resolve_config
    from troupe.platform.placement import ActorGraph, Role

    graph = ActorGraph([Role("rollout", SlowEngine, num_cpus=0.1),
                        Role("reward", RewardModel, num_cpus=0.1, kwargs={"path": rm_path}, max_restarts=1)],
                       timeout_s=60, call_timeout_s=120).start()
    try:
        cfg = resolve_config("grpo", "smoke", ["reward.kind=model", f"reward.path={rm_path}"])
        policy = PolicyGraph(cfg, model_path="unused")
        policy.graph = graph
        prompts, rows = ["12+3=", "4+5=", "30+1="], [{}, {"demos": DEMOS}, {}]
        rollout = policy.rollout(prompts, rows, sampling=None, seed=0)
        time.sleep(1)  # the score call is in flight, waiting for the engine's batch
        ray_local.kill(graph["reward"][0], no_restart=False)
        out = rollout.result()
        assert policy.faults == 1
        batch = Batch.concat(ray_local.get(out.batches))
        torch.testing.assert_close(out.rewards, RewardModel(rm_path).score(batch)["rewards"], rtol=1e-4, atol=1e-4)
    finally:
        graph.shutdown()
