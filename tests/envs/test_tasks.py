import hashlib
import json
import textwrap

import numpy as np
import pytest

from troupe.algorithms.grpo.config import GRPOConfig
from troupe.envs.arithmetic import ArithmeticTask
from troupe.envs.jsonl import JsonlTask
from troupe.envs.task import Task, build_task
from troupe.envs.video_qa.choice import VideoQAChoiceTask
from troupe.platform.config import from_dict, resolve, to_dict
from troupe.platform.errors import ConfigError, DataError
from troupe.platform.registry import REWARDS, TASKS


@pytest.fixture
def jsonl_files(tmp_path):
    def write(name, rows):
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(path)

    train = write("train.jsonl", [{"prompt": f"echo {i}", "answer": str(i)} for i in range(20)])
    held_out = write("eval.jsonl", [{"prompt": f"echo {i}", "answer": str(i)} for i in range(100, 110)])
    return train, held_out


def grpo(*overrides):
    return resolve(GRPOConfig, None, None, list(overrides))


def task_configs(jsonl_files):
    train, held_out = jsonl_files
    return {
        "arithmetic": grpo("task.digits=3"),
        "jsonl": grpo("task.name=jsonl", f"task.train={train}", f"task.eval={held_out}"),
        "dataset": grpo("task.name=dataset", f"task.train={train}", f"task.eval={held_out}"),
        "video_qa": grpo("task.name=video_qa", "task.num_frames=6"),
    }


def wrong(answer: str) -> str:
    return "B" if answer == "A" else "A" if answer.isalpha() else answer + "1"


@pytest.mark.parametrize("name", ["arithmetic", "jsonl", "dataset", "video_qa"])
def test_each_registered_task_gives_rows_a_held_out_set_and_a_checker(name, jsonl_files):
    cfg = task_configs(jsonl_files)[name]
    task = build_task(cfg.task)
    assert isinstance(task, Task) and type(task) is TASKS.get(name)
    rows = task.train_rows(8, np.random.default_rng(0))
    assert len(rows) == 8 and all({"prompt", "answer"} <= set(r) for r in rows)
    held_out = task.eval_rows(6)
    assert len(held_out) == 6 and held_out == task.eval_rows(6)  # fixed
    fn = REWARDS.get(task.checker())
    assert cfg.reward.fn == task.checker()  # the reward role scores with the task's checker
    for r in rows + held_out:
        assert fn(completion=str(r["answer"]), **r) == 1.0
        assert fn(completion=wrong(str(r["answer"])), **r) == 0.0


@pytest.mark.parametrize("name", ["arithmetic", "jsonl", "dataset", "video_qa"])
def test_each_task_gives_an_sft_corpus(name, jsonl_files):
    sft = build_task(task_configs(jsonl_files)[name].task).sft_task()
    rows = sft.sample(4, "train", np.random.default_rng(0))
    assert len(rows) == 4 and all({"prompt", "answer"} <= set(r) for r in rows)
    corpus = sft.corpus(10, seed=0)
    assert len(corpus) == 10 and all(isinstance(t, str) and t for t in corpus)


def test_video_qa_rows_are_the_original_view_as_a_multiple_choice_prompt():
    task = VideoQAChoiceTask()
    (item,) = task.env.eval_items(1, task.config.eval_seed)
    (row,) = task.eval_rows(1)
    assert row["prompt"] == task.env.prompt(item) and row["answer"] == item.gold_letter
    assert row["num_options"] == len(item.options)
    fn = REWARDS.get(task.checker())
    assert fn(f"({item.gold_letter})", **row) == 1.0
    assert fn("Cannot be determined from the video", **row) == 0.0


def test_arithmetic_keeps_the_sft_cache_key_of_the_old_task_config():
    # What GRPO passed to prepare_policy before tasks were classes: to_dict(TaskConfig()).
    old = {"name": "arithmetic", "digits": 2, "ops": ["+"], "dataset": None, "eval_dataset": None}
    assert ArithmeticTask(GRPOConfig().task).cache_key() == old
    assert ArithmeticTask(digits=3, eval_seed=7).cache_key() == {**old, "digits": 3}
    assert ArithmeticTask(test_fraction=0.3).cache_key()["test_fraction"] == 0.3  # it shapes the train split


def test_arithmetic_held_out_set_comes_from_its_eval_seed():
    rows = ArithmeticTask().eval_rows(20)
    assert rows == ArithmeticTask().sample(20, "test", np.random.default_rng(12345))
    assert ArithmeticTask(eval_seed=1).eval_rows(20) != rows


def test_arithmetic_datasets_replace_the_synthetic_prompts(jsonl_files):
    train, held_out = jsonl_files
    task = build_task(grpo(f"task.dataset={train}", f"task.eval_dataset={held_out}").task)
    assert task.train_rows(3, np.random.default_rng(0))[0]["prompt"].startswith("echo")
    assert task.eval_rows(4) == [{"prompt": f"echo {i}", "answer": str(i)} for i in range(100, 104)]
    assert "=" in task.sft_task().sample(1, "train", np.random.default_rng(0))[0]["prompt"]  # SFT stays synthetic


def test_task_name_selects_the_section_class(jsonl_files):
    train, held_out = jsonl_files
    cfg = grpo("task.name=jsonl", f"task.train={train}", f"task.eval={held_out}")
    assert type(cfg.task) is JsonlTask.Config and cfg.task.train == train
    assert cfg.reward.fn == "exact_match"
    cfg = grpo("task.name=jsonl", f"task.train={train}", f"task.eval={held_out}", "task.reward=arithmetic_exact")
    assert cfg.reward.fn == "arithmetic_exact"
    cfg = grpo("task.name=video_qa", "task.cue_strength=0.5")
    assert type(cfg.task) is VideoQAChoiceTask.Config and cfg.task.cue_strength == 0.5
    assert cfg.reward.fn == "option_letter"
    assert grpo("reward.fn=exact_match").reward.fn == "exact_match"  # an explicit reward wins


def test_a_key_of_another_task_is_an_unknown_key(jsonl_files):
    train, held_out = jsonl_files
    with pytest.raises(ConfigError, match=r"unknown config key 'task.digits'; allowed keys here: task.name, "
                                          r"task.train, task.eval, task.reward"):
        grpo("task.name=jsonl", f"task.train={train}", f"task.eval={held_out}", "task.digits=3")


def test_an_unknown_task_names_the_key_the_value_and_the_registered_tasks():
    with pytest.raises(ConfigError, match=r"task.name='sorting'.*unknown task 'sorting'.*"
                                          r"arithmetic, chain, dataset, jsonl, persona_prompts, video_qa") as e:
        grpo("task.name=sorting")
    assert "TASKS" in str(e.value)
    with pytest.raises(ConfigError, match=r"task.name='no_such_module:Task'.*cannot import.*arithmetic, chain, dataset, jsonl"):
        grpo("task.name=no_such_module:Task")


def test_task_errors_name_the_task_keys(jsonl_files, tmp_path):
    train, _ = jsonl_files
    with pytest.raises(ConfigError, match="task.digits"):
        grpo("task.digits=9")
    with pytest.raises(ConfigError, match="task.ops"):
        grpo("task.ops=['/']")
    with pytest.raises(ConfigError, match="task.eval"):
        grpo("task.name=jsonl", f"task.train={train}")
    with pytest.raises(ConfigError, match="task.train"):
        grpo("task.name=jsonl", f"task.train={tmp_path / 'missing.jsonl'}", f"task.eval={train}")
    with pytest.raises(ConfigError, match="task.reward"):
        grpo("task.name=jsonl", f"task.train={train}", f"task.eval={train}", "task.reward=no_such_reward")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "1+1="}) + "\n")
    task = JsonlTask(train=str(bad), eval=str(bad))
    with pytest.raises(DataError, match=r"task.train=.*lacks required field\(s\) \['answer'\]"):
        task.train_rows(1, np.random.default_rng(0))


USER_TASK = '''
    import dataclasses

    from troupe.envs.task import Task


    class Reverse(Task):
        """Reverse a word of ``length`` letters."""

        @dataclasses.dataclass
        class Config(Task.Config):
            length: int = 3

        def row(self, rng):
            word = "".join(rng.choice(list("abcdef"), size=self.config.length))
            return {"prompt": word, "answer": word[::-1]}

        def train_rows(self, n, rng):
            return [self.row(rng) for _ in range(n)]

        def eval_rows(self, n):
            rng = __import__("numpy").random.default_rng(0)
            return [self.row(rng) for _ in range(n)]

        def checker(self):
            return "exact_match"
'''


def test_a_users_task_class_is_selected_by_import_path(tmp_path, monkeypatch):
    module = "user_reverse_task_" + hashlib.blake2b(str(tmp_path).encode(), digest_size=4).hexdigest()
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(USER_TASK))
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = grpo(f"task.name={module}:Reverse", "task.length=5")
    assert type(cfg.task).__qualname__ == "Reverse.Config" and cfg.task.length == 5
    assert cfg.reward.fn == "exact_match"
    task = build_task(cfg.task)
    (row,) = task.eval_rows(1)
    assert len(row["prompt"]) == 5 and REWARDS.get(task.checker())(row["answer"], **row) == 1.0
    assert from_dict(GRPOConfig, to_dict(cfg)) == cfg
    with pytest.raises(ConfigError, match=r"unknown config key 'task.digits'"):
        grpo(f"task.name={module}:Reverse", "task.digits=2")


@pytest.mark.parametrize("name", ["arithmetic", "jsonl", "dataset", "video_qa"])
def test_each_task_config_round_trips_through_a_dict(name, jsonl_files):
    cfg = task_configs(jsonl_files)[name]
    again = from_dict(GRPOConfig, to_dict(cfg))
    assert again == cfg and type(again.task) is type(cfg.task)


def test_the_default_task_is_arithmetic_and_a_partial_section_keeps_its_defaults():
    cfg = grpo("task.digits=3")
    assert type(cfg.task) is ArithmeticTask.Config and (cfg.task.digits, cfg.task.ops) == (3, ["+"])
    assert cfg.reward.fn == "arithmetic_exact"
