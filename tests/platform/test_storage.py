"""Run directories in storage: pushes that only send what changed, checkpoints that a reader
never sees half written, and pulls of the latest, all or no checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from troupe.platform.errors import ConfigError, TroupeError
from troupe.platform.storage import RemoteRunDir, StorageError, check_location, fetch, is_uri, join


def _local_run(root: Path) -> Path:
    (root / "plots").mkdir(parents=True)
    (root / "config.yaml").write_text("run:\n  steps: 2\n")
    (root / "metrics.jsonl").write_text('{"step": 0}\n')
    (root / "plots" / "reward.png").write_bytes(b"\x89PNG" + bytes(range(256)) * 64)
    return root


def _checkpoint(root: Path, step: int) -> Path:
    folder = root / "checkpoints" / f"step-{step:08d}"
    (folder / "policy").mkdir(parents=True)
    (folder / "policy" / "model.safetensors").write_bytes(os.urandom(1000))
    (folder / "driver.json").write_text(f'{{"step": {step}}}')
    return folder


def test_uris_and_paths_are_told_apart_and_unknown_schemes_refused():
    assert is_uri("s3://bucket/runs") and is_uri("file:///mnt/x") and not is_uri("/mnt/shared/runs")
    assert not is_uri("runs") and not is_uri(None)
    assert join("s3://b/runs/", "grpo-1") == "s3://b/runs/grpo-1" and join("runs", "x") == "runs/x"
    check_location("gs://bucket/runs", "run.out")
    with pytest.raises(ConfigError, match=r"^run.out = 'webdav://h/r': .*use a path .* s3://"):
        check_location("webdav://h/r", "run.out")


def test_push_sends_only_what_changed_and_leaves_no_temporary_files(tmp_path):
    local = _local_run(tmp_path / "local")
    remote = RemoteRunDir(f"file://{tmp_path}/shared/run")
    assert not remote.exists()
    assert remote.push(local) == 3 and remote.exists()
    assert remote.push(local) == 0
    with open(local / "metrics.jsonl", "a") as f:
        f.write('{"step": 1}\n')
    assert remote.push(local) == 1
    assert remote.read_text("metrics.jsonl") == '{"step": 0}\n{"step": 1}\n'
    assert remote.files() == ["config.yaml", "metrics.jsonl", "plots/reward.png"]
    assert (tmp_path / "shared/run/plots/reward.png").read_bytes() == (local / "plots/reward.png").read_bytes()
    assert not [p for p in (tmp_path / "shared").rglob("*") if p.name.startswith(".")]


@pytest.mark.parametrize("object_store", [False, True], ids=["rename", "object-store"])
def test_checkpoints_are_named_by_latest_only_once_whole_and_old_ones_pruned(tmp_path, object_store):
    local = _local_run(tmp_path / "local")
    remote = RemoteRunDir(f"file://{tmp_path}/shared/run")
    remote._atomic_put = object_store  # the upload order an object store gets, on a real filesystem
    for step in (2, 4, 6):
        remote.push_checkpoint(_checkpoint(local, step), keep=[f"step-{s:08d}" for s in (step - 2, step)])
    assert remote.checkpoint_names() == ["step-00000004", "step-00000006"]
    assert remote.read_text("checkpoints/latest").strip() == "step-00000006"
    # A crash mid-upload leaves a folder without driver.json: no reader takes it.
    half = tmp_path / "shared/run/checkpoints/step-00000008/policy"
    half.mkdir(parents=True)
    (half / "model.safetensors").write_bytes(b"torn")
    (tmp_path / "shared/run/checkpoints/latest").unlink()
    assert remote.latest_checkpoint() == "step-00000006"
    got = remote.pull(tmp_path / "back", checkpoints="latest")
    assert sorted(p.name for p in (got / "checkpoints").iterdir()) == ["latest", "step-00000006"]
    assert (got / "checkpoints/step-00000006/policy/model.safetensors").read_bytes() == (
        local / "checkpoints/step-00000006/policy/model.safetensors").read_bytes()


def test_pull_takes_all_latest_or_no_checkpoints(tmp_path):
    local = _local_run(tmp_path / "local")
    remote = RemoteRunDir(f"file://{tmp_path}/shared/run")
    remote.push(local)
    for step in (2, 4):
        remote.push_checkpoint(_checkpoint(local, step), keep=["step-00000002", "step-00000004"])
    names = {mode: sorted(p.name for p in (remote.pull(tmp_path / mode, mode) / "checkpoints").glob("step-*"))
             for mode in ("all", "latest")}
    assert names == {"all": ["step-00000002", "step-00000004"], "latest": ["step-00000004"]}
    none = remote.pull(tmp_path / "none", "none")
    assert not (none / "checkpoints").exists() and (none / "metrics.jsonl").is_file()


def test_fetch_copies_a_uri_or_a_path_and_refuses_what_is_not_a_run(tmp_path):
    local = _local_run(tmp_path / "local")
    _checkpoint(local, 2)
    (local / "checkpoints" / "latest").write_text("step-00000002\n")
    remote = RemoteRunDir(f"file://{tmp_path}/shared/run")
    remote.push(local)
    remote.push_checkpoint(local / "checkpoints/step-00000002", keep=["step-00000002"])
    a = fetch(remote.uri, tmp_path / "a")
    b = fetch(str(local), tmp_path / "b", checkpoints="none")
    assert (a / "checkpoints/step-00000002/driver.json").is_file() and (a / "config.yaml").is_file()
    assert not list((b / "checkpoints").glob("step-*")) and (b / "plots/reward.png").is_file()
    with pytest.raises(TroupeError, match="exists and is not empty: choose a new folder or pass --force"):
        fetch(remote.uri, tmp_path / "a")
    with pytest.raises(TroupeError, match=r"is not a run directory \(no config.yaml there\)"):
        fetch(f"file://{tmp_path}/local/plots", tmp_path / "c")
    with pytest.raises(StorageError, match="does not exist"):
        RemoteRunDir(f"file://{tmp_path}/nowhere").pull(tmp_path / "d")
