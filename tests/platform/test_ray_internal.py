"""troupe.platform.ray_internal: the same answers as Ray's private API, with it and without it."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from troupe.cluster.submit import upload_size
from troupe.platform import ray_internal

PRIVATE_MODULES = ("ray._private.ray_constants", "ray._private.runtime_env.packaging")


def block_private_ray(monkeypatch) -> None:
    """Ray as if its private modules were gone: importing them raises ImportError."""
    for name in PRIVATE_MODULES:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError):
        from ray._private.ray_constants import DEBUG_AUTOSCALING_STATUS  # noqa: F401


@pytest.fixture()
def working_dir(tmp_path: Path) -> Path:
    """A tree that exercises every rule of the upload walk."""
    files = {
        ".gitignore": "*.log\n!keep.log\nbuild/\n/top_only.txt\n# a comment\n\n  data[0-9].csv  \nnotes/**/draft\n",
        ".rayignore": "secret/\n\\#hash.txt\n",
        ".git/HEAD": "ref", ".venv/bin/python": "", "__pycache__/a.pyc": "", "pkg/__pycache__/b.pyc": "",
        "a.py": "x" * 10, "b.log": "", "keep.log": "kept", "top_only.txt": "", "#hash.txt": "",
        "data1.csv": "", "dataX.csv": "yy", "build/out.bin": "", "secret/key": "", "model.bin": "",
        "extra/e.txt": "", "notes/a/b/draft": "", "notes/draft": "", "notes/keep.md": "",
        "sub/.gitignore": "*.tmp\n**/deep\n![ab].tmp\n", "sub/top_only.txt": "", "sub/x.tmp": "",
        "sub/a.tmp": "", "sub/y.py": "", "sub/b.log": "", "sub/a/deep/z": "", "sub/deep/w": "",
        "pkg/mod.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "empty").mkdir()
    return tmp_path


def walked(root: Path, excludes: list[str]) -> list[str]:
    out: list[str] = []
    ray_internal.walk_upload(root, excludes, lambda p: out.append(p.relative_to(root).as_posix()))
    return out


def rays_walk(root: Path, excludes: list[str], include_gitignore: bool) -> list[str]:
    """What Ray's own working_dir packaging walks (ray._private.runtime_env.packaging._zip_files)."""
    from ray._private.ray_constants import get_runtime_env_default_excludes
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    out: list[str] = []
    patterns = get_runtime_env_default_excludes() + excludes
    _dir_travel(root, [_get_excludes(root, patterns)], lambda p: out.append(p.relative_to(root).as_posix()),
                include_gitignore=include_gitignore, logger=logging.getLogger(f"{__name__}.rays_walk"))
    return out


# -- the autoscaler's status -----------------------------------------------------------------------
def test_autoscaling_status_key_is_rays_constant_with_or_without_its_private_api(monkeypatch):
    from ray._private.ray_constants import DEBUG_AUTOSCALING_STATUS

    assert ray_internal.autoscaling_status_key() == DEBUG_AUTOSCALING_STATUS
    block_private_ray(monkeypatch)
    assert ray_internal.autoscaling_status_key() == DEBUG_AUTOSCALING_STATUS == ray_internal.AUTOSCALING_STATUS_KEY


def test_autoscaling_status_reads_the_autoscalers_key_and_is_empty_when_unpublished(monkeypatch):
    import ray.experimental.internal_kv as kv

    store = {ray_internal.autoscaling_status_key(): json.dumps({"autoscaler_report": {"pending_nodes": [1]}})}
    monkeypatch.setattr(kv, "_internal_kv_get", lambda key: store.get(key))
    assert ray_internal.autoscaling_status() == {"autoscaler_report": {"pending_nodes": [1]}}
    store.clear()
    assert ray_internal.autoscaling_status() == {}


# -- upload defaults --------------------------------------------------------------------------------
@pytest.mark.parametrize("override", [None, "", "data, .cache ,,"])
def test_upload_default_excludes_match_rays_with_or_without_its_private_api(monkeypatch, override):
    from ray._private.ray_constants import get_runtime_env_default_excludes

    if override is None:
        monkeypatch.delenv(ray_internal.OVERRIDE_EXCLUDES_ENV, raising=False)
    else:
        monkeypatch.setenv(ray_internal.OVERRIDE_EXCLUDES_ENV, override)
    want = get_runtime_env_default_excludes()
    assert ray_internal.upload_default_excludes() == want
    block_private_ray(monkeypatch)
    assert ray_internal.upload_default_excludes() == want


@pytest.mark.parametrize("value", [None, "0", "1"])
def test_upload_reads_gitignore_unless_told_not_to(monkeypatch, value):
    from ray._private.ray_constants import RAY_RUNTIME_ENV_IGNORE_GITIGNORE

    assert RAY_RUNTIME_ENV_IGNORE_GITIGNORE == ray_internal.IGNORE_GITIGNORE_ENV
    if value is None:
        monkeypatch.delenv(ray_internal.IGNORE_GITIGNORE_ENV, raising=False)
    else:
        monkeypatch.setenv(ray_internal.IGNORE_GITIGNORE_ENV, value)
    want = value != "1"
    assert ray_internal.upload_reads_gitignore() is want
    block_private_ray(monkeypatch)
    assert ray_internal.upload_reads_gitignore() is want


# -- the upload walk --------------------------------------------------------------------------------
PATTERNS = [
    "*.log", "!keep.log", "build/", "/top_only.txt", "# comment", "", "   ", "/", "!/", "\\#hash", "\\!bang", "!!x",
    "**", "**/", "a/**", "a/**/b", "**/deep", "dir/sub", "dir/sub/", "*", "*/", "a/*/c", "?x", "data[0-9].csv",
    "[!ab]c", "[]x]", "[^a]", "[ab", "x\\*y", "trailing\\", ".*", "a**b", "**/x/**", "!/anchored/",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_gitignore_patterns_compile_to_the_regex_ray_uses(pattern):
    from ray._private.thirdparty.pathspec.patterns.gitwildmatch import GitWildMatchPattern

    regex, include = GitWildMatchPattern.pattern_to_regex(pattern)
    got = ray_internal._gitignore_regex(pattern)
    assert (got if got is not None else (None, None)) == (regex, include)


@pytest.mark.parametrize("pattern", ["!", "\\", "!\\"])
def test_a_pattern_left_empty_by_its_prefix_matches_nothing(pattern):
    # Ray's own translation raises IndexError on these; the fallback ignores them.
    regex, _ = ray_internal._gitignore_regex(pattern)
    assert regex == "^$"


@pytest.mark.parametrize("ignore_gitignore", ["0", "1"])
def test_walk_upload_visits_what_rays_walk_visits_with_or_without_its_private_api(
        monkeypatch, working_dir, ignore_gitignore):
    monkeypatch.setenv(ray_internal.IGNORE_GITIGNORE_ENV, ignore_gitignore)
    excludes = ["extra/", "*.bin"]
    want = rays_walk(working_dir, excludes, include_gitignore=ignore_gitignore == "0")
    assert walked(working_dir, excludes) == want
    block_private_ray(monkeypatch)
    assert walked(working_dir, excludes) == want
    if ignore_gitignore == "0":  # the rules did apply: spot-check a few of them
        assert {"a.py", "keep.log", "dataX.csv", "sub/top_only.txt", "sub/a.tmp", "empty"} <= set(want)
        assert not {"b.log", "data1.csv", "build/out.bin", "top_only.txt", "secret/key", "sub/x.tmp",
                    "sub/deep/w", "sub/a/deep/z", "notes/a/b/draft", "notes/draft", ".git/HEAD",
                    "pkg/__pycache__/b.pyc", "model.bin", "extra/e.txt", "#hash.txt"} & set(want)


def test_upload_size_without_private_api_equals_upload_size_with_it(monkeypatch, working_dir):
    with_private = upload_size(working_dir, ["extra/"])
    block_private_ray(monkeypatch)
    assert upload_size(working_dir, ["extra/"]) == with_private


def test_only_ray_internal_reads_rays_private_modules():
    package = Path(ray_internal.__file__).resolve().parents[1]
    offenders = [str(p.relative_to(package)) for p in package.rglob("*.py")
                 if p.name != "ray_internal.py" and "._private" in p.read_text()]
    assert offenders == []


def test_rays_cluster_config_check_is_found_and_its_absence_is_tolerated(monkeypatch):
    check = ray_internal.cluster_config_check()
    assert callable(check)
    monkeypatch.setitem(sys.modules, "ray.autoscaler._private.util", None)
    assert ray_internal.cluster_config_check() is None
