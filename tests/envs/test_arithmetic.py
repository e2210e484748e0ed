import json

import numpy as np
import pytest

from troupe.envs.arithmetic import ArithmeticTask, arithmetic_exact, parse_integer
from troupe.envs.datasets import PromptDataset
from troupe.platform.errors import ConfigError, DataError


def test_train_and_test_splits_are_disjoint():
    task = ArithmeticTask(digits=2)
    rng = np.random.default_rng(0)
    train = {r["prompt"] for r in task.sample(2000, "train", rng)}
    test = {r["prompt"] for r in task.sample(500, "test", rng)}
    assert train and test and not train & test


def test_answers_are_exact():
    for r in ArithmeticTask(digits=3, ops=("+", "-", "*")).sample(50, "train", np.random.default_rng(1)):
        assert str(eval(r["prompt"][:-1])) == r["answer"]  # the prompt is a plain expression


def test_checker():
    assert arithmetic_exact("82", "82") == 1.0
    assert arithmetic_exact(" 82 and more", "82") == 1.0
    assert arithmetic_exact("81", "82") == 0.0
    assert arithmetic_exact("", "82") == 0.0
    assert parse_integer("x=-7") == -7


def test_bad_task_config():
    with pytest.raises(ConfigError, match="task.ops"):
        ArithmeticTask(ops=("/",))
    with pytest.raises(ConfigError, match="task.digits"):
        ArithmeticTask(digits=0)


def test_jsonl_dataset_requires_fields(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n" + json.dumps({"prompt": "2+2="}) + "\n")
    with pytest.raises(DataError, match=r"row 1 lacks required field\(s\) \['answer'\]"):
        PromptDataset.from_jsonl(p, ("prompt", "answer"))
    with pytest.raises(DataError, match="does not exist"):
        PromptDataset.from_jsonl(tmp_path / "missing.jsonl")
