"""The chain task of controllable horizon: exact steps, checkers, disjoint splits, the SFT path."""

from __future__ import annotations

import numpy as np
import pytest

from troupe.envs.chain import ChainTask, chain_exact, chain_steps, first_error, step_correct
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


@pytest.mark.parametrize("kind", ["running_sum", "carry"])
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
