"""Registries: algorithms, policy losses, advantage estimators, rewards and environments.

A new component is added by registering it, never by editing a trainer::

    from troupe.platform.registry import ADVANTAGES

    @ADVANTAGES.register("my_adv")
    def my_adv(rewards, group_ids): ...

A name of the form ``"package.module:attr"`` resolves by import, so a user's own function
works without registering it first.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from troupe.platform.errors import RegistryError

T = TypeVar("T")


class Registry(Generic[T]):
    """A named table of components of one kind."""

    def __init__(self, kind: str, loader: str | None = None) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._lazy: dict[str, str] = {}  # name -> "module:attr", imported on first get
        # Module that registers the built-in entries; imported on first lookup so that
        # `platform` never imports `algorithms` or `actors` at import time.
        self._loader = loader
        self._loaded = loader is None

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
        if not self._loaded:
            self._loaded = True
            importlib.import_module(self._loader)

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
        known = ", ".join(self.names()) or "(none)"
        raise RegistryError(
            f"unknown {self.kind} {name!r}; registered: {known}. "
            f"Register a new one with @{self.kind.upper()}.register(...) or pass 'module:attr'."
        )

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


ALGORITHMS: Registry[Any] = Registry("algorithm", loader="troupe.algorithms")
POLICY_LOSSES: Registry[Callable[..., Any]] = Registry("policy_loss", loader="troupe.actors.losses")
ADVANTAGES: Registry[Callable[..., Any]] = Registry("advantage", loader="troupe.algorithms.advantages")
REWARDS: Registry[Callable[..., Any]] = Registry("reward", loader="troupe.envs")
ENVIRONMENTS: Registry[Any] = Registry("environment", loader="troupe.envs")
