import os

import pytest
import torch

from troupe.platform.checkpoint import (
    CheckpointDir,
    atomic_write_json,
    atomic_write_text,
    load_state_dict,
    save_state_dict,
)


def test_atomic_write_replaces_whole_file(tmp_path):
    p = tmp_path / "f.txt"
    atomic_write_text(p, "one")
    atomic_write_text(p, "two")
    assert p.read_text() == "two"
    assert [x.name for x in tmp_path.iterdir()] == ["f.txt"]


def test_failed_write_leaves_previous_file_intact(tmp_path, monkeypatch):
    p = tmp_path / "state.json"
    atomic_write_json(p, {"step": 1})

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_json(p, {"step": 2})
    monkeypatch.undo()
    assert '"step": 1' in p.read_text()
    assert [x.name for x in tmp_path.iterdir()] == ["state.json"]


def test_safetensors_roundtrip(tmp_path):
    t = {"w": torch.randn(3, 4), "b": torch.arange(5)}
    save_state_dict(tmp_path / "m.safetensors", t)
    back = load_state_dict(tmp_path / "m.safetensors")
    assert torch.equal(back["w"], t["w"]) and torch.equal(back["b"], t["b"])


def test_safetensors_keep_bf16_and_read_only_the_keys_under_a_prefix(tmp_path):
    t = {"model/w": torch.randn(3, 4).to(torch.bfloat16), "optim/0/exp_avg": torch.zeros(3, 4)}
    save_state_dict(tmp_path / "m.safetensors", t)
    back = load_state_dict(tmp_path / "m.safetensors", prefix="model/")
    assert list(back) == ["model/w"] and back["model/w"].dtype == torch.bfloat16
    assert torch.equal(back["model/w"], t["model/w"])


def test_crash_mid_checkpoint_keeps_last_good_one(tmp_path):
    ck = CheckpointDir(tmp_path / "ckpt")
    ck.write(2, lambda d: (d / "x").write_text("good"))

    def crash(d):
        (d / "x").write_text("partial")
        raise KeyboardInterrupt  # the driver killed while writing

    with pytest.raises(KeyboardInterrupt):
        ck.write(4, crash)
    latest = ck.latest()
    assert latest.name == "step-00000002" and (latest / "x").read_text() == "good"
    assert not list((tmp_path / "ckpt").glob(".step-*"))


def test_keeps_only_newest(tmp_path):
    ck = CheckpointDir(tmp_path, keep=2)
    for s in (1, 2, 3):
        ck.write(s, lambda d: (d / "x").write_text("."))
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000002", "step-00000003"]
    assert ck.latest().name == "step-00000003"


def test_build_directory_moves_a_whole_directory_into_place_or_leaves_nothing(tmp_path):
    from troupe.platform.checkpoint import build_directory

    def build(d):
        (d / "a.txt").write_text("a")
        return {"built": True}

    final = tmp_path / "cache" / "key"
    assert build_directory(final, build) == {"built": True}
    assert (final / "a.txt").read_text() == "a"

    def broken(d):
        (d / "half.txt").write_text("x")
        raise RuntimeError("stopped")

    other = tmp_path / "cache" / "other"
    with pytest.raises(RuntimeError, match="stopped"):
        build_directory(other, broken)
    assert not other.exists() and sorted(p.name for p in final.parent.iterdir()) == ["key"]
    # another process got there first: its directory stays
    build_directory(final, lambda d: (d / "b.txt").write_text("b"))
    assert sorted(p.name for p in final.iterdir()) == ["a.txt"]
