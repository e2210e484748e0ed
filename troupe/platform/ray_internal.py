"""The one module that reads Ray's private API (``ray._private`` and underscored functions).

Ray may rename or move any of these in a minor release. Each function here uses Ray's own
name while it exists and otherwise falls back to the value documented for Ray 2.60 or to a
plain reimplementation of what Ray does, so a Ray upgrade costs at most a stale hint, never
an import error. ``tests/platform/test_ray_internal.py`` checks that both paths agree.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

# ray._private.ray_constants in Ray 2.60.
AUTOSCALING_STATUS_KEY = "__autoscaling_status"  # internal-KV key of the autoscaler's status (`ray status`)
IGNORE_GITIGNORE_ENV = "RAY_RUNTIME_ENV_IGNORE_GITIGNORE"  # "1": uploads do not read .gitignore
OVERRIDE_EXCLUDES_ENV = "RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES"  # comma-separated, replaces the default
DEFAULT_EXCLUDES = ".git,.venv,venv,__pycache__"  # what a working_dir upload always leaves out

# Ray's fake multi-node provider, which the one-machine autoscaling harness starts (`cluster/local.py`).
FAKE_MULTINODE_PROVIDER = "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider"

PathMatcher = Callable[[Path], bool]

_walk_logger = logging.getLogger(f"{__name__}.walk")  # Ray's walk logs every ignore file at INFO


# -- the autoscaler's status ---------------------------------------------------------------------
def autoscaling_status_key() -> str:
    """The internal-KV key under which the autoscaler publishes its status."""
    try:
        from ray._private.ray_constants import DEBUG_AUTOSCALING_STATUS
    except ImportError:
        return AUTOSCALING_STATUS_KEY
    return DEBUG_AUTOSCALING_STATUS


def autoscaling_status() -> dict[str, Any]:
    """The autoscaler's last published status (what ``ray status`` reads); ``{}`` when none is
    published, e.g. on a fixed-size cluster. Needs a connected driver."""
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(autoscaling_status_key())
    return json.loads(raw) if raw else {}


# -- what a working_dir upload sends ---------------------------------------------------------------
def upload_default_excludes() -> list[str]:
    """The patterns every working_dir upload leaves out (``.git``, ``.venv``, ...), or those of
    ``RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES`` when it is set."""
    try:
        from ray._private.ray_constants import get_runtime_env_default_excludes
    except ImportError:
        value = os.environ.get(OVERRIDE_EXCLUDES_ENV, DEFAULT_EXCLUDES)
        return [x.strip() for x in value.split(",") if x.strip()]
    return get_runtime_env_default_excludes()


def upload_reads_gitignore() -> bool:
    """Whether uploads honour ``.gitignore`` files (unless ``RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1``)."""
    try:
        from ray._private.ray_constants import RAY_RUNTIME_ENV_IGNORE_GITIGNORE as name
    except ImportError:
        name = IGNORE_GITIGNORE_ENV
    return os.environ.get(name, "0") != "1"


def walk_upload(root: Path, excludes: Sequence[str], visit: Callable[[Path], None]) -> None:
    """Call ``visit`` on each path that a job's working_dir upload of ``root`` walks: ``root``
    first, then depth first, skipping what the default excludes, ``excludes`` (gitignore-style
    patterns relative to ``root``), each directory's ``.gitignore`` (see `upload_reads_gitignore`)
    and ``.rayignore`` leave out. A skipped directory is not entered. Ray zips the files and the
    empty directories among the visited paths."""
    root = Path(root)
    patterns = upload_default_excludes() + list(excludes)
    include_gitignore = upload_reads_gitignore()
    try:
        from ray._private.runtime_env.packaging import _dir_travel, _get_excludes
    except ImportError:
        _walk(root, [_matcher(root, patterns)], visit, include_gitignore)
        return
    _dir_travel(root, [_get_excludes(root, patterns)], visit, include_gitignore=include_gitignore,
                logger=_walk_logger)


# -- the fallback walk: Ray's traversal and its gitignore ("gitwildmatch") patterns ---------------
def _walk(path: Path, excludes: list[PathMatcher], visit: Callable[[Path], None], include_gitignore: bool) -> None:
    # A directory's ignore files apply to it and below, so they are pushed on entry, popped on exit.
    own = _ignore_file_matchers(path, include_gitignore)
    excludes.extend(own)
    if not any(excluded(path) for excluded in excludes):
        visit(path)
        if path.is_dir():
            for sub in path.iterdir():
                _walk(sub, excludes, visit, include_gitignore)
    del excludes[len(excludes) - len(own):]


def _ignore_file_matchers(directory: Path, include_gitignore: bool) -> list[PathMatcher]:
    names = [".gitignore", ".rayignore"] if include_gitignore else [".rayignore"]
    out = []
    for name in names:
        file = directory.absolute() / name
        if file.is_file():
            with file.open() as f:
                out.append(_matcher(directory, f.readlines()))
    return out


def _matcher(base: Path, lines: Iterable[str]) -> PathMatcher:
    """Whether a path, taken relative to ``base``, is matched by the gitignore ``lines`` (the
    last pattern that matches decides; a ``!`` pattern un-matches)."""
    base = base.absolute()
    rules = [(re.compile(rule[0]), rule[1]) for rule in map(_gitignore_regex, lines) if rule is not None]

    def match(path: Path) -> bool:
        rel = path.absolute().relative_to(base).as_posix()
        matched = False
        for regex, positive in rules:
            if regex.match(rel):
                matched = positive
        return matched

    return match


def _gitignore_regex(line: str) -> tuple[str, bool] | None:
    """One gitignore line as (regex over a '/'-separated relative path, positive); ``None`` for
    blank lines, comments and a lone ``/``. ``positive`` is False for a ``!`` pattern."""
    pattern = line.strip()
    if not pattern or pattern.startswith("#") or pattern == "/":
        return None
    positive = not pattern.startswith("!")
    if not positive:
        pattern = pattern[1:]
    if pattern.startswith("\\"):  # an escaped leading '#' or '!'
        pattern = pattern[1:]
    segs = pattern.split("/")
    if not segs[0]:  # "/x": anchored at the base
        del segs[0]
    elif len(segs) == 1 or (len(segs) == 2 and not segs[1]):  # "x" or "x/": at any depth
        if segs[0] != "**":
            segs.insert(0, "**")
    if len(segs) > 1 and not segs[-1]:  # "x/": everything below x
        segs[-1] = "**"

    out, need_slash, last = ["^"], False, len(segs) - 1
    for i, seg in enumerate(segs):
        if seg == "**":
            if i == 0 and i == last:
                out.append(".+")
            elif i == 0:
                out.append("(?:.+/)?")
                need_slash = False
            elif i == last:
                out.append("/.*")
            else:
                out.append("(?:/.+)?")
                need_slash = True
            continue
        if need_slash:
            out.append("/")
        out.append("[^/]+" if seg == "*" else _glob_segment(seg))
        if seg != "*" and i == last and positive:  # "x" also matches everything below a directory x
            out.append("(?:/.*)?")
        need_slash = True
    out.append("$")
    return "".join(out), positive


def _glob_segment(seg: str) -> str:
    """A path segment's glob as a regex: ``*`` and ``?`` never cross '/', ``[...]`` is a class
    (``[!...]`` negated), a backslash escapes the next character."""
    out, i, n = [], 0, len(seg)
    while i < n:
        ch = seg[i]
        i += 1
        if ch == "\\":
            if i < n:
                out.append(re.escape(seg[i]))
                i += 1
        elif ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            j = i
            if j < n and seg[j] == "!":
                j += 1
            if j < n and seg[j] == "]":  # a ']' first is a member, not the end
                j += 1
            while j < n and seg[j] != "]":
                j += 1
            if j >= n:  # no closing bracket: a literal '['
                out.append("\\[")
                continue
            head = "["
            if seg[i] == "!":
                head, i = "[^", i + 1
            elif seg[i] == "^":
                head, i = "[\\^", i + 1
            out.append(head + seg[i:j + 1].replace("\\", "\\\\"))
            i = j + 1
        else:
            out.append(re.escape(ch))
    return "".join(out)


# -- cluster configs ------------------------------------------------------------------------------
def cluster_config_check() -> Callable[[dict[str, Any]], Any] | None:
    """Ray's own check of a `ray up` cluster config (fill in defaults, then validate), or None
    when this Ray has no such function; the offline JSON-schema check stands without it."""
    try:
        from ray.autoscaler._private.util import prepare_config, validate_config
    except ImportError:
        return None
    return lambda config: validate_config(prepare_config(config))
