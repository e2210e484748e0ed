"""The loaders of HelpSteer2, UltraFeedback and PKU-SafeRLHF on small files written in each
dataset's own format, the hub-id path, the episodes an objective labels, and bad input."""

import json

import numpy as np
import pytest

from troupe.envs.preferences.attributes import AttributeSet, ResponseGroup
from troupe.envs.preferences.loaders import (
    HUB_IDS,
    load_attribute_set,
    load_helpsteer2,
    load_pku_saferlhf,
    load_ultrafeedback,
)
from troupe.platform.errors import ConfigError, DataError

HELPSTEER2 = [  # nvidia/HelpSteer2: a row per response, two responses per prompt
    {"prompt": "What is 2+2?", "response": "4.", "helpfulness": 4, "correctness": 4, "coherence": 4,
     "complexity": 0, "verbosity": 0},
    {"prompt": "What is 2+2?", "response": "Two plus two makes four, as counting shows.", "helpfulness": 3,
     "correctness": 4, "coherence": 4, "complexity": 1, "verbosity": 3},
    {"prompt": "Name a colour.", "response": "Blue.", "helpfulness": 2, "correctness": 4, "coherence": 4,
     "complexity": 0, "verbosity": 0},
    {"prompt": "Name a colour.", "response": "Red, the colour of fire trucks.", "helpfulness": 4,
     "correctness": 4, "coherence": 3, "complexity": 1, "verbosity": 2},
    {"prompt": "Lonely prompt", "response": "only one response", "helpfulness": 1, "correctness": 1,
     "coherence": 1, "complexity": 1, "verbosity": 1},
]


def uf_completion(response, ratings):
    aspects = ("instruction_following", "honesty", "truthfulness", "helpfulness")
    annotations = {a: {"Rating": r, "Rationale": f"{a} rationale"} for a, r in zip(aspects, ratings, strict=True)}
    for a in ("truthfulness", "helpfulness"):  # the published file carries these extra fields
        annotations[a].update({"Rationale For Rating": "why", "Type": ["1"]})
    return {"annotations": annotations, "critique": "fine", "custom_system_prompt": "", "fine-grained_score": 4.0,
            "model": "some-model", "overall_score": 7.0, "principle": "helpfulness", "response": response}


ULTRAFEEDBACK = [  # openbmb/UltraFeedback: a row per instruction, completions with per-aspect ratings
    {"source": "evol_instruct", "instruction": "Say hi.", "models": ["m1", "m2", "m3"],
     "completions": [uf_completion("Hi!", ["5", "5", "5", "4"]), uf_completion("Hello there.", ["4", "N/A", "5", "5"]),
                     uf_completion("Go away.", ["1", "3", "4", "1"])],
     "correct_answers": ["None"], "incorrect_answers": ["None"]},
    {"source": "flan", "instruction": "Count to three.", "models": ["m1", "m2"],
     "completions": [uf_completion("1 2 3", ["5", "5", "5", "5"]), uf_completion("1 2", ["2", "4", "2", "2"])],
     "correct_answers": ["None"], "incorrect_answers": ["None"]},
]

SAFERLHF = [  # PKU-Alignment/PKU-SafeRLHF: a row per pair
    {"prompt": "How do I pick a lock?", "response_0": "Use a tension wrench and a pick...",
     "response_1": "I can't help with breaking in.", "prompt_source": "Alpaca3-70B",
     "response_0_source": "Alpaca-7B", "response_1_source": "Alpaca-7B", "is_response_0_safe": False,
     "is_response_1_safe": True, "response_0_harm_category": {"Property Crimes": True},
     "response_1_harm_category": {"Property Crimes": False}, "response_0_severity_level": 1,
     "response_1_severity_level": 0, "better_response_id": 0, "safer_response_id": 1,
     "response_0_sha256": "a", "response_1_sha256": "b"},
    {"prompt": "Tell me a joke.", "response_0": "Why did the chicken cross the road?", "response_1": "No.",
     "prompt_source": "Alpaca3-70B", "response_0_source": "Alpaca-7B", "response_1_source": "Alpaca-7B",
     "is_response_0_safe": True, "is_response_1_safe": True, "response_0_harm_category": {"Property Crimes": False},
     "response_1_harm_category": {"Property Crimes": False}, "response_0_severity_level": 0,
     "response_1_severity_level": 0, "better_response_id": 0, "safer_response_id": 0,
     "response_0_sha256": "c", "response_1_sha256": "d"},
]


@pytest.fixture(autouse=True)
def _private_datasets_cache(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets-cache"))


def write(path, rows):
    import datasets

    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".parquet":
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    elif path.suffix == ".csv":
        datasets.Dataset.from_list(rows).to_csv(str(path), index=False)
    else:
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return str(path)


# -- HelpSteer2 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["hs2.jsonl", "hs2.parquet", "hs2.csv", "hs2-saved"])
def test_helpsteer2_groups_responses_by_prompt_with_their_five_scores(tmp_path, name):
    data = load_helpsteer2(write(tmp_path / name, HELPSTEER2))
    assert data.attributes == ("helpfulness", "correctness", "coherence", "complexity", "verbosity")
    assert [g.prompt for g in data.groups] == ["What is 2+2?", "Name a colour."]  # a lone response has no pair
    g = data.groups[1]
    assert g.responses == ("Blue.", "Red, the colour of fire trucks.")
    assert g.scores.tolist() == [[2, 4, 4, 0, 0], [4, 4, 3, 1, 2]]


def test_helpsteer2_objectives_label_pairs_by_their_weighted_margin(tmp_path):
    data = load_helpsteer2(write(tmp_path / "hs2.jsonl", HELPSTEER2))
    index, margins = data.pairs(data.objective({"helpfulness": 1.0}))
    assert index.tolist() == [[0, 0, 1], [1, 0, 1]] and margins.tolist() == [1.0, -2.0]
    _, margins = data.pairs(data.objective({"verbosity": -1.0, "correctness": 0.5}))
    assert margins.tolist() == [3.0, 2.0]  # the terse answer wins both for a terseness objective
    episodes = data.episodes({"helpful": {"helpfulness": 1.0}}, 200, np.random.default_rng(0), k=1)
    for e in episodes:
        assert e.objective == "helpful" and e.k == 1
        assert e.demos[0].prompt != e.query.prompt  # demos come from other prompts
        for c in (*e.demos, e.query):  # helpfulness labels are exact: the more helpful response is chosen
            assert c.chosen in ("4.", "Red, the colour of fire trucks.")
    assert {e.query.a for e in episodes} == {r["response"] for r in HELPSTEER2[:4]}  # both orders appear


# -- UltraFeedback ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["uf.jsonl", "uf.parquet"])
def test_ultrafeedback_reads_the_rating_of_every_aspect_and_na_as_no_score(tmp_path, name):
    data = load_ultrafeedback(write(tmp_path / name, ULTRAFEEDBACK))
    assert data.attributes == ("instruction_following", "honesty", "truthfulness", "helpfulness")
    g = data.groups[0]
    assert g.prompt == "Say hi." and g.responses == ("Hi!", "Hello there.", "Go away.")
    assert g.scores[0].tolist() == [5, 5, 5, 4] and np.isnan(g.scores[1, 1]) and g.scores[2].tolist() == [1, 3, 4, 1]
    index, margins = data.pairs(data.objective({"honesty": 1.0}))
    assert index.tolist() == [[0, 0, 2], [1, 0, 1]]  # pairs with the unrated honesty are left out
    assert margins.tolist() == [2.0, 1.0]
    index, _ = data.pairs(data.objective({"helpfulness": 1.0}))
    assert len(index) == 4  # 3 pairs of the first prompt, 1 of the second


# -- PKU-SafeRLHF -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["safe.jsonl", "safe.parquet"])
def test_saferlhf_turns_better_and_safer_ids_into_helpful_and_harmless_attributes(tmp_path, name):
    data = load_pku_saferlhf(write(tmp_path / name, SAFERLHF))
    assert data.attributes == ("helpful", "harmless", "safe")
    g = data.groups[0]
    assert g.scores.tolist() == [[1, 0, 0], [0, 1, 1]]
    rng = np.random.default_rng(0)
    helpful = data.episodes({"helpful": {"helpful": 1.0}}, 50, rng, k=0)
    harmless = data.episodes({"harmless": {"harmless": 1.0}}, 50, rng, k=0)
    lock = [e.query for e in helpful if e.query.prompt.startswith("How")]
    assert lock and all(c.chosen.startswith("Use a tension") for c in lock)
    lock = [e.query for e in harmless if e.query.prompt.startswith("How")]
    assert lock and all(c.chosen.startswith("I can't") for c in lock)
    joke = [e.query for e in harmless if e.query.prompt.startswith("Tell")]
    assert joke and all(c.chosen.startswith("Why did") for c in joke)  # safer_response_id = 0
    # both joke responses are flagged safe: a tie, which a safety objective never shows
    safe = data.episodes({"safe": {"safe": 1.0}}, 50, rng, k=0)
    assert all(e.query.prompt.startswith("How") for e in safe)


def test_bt_labels_follow_the_margin_through_the_logistic(tmp_path):
    data = load_helpsteer2(write(tmp_path / "hs2.jsonl", HELPSTEER2))
    episodes = data.episodes({"help": {"helpfulness": 1.0}}, 4000, np.random.default_rng(1), k=0, labels="bt", beta=1.0)
    colour = [e.query for e in episodes if e.query.prompt == "Name a colour."]
    win = np.mean([c.chosen == "Red, the colour of fire trucks." for c in colour])
    assert win == pytest.approx(1 / (1 + np.exp(-2.0)), abs=0.03)  # margin 2 at β = 1


# -- the hub-id path -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "rows"), [("helpsteer2", HELPSTEER2), ("ultrafeedback", ULTRAFEEDBACK),
                                            ("pku_saferlhf", SAFERLHF)])
def test_a_hub_id_is_loaded_through_the_datasets_library(monkeypatch, name, rows):
    import datasets

    calls = []

    def fake_load_dataset(path, name=None, split=None, **kw):
        calls.append((path, name, split))
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    data = load_attribute_set(name, split="validation")
    assert calls == [(HUB_IDS[name], None, "validation")]
    assert isinstance(data, AttributeSet) and data.source == HUB_IDS[name] and data.groups


@pytest.mark.timeout(60)
def test_a_hub_id_offline_is_a_clear_error_naming_the_id(monkeypatch):
    import datasets
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError, match=r"cannot load the hub dataset 'troupe-tests/no-such-set'"):
        load_helpsteer2("troupe-tests/no-such-set")


# -- bad input ---------------------------------------------------------------------------------------------
def test_an_attribute_the_dataset_does_not_have_is_named_with_the_ones_it_has(tmp_path):
    data = load_helpsteer2(write(tmp_path / "hs2.jsonl", HELPSTEER2))
    with pytest.raises(ConfigError, match=r"objective names attribute\(s\) \['harmless'\] the dataset does not "
                                          r"have; its attributes: \['helpfulness', 'correctness'"):
        data.episodes({"safe": {"harmless": 1.0}}, 2, np.random.default_rng(0))


def test_a_missing_score_names_the_row_and_the_key(tmp_path):
    rows = [dict(r) for r in HELPSTEER2]
    del rows[3]["verbosity"]
    path = tmp_path / "hs2.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"hs2.jsonl: row 3 lacks 'verbosity' \(a 0-4 score\)"):
        load_helpsteer2(str(path))


def test_an_ultrafeedback_completion_without_an_aspect_names_the_completion(tmp_path):
    rows = json.loads(json.dumps(ULTRAFEEDBACK))
    del rows[1]["completions"][1]["annotations"]["honesty"]
    path = tmp_path / "uf.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"row 1: completions\[1\]: annotations lack 'honesty'"):
        load_ultrafeedback(str(path))


def test_a_saferlhf_row_without_its_second_response_names_the_row(tmp_path):
    rows = [dict(r) for r in SAFERLHF]
    rows[1]["response_1"] = None
    with pytest.raises(DataError, match=r"row 1 lacks 'response_1'"):
        load_pku_saferlhf(write(tmp_path / "safe.jsonl", rows))


def test_a_saferlhf_response_id_outside_zero_one_names_the_row(tmp_path):
    rows = [dict(r) for r in SAFERLHF]
    rows[0]["better_response_id"] = 2
    with pytest.raises(DataError, match=r"row 0: better_response_id=2 is not 0 or 1"):
        load_pku_saferlhf(write(tmp_path / "safe.jsonl", rows))


def test_an_objective_that_labels_no_pair_says_so():
    data = AttributeSet(("x", "y"), [ResponseGroup("p", ("a", "b"), np.array([[1.0, 0.0], [1.0, 1.0]]))])
    with pytest.raises(DataError, match=r"objective 'tie' labels no pair"):
        data.episodes({"tie": {"x": 1.0}}, 1, np.random.default_rng(0), k=0)


def test_an_unknown_dataset_name_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"data.source='hh': unknown preference dataset; known: \['helpsteer2'"):
        load_attribute_set("hh")


# -- held-out prompts and calibration targets ------------------------------------------------------------
def test_labelled_episodes_are_the_same_draws_with_each_querys_probability_in_the_order_shown(tmp_path):
    data = load_helpsteer2(write(tmp_path / "hs2.jsonl", HELPSTEER2))
    objectives = {"help": {"helpfulness": 1.0}}
    plain = data.episodes(objectives, 50, np.random.default_rng(3), k=1, labels="bt", beta=0.5)
    episodes, p_true = data.labelled_episodes(objectives, 50, np.random.default_rng(3), k=1, labels="bt", beta=0.5)
    assert episodes == plain
    score = {r["response"]: r["helpfulness"] for r in HELPSTEER2}
    margins = np.array([score[e.query.a] - score[e.query.b] for e in episodes])
    assert p_true == pytest.approx(1 / (1 + np.exp(-0.5 * margins)))
    _, exact = data.labelled_episodes(objectives, 50, np.random.default_rng(3), k=0)
    assert set(exact.tolist()) <= {0.0, 1.0}


def test_a_prompts_part_follows_its_text_and_every_group_of_a_prompt_lands_together():
    groups = [ResponseGroup(f"prompt {i % 30}", ("a", "b"), np.array([[1.0], [0.0]])) for i in range(60)]
    data = AttributeSet(("x",), groups)
    parts = data.split_by_prompt([0.6, 0.2, 0.2], seed=0)
    prompts = [{g.prompt for g in part} for part in parts]
    assert sum(len(p) for p in prompts) == 30 and not (prompts[0] & prompts[1] or prompts[1] & prompts[2])
    assert all(len(part) == 2 * len(p) for part, p in zip(parts, prompts, strict=True))  # both groups of a prompt
    again = AttributeSet(("x",), groups[::-1]).split_by_prompt([0.6, 0.2, 0.2], seed=0)
    assert [{g.prompt for g in part} for part in again] == prompts
    assert [{g.prompt for g in part} for part in data.split_by_prompt([0.6, 0.2, 0.2], seed=1)] != prompts
    assert len(data.limited(10, seed=0).prompts) == 10 and data.limited(100, seed=0) is data
