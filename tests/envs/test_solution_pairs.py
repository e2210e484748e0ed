"""(correct, incorrect) solution pairs of arithmetic problems (`troupe.envs.preferences.solutions`):
each mistake is a wrong answer of its kind, pairs are shown in either order with the label that
follows, and an episode's demos are other problems'."""

from __future__ import annotations

import numpy as np
import pytest

from troupe.envs.arithmetic import ArithmeticTask, arithmetic_exact
from troupe.envs.preferences.solutions import (
    MISTAKES,
    Problem,
    draw_problems,
    dropped_carry,
    kinds_possible,
    off_by,
    parse_problem,
    solution_episodes,
    solution_pool,
    split_size,
    with_solution_demos,
    wrong_answer,
    wrong_digit,
)
from troupe.platform.errors import DataError


@pytest.mark.parametrize(("a", "op", "b", "expected"), [
    (86, "+", 67, 143),  # 6+7 = 13 written 3, 8+6 written whole: the carry into the tens is lost
    (25, "+", 83, None),  # the only carry is out of the leftmost column, written whole: nothing lost
    (7, "+", 5, None),  # one column never drops a carry
    (52, "-", 38, 26),  # each column the smaller digit from the larger
    (38, "-", 52, -26),  # the sign of the true difference is kept
    (50, "-", 25, 35),
    (58, "-", 23, None),  # no borrow
    (12, "*", 3, None),  # multiplication: no carry mistake is made here
])
def test_dropped_carry_is_the_column_sum_without_carries(a, op, b, expected):
    assert dropped_carry(Problem(a, b, op)) == expected


def test_off_by_is_a_small_nonzero_offset_and_keeps_a_nonnegative_answer_nonnegative():
    rng = np.random.default_rng(0)
    for answer in (0, 1, 9, 57, -3):
        for _ in range(50):
            got = off_by(answer, rng)
            assert got - answer in (-10, -2, -1, 1, 2, 10)
            assert answer < 0 or got >= 0


def test_wrong_digit_changes_exactly_one_digit_and_never_leads_with_zero():
    rng = np.random.default_rng(1)
    for answer in (7, 40, 153, -81):
        for _ in range(50):
            got = wrong_digit(answer, rng)
            a, g = str(abs(answer)), str(abs(got))
            assert len(a) == len(g) and sum(x != y for x, y in zip(a, g, strict=True)) == 1
            assert (got < 0) == (answer < 0)


@pytest.mark.parametrize("kind", MISTAKES)
def test_every_mistake_is_an_answer_the_checker_rejects(kind):
    task = ArithmeticTask(ops=["+", "-", "*"])
    rng = np.random.default_rng(2)
    made = 0
    for p in draw_problems(task, 200, "train", rng):
        w = wrong_answer(p, kind, rng)
        if w is not None:
            made += 1
            assert arithmetic_exact(str(w), str(p.answer)) == 0.0
            assert arithmetic_exact(str(p.answer), str(p.answer)) == 1.0
    assert made > 30  # carry: only + and - problems that carry


def test_kinds_possible_drops_carry_where_no_problem_can_carry():
    assert kinds_possible(1, ["+"], ["carry", "digit"]) == ["digit"]
    assert kinds_possible(2, ["*"], ["carry"]) == []
    assert kinds_possible(2, ["*", "-"], ["carry"]) == ["carry"]


def test_problems_are_distinct_and_of_their_split_and_the_prompt_parses_back():
    task = ArithmeticTask(digits=1)
    rng = np.random.default_rng(3)
    n_train, n_test = split_size(task, "train"), split_size(task, "test")
    assert n_train + n_test == 100
    train = draw_problems(task, n_train, "train", rng)
    assert len(set(train)) == n_train and not any(task.is_test(p.a, p.b, p.op) for p in train)
    assert all(parse_problem(p.prompt) == p for p in train)
    with pytest.raises(DataError, match="distinct train problems"):
        draw_problems(task, n_train + 1, "train", rng)
    with pytest.raises(DataError, match="not an arithmetic problem"):
        parse_problem("what is 2+2")


def test_a_pair_is_correct_against_wrong_in_a_random_order_with_the_label_following():
    rng = np.random.default_rng(4)
    pool = solution_pool([Problem(86, 67, "+"), Problem(20, 31, "+")], ["off_by", "carry"], rng)
    assert pool.prompts == ("86+67=", "20+31=") and pool.answers == ("153", "51")
    assert set(pool.wrong[0]) == {"off_by", "carry"} and pool.wrong[0]["carry"] == "143"
    assert set(pool.wrong[1]) == {"off_by"}  # no carry to drop
    labels = []
    for _ in range(200):
        c = pool.pair(0, ["carry"], rng)
        assert c.chosen == "153" and c.rejected == "143"
        labels.append(c.label)
    assert 0.35 < np.mean(labels) < 0.65
    assert list(pool.having(["carry"])) == [0] and list(pool.having(["off_by"])) == [0, 1]


def test_episode_demos_are_pairs_of_other_problems_with_the_query_kinds():
    task = ArithmeticTask()
    rng = np.random.default_rng(5)
    pool = solution_pool(draw_problems(task, 40, "train", rng), ["off_by", "carry", "digit"], rng)
    wrong_of = {p: w for p, w in zip(pool.prompts, pool.wrong, strict=True)}
    eps = solution_episodes(pool, ["carry"], 100, rng, k=(0, 4))
    assert {e.k for e in eps} == {0, 1, 2, 3, 4}
    for e in eps:
        for c in (e.query, *e.demos):
            assert c.rejected == wrong_of[c.prompt]["carry"]
            assert str(parse_problem(c.prompt).answer) == c.chosen
        assert all(d.prompt != e.query.prompt for d in e.demos)
    with pytest.raises(DataError, match="at least 2"):
        solution_episodes(solution_pool([Problem(86, 67, "+")], ["carry"], rng), ["carry"], 1, rng, k=1)


def test_rl_rows_carry_demos_of_other_problems_and_a_wrong_reference():
    rng = np.random.default_rng(6)
    task = ArithmeticTask()
    pool = solution_pool(draw_problems(task, 30, "train", rng), ["off_by"], rng)
    rows = with_solution_demos(task.train_rows(20, rng), pool, ["off_by"], 3, rng)
    for row in rows:
        assert len(row["demos"]) == 3 and all(d["prompt"] != row["prompt"] for d in row["demos"])
        assert arithmetic_exact(row["reference"], row["answer"]) == 0.0
        assert arithmetic_exact(row["answer"], row["answer"]) == 1.0
