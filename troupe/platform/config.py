"""Typed configs: dataclasses hold every default, YAML presets and dotted overrides change them.

An unknown key, a wrong type or a bad value raises `ConfigError` naming the dotted key and
what is allowed. The resolved config is a plain dict that round-trips through YAML.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import yaml

from troupe.platform.errors import ConfigError
from troupe.platform.registry import TRACKERS

C = TypeVar("C")


def registered(default: str | list[str], registry: Any) -> Any:
    """A config field that names an entry of ``registry`` (or a ``"module:attr"`` path), or a
    list of them: checked by `check_registered` in the driver, before any actor starts."""
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata={"registry": registry})
    return dataclasses.field(default=default, metadata={"registry": registry})


@dataclasses.dataclass
class RunConfig:
    """Settings every algorithm shares: how long, how often, where, on what cluster."""

    steps: int = 100
    seed: int = 0
    eval_every: int = 10  # 0 disables periodic evaluation (a final one still runs)
    checkpoint_every: int = 50  # 0 keeps only the final checkpoint
    # Where run directories go: a path (a shared mount works as it is) or a storage URI
    # (s3://bucket/runs, gs://..., hdfs://..., file:///mnt/shared/runs) that the run mirrors its
    # local copy to (troupe.platform.storage). A Ray job's own working directory is temporary.
    out: str = "runs"
    sync_every_s: float = 60.0  # a URI run pushes changed files at least this often (and at checkpoints)
    address: str | None = None  # Ray address; None starts a private local cluster
    num_cpus: int | None = None  # CPUs of that local cluster; None lets Ray count them
    placement_timeout_s: float = 300.0
    call_timeout_s: float = 900.0
    # Asynchronous RL: the engines generate up to this many steps ahead of the learner, with the
    # newest weights they hold, while it updates (troupe.algorithms.lookahead). 0: every step
    # generates with the weights of the update before it.
    staleness: int = 0
    # Node type -> resources one node of it offers, as in a cluster YAML's available_node_types
    # (e.g. {gpu_worker: {CPU: 8, GPU: 1}}): a bundle that fits none of them, nor a node alive
    # now, is an error before anything is placed. {} skips the check (the cluster's shapes are unknown).
    node_types: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    # Ask the autoscaler for every bundle up front (ray.autoscaler.sdk.request_resources), so it
    # launches all nodes at once; the request is cleared when the run's actors are torn down.
    request_resources: bool = False
    # Host the roles that need no process of their own (one rank, no GPU) in one actor process
    # per group (troupe.platform.fused; one policy's roles, each arm of a comparison apart):
    # it starts them several times faster. They then live and die
    # together, so none is restarted on its own. None: only on a one-node cluster without GPUs
    # that cannot grow; false for per-role restarts there.
    fuse_roles: bool | None = None
    progress: bool = True
    # Experiment trackers that get every metrics.jsonl row and the config: tensorboard, wandb,
    # mlflow (extras: pip install 'troupe[wandb]'), or "module:Class" (troupe.platform.trackers).
    trackers: list[str] = registered(["tensorboard"], TRACKERS)

    def __post_init__(self) -> None:
        check(self.steps >= 0, "run.steps", self.steps, "an integer >= 0")
        check(self.eval_every >= 0, "run.eval_every", self.eval_every, "an integer >= 0")
        check(self.checkpoint_every >= 0, "run.checkpoint_every", self.checkpoint_every, "an integer >= 0")
        check(self.placement_timeout_s > 0, "run.placement_timeout_s", self.placement_timeout_s, "> 0")
        check(self.call_timeout_s > 0, "run.call_timeout_s", self.call_timeout_s, "> 0")
        check(isinstance(self.staleness, int) and not isinstance(self.staleness, bool) and self.staleness >= 0,
              "run.staleness", self.staleness, "an integer >= 0 (0: each step generates after the update "
              "before it; k: the engines generate at most k steps ahead of the learner)")
        check(len(set(self.trackers)) == len(self.trackers), "run.trackers", self.trackers, "each tracker once")
        check(self.sync_every_s >= 0, "run.sync_every_s", self.sync_every_s, ">= 0")
        from troupe.platform.storage import check_location

        check_location(self.out, "run.out")


def check_registered(cfg: Any, prefix: str = "") -> None:
    """Resolve every `registered` field of ``cfg`` and its sections, then run each section's
    ``validate()`` (checks that need the resolved entries): an unknown name, or a path that
    does not import, is one `ConfigError` naming the key, the value and the registered names."""
    from troupe.platform.errors import RegistryError

    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        key = prefix + f.name
        registry = f.metadata.get("registry")
        if registry is not None and value is not None:
            for name in value if isinstance(value, list | tuple) else [value]:
                try:
                    registry.resolve(name, key)
                except RegistryError as e:
                    raise ConfigError(str(e)) from None
        elif dataclasses.is_dataclass(value):
            check_registered(value, key + ".")
    validate = getattr(cfg, "validate", None)
    if callable(validate):
        validate()


def check(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise a `ConfigError` naming ``key`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"config key {key!r} = {value!r} is not allowed: expected {allowed}")


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if tp is type(None):
        return "null"  # as YAML and the command line spell None
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and convert where it is lossless."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"config key {key!r} = {value!r}: expected {' or '.join(_type_name(a) for a in args)}")
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"config key {key!r} = {value!r}: expected {_type_name(tp)}")
        return value
    if dataclasses.is_dataclass(tp):
        if dataclasses.is_dataclass(value):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key!r} is a section: expected a mapping, got {value!r}")
        return from_dict(tp, value, prefix=key + ".")
    if origin in (list, tuple):
        if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
            raise ConfigError(f"config key {key!r} = {value!r}: expected a list")
        (item_tp, *_rest) = get_args(tp) or (Any,)
        items = [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key!r} = {value!r}: expected a mapping")
        _, vt = get_args(tp) or (Any, Any)
        return {k: _coerce(v, vt, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key {key!r} = {value!r}: expected true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"config key {key!r} = {value!r}: expected an integer")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"config key {key!r} = {value!r}: expected a number")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"config key {key!r} = {value!r}: expected a string")
    return value


def from_dict(cls: type[C], data: dict[str, Any], prefix: str = "") -> C:
    """Build the dataclass ``cls`` from a (partial) mapping, checking every key and type."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        allowed = ", ".join(prefix + k for k in fields)
        raise ConfigError(f"unknown config key {prefix + unknown[0]!r}; allowed keys here: {allowed}")
    kwargs = {}
    for k, v in data.items():
        f, tp = fields[k], hints[k]
        if isinstance(v, dict) and "select" in f.metadata:
            tp, v = _selected_section(f, v, prefix + k)
        elif isinstance(v, dict) and dataclasses.is_dataclass(tp) and f.default_factory is not dataclasses.MISSING:
            # A partial section overrides the parent's own default for it, not the section class's.
            default = f.default_factory()
            v = merge(_without_renamed(default, to_dict(default), v), v)
        kwargs[k] = _coerce(v, tp, prefix + k)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config section {prefix.rstrip('.') or cls.__name__!r}: {e}") from e


def _without_renamed(default: Any, base: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """``base`` (the dict of the section ``default``) less every `selected` subsection, at any depth,
    whose name ``data`` changes: a section of another class keeps none of the default's keys."""
    for f in dataclasses.fields(default):
        sub, value = data.get(f.name), getattr(default, f.name, None)
        if not isinstance(sub, dict) or not dataclasses.is_dataclass(value) or not isinstance(base.get(f.name), dict):
            continue
        if "select" in f.metadata and sub.get(f.metadata["select"][1], getattr(value, f.metadata["select"][1])) \
                != getattr(value, f.metadata["select"][1]):
            base.pop(f.name)
        else:
            _without_renamed(value, base[f.name], sub)
    return base


def selected(registry: Any, default: Any, key: str = "name") -> Any:
    """A config section whose dataclass is picked by its ``key`` field: ``registry.get(value).Config``,
    for a registered name or a ``"module:attr"`` path. ``default`` makes the default section.

    The default section's other keys carry over only while ``key`` keeps its value: with
    ``task.name=jsonl`` the section is the jsonl task's own, and a key of another task is unknown.
    """
    return dataclasses.field(default_factory=default, metadata={"select": (registry, key)})


def _selected_section(f: dataclasses.Field, data: dict[str, Any], key: str) -> tuple[type, dict[str, Any]]:
    """The dataclass of the `selected` section ``data`` and the values to build it from."""
    from troupe.platform.errors import RegistryError

    registry, name_key = f.metadata["select"]
    default = f.default_factory()
    name = data.get(name_key, getattr(default, name_key))
    where = f"{key}.{name_key}"
    if not isinstance(name, str):
        raise ConfigError(f"config key {where!r} = {name!r}: expected a registered name or 'module:attr'")
    if name == getattr(default, name_key):
        return type(default), merge(to_dict(default), data)
    try:
        obj = registry.resolve(name, where)
    except RegistryError as e:
        raise ConfigError(str(e)) from None
    section = getattr(obj, "Config", None)
    if not (isinstance(section, type) and dataclasses.is_dataclass(section)
            and name_key in {g.name for g in dataclasses.fields(section)}):
        raise ConfigError(f"config key {where!r} = {name!r} names {obj!r}, which has no dataclass `Config` "
                          f"with a {name_key!r} field to read the section {key!r} with")
    return section, {**data, name_key: name}


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain Python values (lists, dicts, scalars) ready for YAML or JSON."""
    return _plain(dataclasses.asdict(cfg))


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``update`` into a copy of ``base`` (sections merge, scalars replace)."""
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def parse_override(text: str) -> dict[str, Any]:
    """``"learner.lr=1e-4"`` → ``{"learner": {"lr": 1e-4}}``; the value is read as YAML."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} must look like 'section.key=value'")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {text!r}: the value is not valid YAML: {e}") from e
    out: dict[str, Any] = {}
    node = out
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level")
    return data


def resolve(
    cls: type[C],
    presets_dir: Path | None,
    preset: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    base: dict[str, Any] | None = None,
) -> C:
    """Defaults of ``cls`` ← preset YAML (or ``base``) ← dotted overrides, checked."""
    data: dict[str, Any] = dict(base or {})
    if preset and preset != "default":
        path = presets_dir / f"{preset}.yaml" if presets_dir else None
        if path is None or not path.is_file():
            known = list_presets(presets_dir)
            raise ConfigError(f"unknown preset {preset!r}; available: {', '.join(known)}")
        data = merge(data, load_yaml(path))
    elif presets_dir is not None and (presets_dir / "default.yaml").is_file():
        data = merge(data, load_yaml(presets_dir / "default.yaml"))
    for text in overrides:
        data = merge(data, parse_override(text))
    cfg = from_dict(cls, data)
    check_registered(cfg)
    return cfg


def list_presets(presets_dir: Path | None) -> list[str]:
    names = {"default"}
    if presets_dir is not None and presets_dir.is_dir():
        names |= {p.stem for p in presets_dir.glob("*.yaml")}
    return sorted(names)


def save_yaml(data: dict[str, Any], path: Path) -> None:
    from troupe.platform.checkpoint import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(data, sort_keys=False))
