"""Registries: algorithms, losses, advantages, rewards, tasks, rollout backends, transports, trackers.

Every registry is filled from a group of package entry points, the Python convention for
plugins: troupe's own components are declared in its ``pyproject.toml``, and a package a user
installs adds its own the same way, without touching troupe::

    [project.entry-points."troupe.losses"]
    my_loss = "mypkg.losses:my_loss"

An entry is imported only when it is asked for. In a session, ``@POLICY_LOSSES.register(...)``
adds one directly, and a name of the form ``"package.module:attr"`` resolves by import, so a
user's own function works from the command line without registering it first.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any, Generic, TypeVar

from troupe.platform.errors import RegistryError

_LOADING = threading.RLock()

T = TypeVar("T")


class Registry(Generic[T]):
    """A named table of components of one kind, filled from the entry-point ``group``."""

    def __init__(self, kind: str, group: str | None = None, variable: str | None = None) -> None:
        self.kind = kind
        self.group = group
        self.variable = variable or kind.upper()  # the name users import, for error messages
        self._items: dict[str, T] = {}
        self._lazy: dict[str, str] = {}  # name -> "module:attr", imported on first get
        self._loaded = group is None

    def register(self, name: str, obj: T | None = None) -> Any:
        """Register ``obj`` under ``name``; without ``obj``, return a decorator."""

        def _add(o: T) -> T:
            if name in self._items and self._items[name] is not o:
                raise RegistryError(f"{self.kind} {name!r} is already registered; pick another name")
            self._items[name] = o
            return o

        return _add if obj is None else _add(obj)

    def register_lazy(self, name: str, path: str) -> None:
        """Register ``name`` as ``"module:attr"`` without importing it until it is asked for."""
        self._lazy[name] = path

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        # Roles sharing one process (troupe.platform.fused) look names up from several threads:
        # one reads the table only once it is whole.
        with _LOADING:
            if self._loaded:
                return
            for ep in metadata.entry_points(group=self.group):
                self._lazy.setdefault(ep.name, ep.value)
            self._loaded = True

    def get(self, name: str) -> T:
        self._ensure_loaded()
        if name in self._items:
            return self._items[name]
        if name in self._lazy:
            obj = resolve_import_path(self._lazy[name], what=self.kind)
            self._items.setdefault(name, obj)
            return self._items[name]
        if ":" in name:
            return resolve_import_path(name, what=self.kind)
        raise RegistryError(self.unknown(name))

    def unknown(self, name: str, key: str | None = None) -> str:
        """The message for a name that is neither registered nor an import path."""
        known = ", ".join(self.names())
        if not known and self.group:
            known = f"(none: is troupe installed? `pip install -e .` declares the entry points of {self.group!r})"
        where = f"{key}={name!r}: " if key else ""
        declare = f", declare it in the entry-point group {self.group!r}" if self.group else ""
        return (f"{where}unknown {self.kind} {name!r}; registered: {known or '(none)'} (in {self.variable}). "
                f"Register a new one with @{self.variable}.register(...){declare}, or pass 'package.module:attr'.")

    def resolve(self, name: str, key: str) -> T:
        """`get`, with an error that names the config ``key`` holding ``name``."""
        try:
            return self.get(name)
        except RegistryError as e:
            msg = str(e)
            if ":" in name:  # an import path that failed: say what is registered too
                msg = f"{msg.rstrip('.')}; registered: {', '.join(self.names()) or '(none)'} (in {self.variable})."
            raise RegistryError(msg if msg.startswith(f"{key}=") else f"{key}={name!r}: {msg}") from e

    def names(self) -> list[str]:
        self._ensure_loaded()
        return sorted({*self._items, *self._lazy})

    def __contains__(self, name: str) -> bool:
        self._ensure_loaded()
        return name in self._items or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def resolve_import_path(path: str, what: str = "object") -> Any:
    """Import ``"package.module:attr"`` and return the attribute, with an error that names the path."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise RegistryError(f"{what} path {path!r} must look like 'package.module:attribute'")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # the user's module may fail in any way; say which path did
        raise RegistryError(f"{what} {path!r}: cannot import module {module_name!r}: {e}") from e
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError as e:
        raise RegistryError(f"{what} {path!r}: module {module_name!r} has no attribute {attr!r}") from e
    return obj


ALGORITHMS: Registry[Any] = Registry("algorithm", "troupe.algorithms", "ALGORITHMS")
POLICY_LOSSES: Registry[Callable[..., Any]] = Registry("policy loss", "troupe.losses", "POLICY_LOSSES")
AGGREGATIONS: Registry[Callable[..., Any]] = Registry("loss aggregation", "troupe.aggregations", "AGGREGATIONS")
DISTILL_LOSSES: Registry[Callable[..., Any]] = Registry("distillation loss", "troupe.distill_losses",
                                                        "DISTILL_LOSSES")
ADVANTAGES: Registry[Callable[..., Any]] = Registry("advantage", "troupe.advantages", "ADVANTAGES")
REWARDS: Registry[Callable[..., Any]] = Registry("reward", "troupe.rewards", "REWARDS")
TASKS: Registry[Any] = Registry("task", "troupe.tasks", "TASKS")
ENVIRONMENTS: Registry[Any] = Registry("environment", "troupe.envs", "ENVIRONMENTS")
ROLLOUT_BACKENDS: Registry[Any] = Registry("rollout backend", "troupe.rollout_backends", "ROLLOUT_BACKENDS")
TRANSPORTS: Registry[Any] = Registry("weight transport", "troupe.transports", "TRANSPORTS")
TRACKERS: Registry[Any] = Registry("tracker", "troupe.trackers", "TRACKERS")
