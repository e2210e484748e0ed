"""The chain task of controllable horizon: exact steps, checkers, disjoint splits, the SFT path."""

from __future__ import annotations

import numpy as np
import pytest

from troupe.envs.chain import (
    ChainTask,
    answer_length,
    chain_exact,
    chain_steps,
    first_error,
    next_step,
    step_correct,
)
from troupe.envs.task import build_task
from troupe.platform.errors import ConfigError
from troupe.platform.registry import REWARDS, TASKS


def test_running_sums_and_carry_chains_step_by_step():
    assert chain_steps("running_sum", (3, 5, 1, 8), 4) == [3, 8, 9, 7]
    # 47 + 85 = 132, written low digit first, the last carry as one more step
    assert chain_steps("carry", (4, 7, 8, 5), 2) == [2, 3, 1]
    assert chain_steps("carry", (1, 2, 3, 4), 2) == [6, 4]  # 12 + 34 = 46: no carry out
    rng = np.random.default_rng(0)
    for _ in range(200):  # the carry chain is the sum, read backwards
        a, b = (int(x) for x in rng.integers(10**7, 10**8, 2))
        digits = tuple(int(c) for c in f"{a}{b}")
        assert "".join(map(str, chain_steps("carry", digits, 8)))[::-1] == str(a + b)


def test_the_recurrence_continues_the_prompts_last_two_digits():
    # 3 + 1 = 4, 1 + 4 = 5, 4 + 5 = 9, 5 + 9 = 14 → 4: only the last two prompt digits matter
    assert chain_steps("recurrence", (7, 7, 7, 7, 3, 1), 4) == [4, 5, 9, 4]
    row = ChainTask(kind="recurrence", horizon=4).row((7, 7, 7, 7, 3, 1))
    assert row["prompt"] == "rec 777731" and row["answer"] == "4594" and answer_length("recurrence", 4) == 4


@pytest.mark.parametrize("kind", ["running_sum", "carry", "recurrence"])
def test_the_clean_expert_writes_the_chain_and_follows_a_wrong_digit(kind):
    task = ChainTask(kind=kind, horizon=6)
    for row in task.train_rows(30, np.random.default_rng(3)):
        written: list[int] = []
        while (d := next_step(row, written)) is not None:
            written.append(d)
        assert written == row["steps"]
    row = task.train_rows(1, np.random.default_rng(4))[0]
    wrong = [(row["steps"][0] + 1) % 10]
    if kind == "recurrence":  # the next step adds the digit actually written
        assert next_step(row, wrong) == (row["inputs"][-1] + wrong[0]) % 10
    elif kind == "running_sum":
        assert next_step(row, wrong) == (wrong[0] + row["inputs"][1]) % 10
    else:  # no carry can be read off a wrong digit: the true one
        assert next_step(row, wrong) == row["steps"][1]


@pytest.mark.parametrize("kind", ["running_sum", "carry", "recurrence"])
def test_rows_check_exactly_and_localise_the_first_wrong_step(kind):
    task = ChainTask(kind=kind, horizon=6)
    for row in task.train_rows(20, np.random.default_rng(1)):
        steps = row["steps"]
        assert chain_exact(row["answer"], **row) == 1.0 and first_error(row["answer"], steps) is None
        assert all(step_correct(row["answer"], steps))
        wrong = list(steps)
        wrong[3] = (wrong[3] + 1) % 10
        text = "".join(map(str, wrong))
        assert chain_exact(text, **row) == 0.0 and first_error(text, steps) == 3
        assert step_correct(text, steps) == [i != 3 for i in range(len(steps))]
        assert first_error("".join(map(str, steps[:2])), steps) == 2  # stopped early
        assert first_error(row["answer"] + "5", steps) == len(steps)  # ran on


def test_the_held_out_prompts_never_appear_in_training_and_are_fixed():
    task = ChainTask(horizon=4)
    held_out = task.eval_rows(200)
    assert held_out == task.eval_rows(200)
    train = {r["prompt"] for r in task.train_rows(3000, np.random.default_rng(2))}
    assert not train & {r["prompt"] for r in held_out}


def test_the_task_is_registered_and_its_horizon_is_checked():
    task = build_task(TASKS.get("chain").Config(horizon=16))
    assert isinstance(task, ChainTask) and REWARDS.get(task.checker()) is chain_exact
    row = task.eval_rows(1)[0]
    assert len(row["steps"]) == 16 and row["prompt"].startswith("sum ")
    for bad in ({"horizon": 3}, {"horizon": 33}, {"kind": "product"}):
        with pytest.raises(ConfigError, match=f"task.{next(iter(bad))}"):
            ChainTask(**bad)


def test_chain_rows_fit_through_the_sft_path():
    from troupe.actors.models import train_tokenizer
    from troupe.algorithms.sft import sft_tensors

    task = ChainTask(kind="carry", horizon=8)
    tok = train_tokenizer(task.corpus(300), 384)
    rows = task.sft_task().sample(8, "train", np.random.default_rng(0))
    _, _, labels = sft_tensors(tok, rows)
    for row, lab in zip(rows, labels, strict=True):
        assert tok.decode([int(t) for t in lab if t != -100], skip_special_tokens=True) == row["answer"]
