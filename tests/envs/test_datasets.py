"""The dataset task: local files of every format, a saved folder, a hub id offline, field
mappings, chat rows rendered by the tokenizer's template, a template override, no surprise SFT,
and one error per bad input."""

import json

import numpy as np
import pytest

from troupe.actors.models import chat_template_text, load_tokenizer
from troupe.actors.sampling import chat_format
from troupe.envs.dataset_task import DatasetTask
from troupe.envs.datasets import chat_row
from troupe.envs.task import build_task
from troupe.platform.errors import ConfigError, DataError

ROWS = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(6)]
CHAT_ROWS = [{"prompt": [{"role": "system", "content": "Add."}, {"role": "user", "content": f"{i}+1="}],
              "answer": str(i + 1)} for i in range(4)]
SYSTEM = "Answer with the number only."


@pytest.fixture(autouse=True)
def _private_datasets_cache(tmp_path, monkeypatch):
    """The datasets library caches what it reads (and hub datasets) here, not in ~/.cache."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets-cache"))


def write(path, rows, fmt=None):
    """``rows`` written to ``path`` in the format its suffix names (``fmt="disk"``: save_to_disk)."""
    import datasets

    fmt = fmt or path.suffix.lstrip(".")
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    elif fmt == "csv":
        datasets.Dataset.from_list(rows).to_csv(str(path), index=False)
    elif fmt == "parquet":
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    elif fmt == "disk":
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return str(path)


def task(train, held_out=None, **config):
    return DatasetTask(train=train, eval=held_out or train, **config)


@pytest.mark.parametrize("name", ["d.jsonl", "d.json", "d.csv", "d.parquet", "saved"])
def test_each_local_format_loads_through_the_task(tmp_path, name):
    path = write(tmp_path / name, ROWS, "disk" if name == "saved" else None)
    t = task(path)
    t.config.validate()
    held_out = t.eval_rows(4)
    assert [(r["prompt"], str(r["answer"])) for r in held_out] == [(r["prompt"], r["answer"]) for r in ROWS[:4]]
    rows = t.train_rows(5, np.random.default_rng(0))
    assert len(rows) == 5 and all(r in t.eval_rows(6) for r in rows)
    assert all("messages" not in r for r in rows)  # a plain prompt is one user turn


def test_a_saved_dataset_dict_gives_the_configured_splits(tmp_path):
    import datasets

    path = tmp_path / "dict"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:4]),
                          "validation": datasets.Dataset.from_list(ROWS[4:])}).save_to_disk(str(path))
    t = task(str(path), eval_split="validation")
    assert [r["prompt"] for r in t.eval_rows(10)] == [r["prompt"] for r in ROWS[4:]]
    assert {r["prompt"] for r in t.train_rows(20, np.random.default_rng(0))} <= {r["prompt"] for r in ROWS[:4]}
    with pytest.raises(DataError, match=r"task.eval=.*has the splits \['train', 'validation'\], not 'test': "
                                        r"set task.eval_split"):
        task(str(path)).eval_rows(1)


def test_jsonl_is_the_same_task_under_its_old_name(tmp_path):
    from troupe.platform.registry import TASKS

    assert TASKS.get("jsonl") is TASKS.get("dataset") is DatasetTask
    path = write(tmp_path / "d.jsonl", ROWS)
    cfg = DatasetTask.Config(name="jsonl", train=path, eval=path)
    assert type(build_task(cfg)) is DatasetTask
    # The SFT cache key of a jsonl task is what it was before the new fields existed.
    assert build_task(cfg).cache_key() == {"name": "jsonl", "train": path, "eval": path, "reward": "exact_match"}
    assert "system_prompt" in task(path, system_prompt=SYSTEM).cache_key()


def test_a_field_mapping_renames_columns(tmp_path):
    rows = [{"question": r["prompt"], "solution": r["answer"], "level": i} for i, r in enumerate(ROWS)]
    path = write(tmp_path / "d.parquet", rows)
    (first, *_) = task(path, fields={"prompt": "question", "answer": "solution"}).eval_rows(2)
    assert first == {"prompt": "0+0=", "answer": "0", "level": 0}  # other columns reach the checker


def test_chat_rows_keep_their_turns_and_a_trailing_assistant_turn_is_the_answer(tmp_path):
    rows = [*CHAT_ROWS, {"prompt": [{"role": "user", "content": "9+1="}, {"role": "assistant", "content": "10"}]}]
    path = write(tmp_path / "chat.jsonl", rows)
    held_out = task(path).eval_rows(5)
    assert held_out[0]["messages"] == CHAT_ROWS[0]["prompt"] and held_out[0]["answer"] == "1"
    assert held_out[0]["prompt"] == "Add.\n\n0+1="  # the plain-text fallback
    assert held_out[4]["messages"] == [{"role": "user", "content": "9+1="}] and held_out[4]["answer"] == "10"


def test_the_system_prompt_is_added_to_rows_without_one():
    plain = chat_row({"prompt": "2+2=", "answer": "4"}, 0, "src", SYSTEM)
    assert plain["messages"] == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "2+2="}]
    own = chat_row(dict(CHAT_ROWS[0]), 0, "src", SYSTEM)
    assert own["messages"][0] == {"role": "system", "content": "Add."}  # a row's own system turn wins


def test_chat_rows_and_the_system_prompt_render_with_the_tokenizers_template(tmp_path, tiny_model_dir):
    from troupe.actors.rollout_hf import HFRolloutEngine
    from troupe.algorithms.sft import sft_tensors

    path = write(tmp_path / "d.jsonl", ROWS[:2])
    rows = task(path, system_prompt=SYSTEM).eval_rows(2)
    tok = load_tokenizer(tiny_model_dir)
    texts = chat_format(tok, [r["prompt"] for r in rows], rows=rows)
    assert texts[0] == (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n0+0=<|im_end|>\n"
                        "<|im_start|>assistant\n")
    # Without a template the prompt is its plain text.
    tok.chat_template = None
    assert chat_format(tok, [r["prompt"] for r in rows], rows=rows)[0] == f"{SYSTEM}\n\n0+0="

    # SFT fits the answer after the same prompt the engines generate from.
    tok = load_tokenizer(tiny_model_dir)
    input_ids, _, labels = sft_tensors(tok, rows[:1])
    p_ids = tok(texts[0], add_special_tokens=False)["input_ids"]
    assert input_ids[0, : len(p_ids)].tolist() == p_ids and (labels[0, : len(p_ids)] == -100).all()
    engine = HFRolloutEngine(tiny_model_dir)
    assert engine._encode([rows[0]["prompt"]], rows[:1])["input_ids"][0].tolist() == p_ids
    # The same text with other turns is another prompt: the engine's de-duplication keeps them apart.
    other = {**rows[0], "messages": [{"role": "user", "content": "0+0="}]}
    enc = engine._encode([rows[0]["prompt"]] * 2, [rows[0], other])
    assert enc["input_ids"][0].tolist() != enc["input_ids"][1].tolist()


def test_a_chat_template_override_is_a_string_or_a_jinja_file(tmp_path, tiny_model_dir):
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}>"
    (tmp_path / "plain.jinja").write_text(template)
    assert chat_template_text(template) == template
    assert chat_template_text(str(tmp_path / "plain.jinja")) == template
    assert chat_template_text(None) is None
    tok = load_tokenizer(tiny_model_dir, chat_template_text(str(tmp_path / "plain.jinja")))
    assert chat_format(tok, ["1+1="]) == ["[user] 1+1=\n>"]
    with pytest.raises(ConfigError, match=r"model.chat_template=.*missing.jinja.*no such template file"):
        chat_template_text(str(tmp_path / "missing.jinja"))
    with pytest.raises(ConfigError, match=r"neither a file nor a Jinja template"):
        chat_template_text("chatml")


def test_sft_runs_by_default_for_embedded_models_only(tiny_model_dir, tmp_path):
    from troupe.actors.models import TinyLMSpec
    from troupe.algorithms.sft import ModelConfig, SFTConfig, _key_fields, prepare_policy
    from troupe.platform.config import to_dict

    assert ModelConfig().sft_steps() == 300 and ModelConfig(path="tiny-vl").sft_steps() == 300
    assert ModelConfig(path=tiny_model_dir).sft_steps() == 0
    assert ModelConfig(path=tiny_model_dir, sft=SFTConfig(enabled=True, steps=20)).sft_steps() == 20
    assert ModelConfig(sft=SFTConfig(enabled=False)).sft_steps() == 0
    # The SFT cache key of an embedded run is the one it had before these options existed.
    old = {"path": "tiny", "dtype": "float32", "device": "cpu", "tiny": to_dict(TinyLMSpec()),
           "sft": {"steps": 300, "batch_size": 64, "lr": 3e-3, "seed": 0}, "cache_dir": None}
    assert _key_fields(ModelConfig()) == old
    assert _key_fields(ModelConfig(chat_template="{{ x }}"))["chat_template"] == "{{ x }}"

    info = {}
    cfg = ModelConfig(path=tiny_model_dir, cache_dir=str(tmp_path / "cache"))
    assert prepare_policy(cfg, None, {}, info) == tiny_model_dir
    assert info["sft"] == "none" and info["sft_steps"] == 0 and "model.sft.enabled=true" in info["sft_reason"]
    assert not (tmp_path / "cache").exists()


def test_an_unknown_file_format_lists_the_accepted_ones(tmp_path):
    path = tmp_path / "d.txt"
    path.write_text("0+0=\t0\n")
    accepted = r"accepted: a .jsonl, .json, .csv or .parquet file, or a folder written by datasets.Dataset.save_to_disk"
    with pytest.raises(ConfigError, match=rf"task.train: dataset file .*d.txt' has an unknown format '.txt'; {accepted}"):
        task(str(path)).config.validate()
    with pytest.raises(DataError, match=rf"task.train=.*d.txt.*unknown format '.txt'; {accepted}"):
        task(str(path)).train_rows(1, np.random.default_rng(0))


def test_a_field_mapping_to_a_missing_column_lists_the_columns(tmp_path):
    path = write(tmp_path / "d.csv", ROWS)
    with pytest.raises(DataError, match=r"task.eval=.*d.csv.*task.fields.prompt='question' names no column of the "
                                        r"dataset; its columns: \['prompt', 'answer'\]"):
        task(path, fields={"prompt": "question"}).eval_rows(1)
    with pytest.raises(DataError, match=r"no 'prompt' column; its columns: \['question', 'answer'\]\. Map one with "
                                        r"task.fields.prompt=COLUMN"):
        task(write(tmp_path / "q.jsonl", [{"question": "1+1=", "answer": "2"}])).eval_rows(1)


def test_a_chat_turn_with_an_unknown_role_names_the_row_and_the_allowed_roles(tmp_path):
    rows = [CHAT_ROWS[0], {"prompt": [{"role": "tool", "content": "x"}, {"role": "user", "content": "1+1="}],
                           "answer": "2"}]
    path = write(tmp_path / "chat.parquet", rows)
    with pytest.raises(DataError, match=r"task.train=.*chat.parquet.*row 1: messages turn 0 has the role 'tool'; "
                                        r"allowed roles: system, user, assistant"):
        task(path).train_rows(1, np.random.default_rng(0))


def test_an_empty_dataset_is_one_error(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match=r"task.eval=.*empty.jsonl.* is empty \(no rows\)"):
        task(str(empty)).eval_rows(1)
    import datasets

    path = tmp_path / "empty.parquet"
    text = datasets.Value("string")
    datasets.Dataset.from_dict({"prompt": [], "answer": []},
                               features=datasets.Features({"prompt": text, "answer": text})).to_parquet(str(path))
    with pytest.raises(DataError, match=r"task.train=.*empty.parquet.*the dataset is empty \(no rows\)"):
        task(str(path)).train_rows(1, np.random.default_rng(0))


def test_a_row_without_an_answer_says_how_to_give_one(tmp_path):
    path = write(tmp_path / "d.jsonl", [{"prompt": "1+1="}])
    with pytest.raises(DataError, match=r"row 0 lacks required field\(s\) \['answer'\].*task.fields.answer=COLUMN"):
        task(path).eval_rows(1)


@pytest.mark.timeout(60)
def test_a_hub_id_offline_is_a_clear_error_naming_the_id(tmp_path, monkeypatch):
    import datasets
    import huggingface_hub.constants

    # Both libraries read HF_HUB_OFFLINE when imported; patch their constants too.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    hub_id = "troupe-tests/no-such-dataset"
    t = task(hub_id, split="train")
    t.config.validate()  # a hub id is checked when it loads
    with pytest.raises(DataError, match=rf"task.train='{hub_id}': cannot load the hub dataset '{hub_id}' \(split "
                                        r"'train'\).*without a network.*give a local path instead"):
        t.train_rows(1, np.random.default_rng(0))


def test_a_missing_local_path_is_not_taken_for_a_hub_id(tmp_path):
    with pytest.raises(ConfigError, match=r"task.train: dataset file .*nope.parquet' does not exist"):
        task(str(tmp_path / "nope.parquet")).config.validate()


@pytest.mark.timeout(600)
def test_grpo_runs_on_a_parquet_of_chat_rows_with_a_model_on_disk_and_no_sft(ray_local, troupe_cache, tmp_path,
                                                                           tiny_model_dir):
    from troupe import Run
    from troupe.actors.sampling import SamplingConfig

    rows = [{"prompt": [{"role": "user", "content": f"{a}+{b}="}], "answer": str(a + b)}
            for a in range(10, 16) for b in range(20, 23)]
    train = write(tmp_path / "train.parquet", rows[:12])
    held_out = write(tmp_path / "eval.parquet", rows[12:])
    out = tmp_path / "run"
    overrides = ["run.progress=false", "run.steps=2", "run.eval_every=0", "run.checkpoint_every=0",
                 "task.name=dataset", f"task.train={train}", f"task.eval={held_out}", f"task.system_prompt={SYSTEM}",
                 "model.path=" + tiny_model_dir, "eval.num_prompts=4", "grpo.prompts_per_step=2",
                 "grpo.group_size=4"]
    with Run("grpo", preset="smoke", overrides=overrides, out=out) as run:
        summary = run.run()
        row = run.algo.eval_rows[0]
        batch = run.graph["rollout"].call("generate", [row["prompt"]], SamplingConfig(max_new_tokens=2), [row])[0]
    prepared = json.loads((out / "prepare.json").read_text())
    assert prepared["sft"] == "none" and prepared["sft_steps"] == 0 and prepared["model_path"] == tiny_model_dir
    trained = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in trained if "loss/policy" in r]) == 2
    assert summary["eval_accuracy_end"] is not None
    tok = load_tokenizer(tiny_model_dir)
    shown = tok.decode(batch["prompt_ids"][0][batch["prompt_mask"][0].bool()])
    assert shown == chat_format(tok, [row["prompt"]], rows=[row])[0] and f"system\n{SYSTEM}" in shown
