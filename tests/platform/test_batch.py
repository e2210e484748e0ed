import pickle

import pytest
import torch

from troupe.platform.batch import Batch


def make(n=4, width=3):
    return Batch({"ids": torch.arange(n * width).view(n, width), "r": torch.arange(n).float()},
                 {"text": [f"t{i}" for i in range(n)]})


def test_len_and_fields():
    b = make()
    assert len(b) == 4
    assert set(b.keys()) == {"ids", "r", "text"}


def test_disagreeing_sizes_are_rejected():
    with pytest.raises(ValueError, match="disagree"):
        Batch({"a": torch.zeros(3)}, {"t": ["x", "y"]})


def test_select_by_slice_list_and_mask_keeps_rows_together():
    b = make()
    assert b.select(slice(1, 3))["text"] == ["t1", "t2"]
    sel = b.select([3, 0])
    assert sel["text"] == ["t3", "t0"] and sel["r"].tolist() == [3.0, 0.0]
    assert b.select(torch.tensor([True, False, True, False]))["text"] == ["t0", "t2"]


def test_split_covers_every_row_once():
    b = make(n=5)
    parts = b.split(2)
    assert [len(p) for p in parts] == [2, 3]
    assert sum((p["text"] for p in parts), []) == b["text"]


def test_concat_pads_completions_right_and_prompts_left():
    a = Batch({"prompt_ids": torch.tensor([[7, 8]]), "completion_ids": torch.tensor([[1, 2, 3]])})
    b = Batch({"prompt_ids": torch.tensor([[9]]), "completion_ids": torch.tensor([[4]])})
    c = Batch.concat([a, b])
    assert c["prompt_ids"].tolist() == [[7, 8], [0, 9]]
    assert c["completion_ids"].tolist() == [[1, 2, 3], [4, 0, 0]]


def test_setitem_checks_length():
    b = make()
    with pytest.raises(ValueError, match="rows"):
        b["adv"] = torch.zeros(3)
    b["adv"] = torch.ones(4)
    assert b["adv"].sum() == 4


def test_require_names_missing_fields():
    with pytest.raises(KeyError, match="advantages"):
        make().require("advantages", who="update")


def test_pickle_roundtrip():
    b = make()
    b.meta["version"] = 3
    c = pickle.loads(pickle.dumps(b))
    assert torch.equal(c["ids"], b["ids"]) and c["text"] == b["text"] and c.meta["version"] == 3


def test_concat_pads_letter_logprobs_with_minus_infinity():
    a = Batch({"option_logprobs": torch.zeros(1, 2)})
    b = Batch({"option_logprobs": torch.zeros(1, 3)})
    out = Batch.concat([a, b])["option_logprobs"]
    assert out.shape == (2, 3) and out[0, 2] == float("-inf") and out[1, 2] == 0
