"""Fused roles: several single-actor roles of a graph hosted by one Ray actor process.

On one CPU node a role's actor costs more to start than most smoke-scale steps take: each
process imports torch and transformers again (about 4 s of a 2-core machine's time per actor).
`ActorGraph` can therefore host the roles that need nothing a process of their own gives (one
rank, no GPU, no concurrency; `Role.can_fuse`) in one `FusedHost` per `Role.fuse_group`, as
colocated workers elsewhere share one process, and hand out `FusedHandle` proxies with the calls
of an actor handle: ``handle.method.remote(*args, **kwargs)`` returns an ``ObjectRef``. A group
is the roles that work one after another (one policy's engine and learner); the arms of a
comparison, which step side by side, are groups apart, or one process would put all their work
on one core.

What a separate actor guarantees, a fused role keeps:
- calls from one process to one role run one at a time, in the order they were submitted,
  also when an earlier call waits for an argument (each call carries a sequence number per
  calling process and role; the host runs them in that order);
- top-level ``ObjectRef`` arguments arrive resolved, nested ones as refs;
- different roles run concurrently (one thread each), so a role may call another and wait.
- a role whose class sets ``uses_global_rng = True`` (it draws from torch's, numpy's or
  Python's global random state, e.g. dropout in a learner) keeps a stream of its own: its calls
  run one role at a time with its saved state swapped in, so its draws do not depend on how
  the other roles' calls interleave, and a resumed run draws what an uninterrupted one did.
What it gives up: the roles share one process (its torch threads), and they live and die
together: a fused role is never restarted on its own, so fault tolerance per role needs
``run.fuse_roles=false``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

# One id per process: the calls of one process to one role form one ordered stream, as the
# tasks of one submitter do for a Ray actor.
_PROCESS = uuid.uuid4().hex
_sequence_lock = threading.Lock()
_sequences: dict[tuple[str, str], itertools.count] = {}


class FusedRoleError(RuntimeError):
    """A fused role's constructor failed (the message names the role)."""


class FusedHandle:
    """A handle to one role inside a `FusedHost`, called as an actor handle is."""

    def __init__(self, host: Any, host_key: str, role: str) -> None:
        self._host, self._host_key, self._role = host, host_key, role

    def __getattr__(self, method: str) -> _FusedMethod:
        if method.startswith("_") and method != "__ray_ready__":
            raise AttributeError(method)
        return _FusedMethod(self, method)

    def __reduce__(self) -> tuple:
        return FusedHandle, (self._host, self._host_key, self._role)

    def __repr__(self) -> str:
        return f"FusedHandle({self._role!r} in {self._host!r})"


class _FusedMethod:
    def __init__(self, handle: FusedHandle, method: str) -> None:
        self._handle, self._method = handle, method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        h = self._handle
        if self._method == "__ray_ready__":
            return h._host.ready.remote(h._role)
        # Numbered and submitted under one lock: the numbers follow the order of submission.
        with _sequence_lock:
            seq = next(_sequences.setdefault((h._host_key, h._role), itertools.count()))
            # Arguments travel inside a list, so Ray does not wait for them before the call
            # arrives: the host resolves them in the role's order (Ray would let a later call
            # that is ready overtake one still waiting for its argument).
            try:
                return h._host.call.remote(h._role, self._method, _PROCESS, seq, list(args), kwargs)
            except BaseException:
                # The number is spent (e.g. an argument that does not serialize): pass it on,
                # or every later call of this stream would wait for it.
                h._host.call.remote(h._role, None, _PROCESS, seq, [], {})
                raise


def is_fused(handle: Any) -> bool:
    return isinstance(handle, FusedHandle)


def _global_rng() -> tuple:
    import random

    import numpy as np
    import torch

    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def _set_global_rng(state: tuple) -> None:
    import random

    import numpy as np
    import torch

    torch.set_rng_state(state[0])
    np.random.set_state(state[1])
    random.setstate(state[2])


class FusedHost:
    """The process of several roles. ``specs``: (role name, class, constructor kwargs) each,
    constructed in order."""

    def __init__(self, specs: list[tuple[str, type, dict[str, Any]]]) -> None:
        self._roles: dict[str, Any] = {}
        self._rng: dict[str, tuple] = {}  # the saved global random state of each role that uses it
        self._rng_lock = threading.Lock()
        for name, cls, kwargs in specs:
            try:
                self._roles[name] = cls(**kwargs)
                if getattr(cls, "uses_global_rng", False):
                    self._rng[name] = _global_rng()  # as its constructor seeded it
            except Exception as e:
                raise FusedRoleError(f"role {name!r} (fused with {', '.join(n for n, _, _ in specs)}): "
                                     f"{type(e).__name__}: {e}") from e
        # One thread per role: a role's calls run one at a time, roles side by side.
        self._threads = {name: ThreadPoolExecutor(1, thread_name_prefix=f"role-{name}") for name in self._roles}
        self._expected: dict[tuple[str, str], int] = {}
        self._waiting: dict[tuple[str, str, int], asyncio.Future] = {}
        self._queues: dict[str, asyncio.Queue] = {}

    async def ready(self, role: str) -> bool:
        return role in self._roles

    async def call(self, role: str, method: str | None, process: str, seq: int, args: list, kwargs: dict) -> Any:
        if role not in self._roles:
            raise KeyError(f"no role {role!r} in this process; roles: {', '.join(self._roles)}")
        loop = asyncio.get_running_loop()
        key = (process, role)
        if self._expected.get(key, 0) != seq:  # an earlier call of this stream has not arrived yet
            turn = loop.create_future()
            self._waiting[(process, role, seq)] = turn
            await turn
        done = loop.create_future()
        if method is None:
            done.set_result(None)
        else:
            self._queue(role).put_nowait((method, args, kwargs, done))
        self._expected[key] = seq + 1
        following = self._waiting.pop((process, role, seq + 1), None)
        if following is not None:
            following.set_result(None)
        return await done

    def _queue(self, role: str) -> asyncio.Queue:
        if role not in self._queues:
            self._queues[role] = asyncio.Queue()
            asyncio.get_running_loop().create_task(self._serve(role))
        return self._queues[role]

    async def _serve(self, role: str) -> None:
        """Run ``role``'s calls one after another, each once its arguments are ready."""
        import ray

        loop = asyncio.get_running_loop()
        obj, queue = self._roles[role], self._queues[role]
        while True:
            method, args, kwargs, done = await queue.get()
            try:
                args = [await a if isinstance(a, ray.ObjectRef) else a for a in args]
                kwargs = {k: (await v if isinstance(v, ray.ObjectRef) else v) for k, v in kwargs.items()}
                fn = getattr(obj, method)
                if inspect.iscoroutinefunction(fn):
                    result = await fn(*args, **kwargs)
                else:
                    call = functools.partial(fn, *args, **kwargs)
                    if role in self._rng:
                        call = functools.partial(self._own_rng, role, call)
                    result = await loop.run_in_executor(self._threads[role], call)
                done.set_result(result)
            except Exception as e:  # the caller's ray.get raises it, as from a separate actor
                done.set_exception(e)

    def _own_rng(self, role: str, call: functools.partial) -> Any:
        with self._rng_lock:
            _set_global_rng(self._rng[role])
            try:
                return call()
            finally:
                self._rng[role] = _global_rng()
