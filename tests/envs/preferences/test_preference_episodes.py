"""Rows of demonstrations as a user or a dataset gives them: read into comparisons, and each bad
row (a demo without both responses, a label outside {0, 1}) a clear error naming it."""

import numpy as np
import pytest

from troupe.envs.preferences.episodes import Comparison, Episode, comparison_from_row, demos_from_rows, draw_k
from troupe.platform.errors import DataError

ROW = {"prompt": "Greet me.", "a": "Hi!", "b": "Go away.", "label": 1}


def test_a_row_reads_into_a_comparison_with_chosen_and_rejected():
    c = comparison_from_row(ROW, "row 0")
    assert c == Comparison("Greet me.", "Hi!", "Go away.", 1)
    assert (c.chosen, c.rejected) == ("Hi!", "Go away.")
    s = c.swapped()
    assert (s.a, s.b, s.label) == ("Go away.", "Hi!", 0) and (s.chosen, s.rejected) == (c.chosen, c.rejected)


@pytest.mark.parametrize("label", [0, 1, True, 0.0, 1.0, np.int64(1)])
def test_labels_zero_and_one_in_any_numeric_type_are_accepted(label):
    assert comparison_from_row({**ROW, "label": label}, "row 0").label == int(label)


def test_an_episode_row_carries_its_demos_for_a_reward_actor():
    demos = demos_from_rows([ROW, {**ROW, "label": 0}], "data.jsonl: row 4")
    e = Episode(demos, comparison_from_row(ROW, "q"), "polite")
    row = e.as_row()
    assert e.k == 2 and row["objective"] == "polite" and row["demos"][1]["label"] == 0 and row["a"] == "Hi!"
    assert demos_from_rows(row["demos"], "again") == demos


@pytest.mark.parametrize("missing", ["a", "b"])
def test_a_demo_without_both_responses_names_the_row_and_the_demo(missing):
    bad = {k: v for k, v in ROW.items() if k != missing}
    with pytest.raises(DataError, match=rf"data.jsonl: row 4: demo 1: lacks response\(s\) \['{missing}'\].*needs both "
                                        r"responses 'a' and 'b'"):
        demos_from_rows([ROW, bad], "data.jsonl: row 4")


def test_an_empty_response_counts_as_missing():
    with pytest.raises(DataError, match=r"demo 0: lacks response\(s\) \['b'\]"):
        demos_from_rows([{**ROW, "b": ""}], "row 0")


@pytest.mark.parametrize("label", [2, -1, 0.5, "1", None])
def test_a_label_outside_zero_one_names_the_demo_and_the_fix(label):
    with pytest.raises(DataError, match=r"row 7: demo 0: label=.* is not 0 or 1; give 1 if response 'a' is preferred"):
        demos_from_rows([{**ROW, "label": label}], "row 7")


def test_a_demo_without_a_label_says_how_to_give_one():
    with pytest.raises(DataError, match=r"row 0: demo 0: has no 'label'"):
        demos_from_rows([{k: v for k, v in ROW.items() if k != "label"}], "row 0")


def test_demos_that_are_not_a_list_are_an_error():
    with pytest.raises(DataError, match=r"row 2: demos=.* is not a list"):
        demos_from_rows(ROW, "row 2")
    assert demos_from_rows(None, "row 2") == ()


def test_k_is_fixed_or_uniform_on_its_range():
    rng = np.random.default_rng(0)
    assert np.all(draw_k(5, 3, rng) == 3)
    ks = draw_k(20_000, (0, 4), rng)
    assert set(np.unique(ks)) == set(range(5)) and ks.mean() == pytest.approx(2.0, abs=0.05)
    with pytest.raises(DataError, match=r"k=\(3, 1\)"):
        draw_k(1, (3, 1), rng)
