"""Multi-turn agent episodes: LangGraph graphs whose agent nodes call rollout-engine actors.

The graph is the program: a `langgraph.graph.StateGraph` with agent nodes (`agent_node`),
environment or tool nodes (plain functions of the state), conditional edges and an end. The
actors are where the models live: each agent name maps to an `EngineClient` over one or more
rollout engines (any backend with ``generate_turns``), so two agents may be two models.

`run_episodes` runs many episodes of one graph at once on asyncio. Every agent call of every
live episode that is waiting on the same engines goes out as one batched ``generate_turns``
call, so N episodes cost one forward pass per turn, not N. A call that fails or outlives
``timeout_s`` is re-issued (on the next engine) up to ``retries`` times; after that, or when a
node raises, or when the episode exceeds ``turn_limit`` graph steps, the episode ends as failed
with its reason, and the step goes on. Each episode's `Transcript` per agent is what a policy
loss trains on (`troupe.algorithms.agents.transcript`).

    graph = StateGraph(State)
    graph.add_node("executor", agent_node("executor", prompt_fn, reply_fn))
    graph.add_node("env", env_fn)
    graph.add_edge(START, "executor")
    graph.add_conditional_edges("executor", route, {"env": "env", "end": END})
    ...
    out = run_episodes(graph, [initial_state, ...], {"executor": EngineClient(engines, sampling)}, seed=0)
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from langgraph.types import RunnableConfig

from troupe.algorithms.agents.transcript import Transcript

log = logging.getLogger("troupe")

MessagesFn = Callable[[dict[str, Any]], list[dict[str, str]]]
ReplyFn = Callable[[dict[str, Any], str], dict[str, Any]]


class AgentGraphError(ValueError):
    """An agent graph or its episode settings cannot run; the message names the node or key."""


@dataclasses.dataclass
class Episode:
    """One finished episode: its final state, each agent's transcript, and how it ended."""

    index: int
    state: dict[str, Any]
    transcripts: dict[str, Transcript]  # by thread: an agent's name unless its nodes name threads
    status: str = "done"  # done | failed | turn_limit | timeout
    error: str | None = None
    graph_steps: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "done"


@dataclasses.dataclass
class EpisodeResults:
    episodes: list[Episode]
    engine_calls: int  # batched generate_turns calls, over all agents
    retried: int  # engine calls re-issued after a failure or timeout
    wall_s: float

    @property
    def failed(self) -> list[Episode]:
        return [e for e in self.episodes if e.status == "failed"]

    @property
    def over_turn_limit(self) -> list[Episode]:
        return [e for e in self.episodes if e.status == "turn_limit"]

    @property
    def timed_out(self) -> list[Episode]:
        return [e for e in self.episodes if e.status == "timeout"]

    def transcripts(self, agent: str) -> list[tuple[int, Transcript]]:
        """(episode index, transcript) of every conversation in which ``agent`` took a turn:
        one per episode, or one per thread where its nodes name threads."""
        return [(e.index, t) for e in self.episodes for t in e.transcripts.values()
                if t.agent == agent and t.turns]


# ---------------------------------------------------------------------------------------------
# Engines


class EngineClient:
    """Batched turns for one agent over rollout-engine actors (Ray handles, or plain objects
    with the same ``generate_turns`` method, called in-process)."""

    def __init__(self, engines: Sequence[Any], sampling: Any, timeout_s: float = 300.0, retries: int = 1) -> None:
        if not engines:
            raise AgentGraphError("EngineClient: no engines given")
        self.engines = list(engines)
        self.sampling = sampling
        self.timeout_s = timeout_s
        self.retries = retries
        self.calls = 0
        self.retried = 0
        self._queue: list[tuple[list[int], list[dict[str, str]], asyncio.Future]] = []
        self._tasks: set[asyncio.Task] = set()
        self._seed = 0
        self._scheduler: _Scheduler | None = None

    def reset(self, seed: int, scheduler: _Scheduler) -> None:
        self._seed, self.calls, self.retried = seed, 0, 0
        self._scheduler = scheduler

    async def turn(self, context: list[int], messages: list[dict[str, str]]) -> dict[str, Any]:
        """The agent's next turn after ``context`` + ``messages``: its ids, log-probs and text."""
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((context, messages, fut))
        self._scheduler.waiting_changed(+1)
        return await fut

    def flush(self) -> int:
        """Send what is queued as one call per engine; returns how many requests went."""
        queue, self._queue = self._queue, []
        if queue:
            task = asyncio.ensure_future(self._send(queue))
            self._tasks.add(task)  # held until done: the loop keeps only weak references
            task.add_done_callback(self._tasks.discard)
        return len(queue)

    async def _send(self, queue: list[tuple[list[int], list[dict[str, str]], asyncio.Future]]) -> None:
        n = len(self.engines)
        shards = [queue[i::n] for i in range(n)] if len(queue) >= n else [queue]
        outs = await asyncio.gather(*(self._call(shard, start) for start, shard in enumerate(shards)))
        # Every episode of this call resumes together, so their next turns again make one call
        # per engine (and the same calls on every run), however the engines' answers interleave.
        for shard, out in zip(shards, outs, strict=True):
            for (_, _, fut), result in zip(shard, out, strict=True):
                if fut.done():
                    continue
                if isinstance(result, BaseException):
                    fut.set_exception(result)
                else:
                    fut.set_result(result)

    async def _call(self, shard: list[tuple[list[int], list[dict[str, str]], asyncio.Future]],
                    start: int) -> list[dict[str, Any] | BaseException]:
        contexts = [c for c, _, _ in shard]
        messages = [m for _, m, _ in shard]
        seed = self._seed * 1_000_003 + self.calls
        self.calls += 1
        error: BaseException | None = None
        for attempt in range(self.retries + 1):
            engine = self.engines[(start + attempt) % len(self.engines)]
            try:
                batch = await asyncio.wait_for(_invoke(engine, contexts, messages, self.sampling, seed),
                                               self.timeout_s)
                break
            except Exception as e:  # a dead actor, a timeout, a bad row: re-issued, then the episodes fail
                error = e
                if attempt < self.retries:
                    self.retried += 1
                    log.warning("agent turn failed on engine %d (%s: %s); re-issued", start, type(e).__name__, e)
        else:
            return [EngineCallError(f"{type(error).__name__}: {error}")] * len(shard)
        mask = batch["completion_mask"]
        out: list[dict[str, Any] | BaseException] = []
        for i in range(len(shard)):
            keep = int(mask[i].sum())
            out.append({
                "appended": list(batch["appended_ids"][i]),
                "completion": batch["completion_ids"][i, :keep].tolist(),
                "logprobs": batch["logprobs"][i, :keep].tolist(),
                "text": batch["completion"][i],
                "version": batch.meta.get("version"),
            })
        return out


class _Scheduler:
    """When to send the queued agent turns: once every live episode waits on an engine (so one
    call carries them all, and the same calls happen on every run), or after ``flush_after_s``
    when an episode is busy elsewhere (a slow tool) while others wait."""

    def __init__(self, clients: Sequence[EngineClient], live: int, flush_after_s: float) -> None:
        self.clients, self.live, self.waiting = list(clients), live, 0
        self.flush_after_s = flush_after_s
        self._timer: asyncio.TimerHandle | None = None

    def waiting_changed(self, delta: int) -> None:
        self.waiting += delta
        self._maybe_flush()

    def episode_ended(self) -> None:
        self.live -= 1
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if self.waiting and self.waiting >= self.live:
            self._flush()
        elif self.waiting and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.flush_after_s, self._flush)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for client in self.clients:
            self.waiting -= client.flush()


class EngineCallError(RuntimeError):
    """An agent's engine call failed on every try."""


async def _invoke(engine: Any, contexts: list[list[int]], messages: list[list[dict[str, str]]], sampling: Any,
                  seed: int) -> Any:
    method = engine.generate_turns
    if hasattr(method, "remote"):  # a Ray actor: the ref is awaitable
        return await method.remote(contexts, messages, sampling, seed)
    return await asyncio.to_thread(method, contexts, messages, sampling, seed)


# ---------------------------------------------------------------------------------------------
# Nodes


def agent_node(agent: str, messages: MessagesFn, on_reply: ReplyFn,
               thread: Callable[[dict[str, Any]], str] | None = None) -> Callable[..., Awaitable[dict[str, Any]]]:
    """A graph node in which ``agent`` takes one turn: ``messages(state)`` are the chat turns
    added to the agent's context (its whole first prompt on its first turn), and
    ``on_reply(state, text)`` is the node's state update. ``thread(state)`` names the
    conversation the turn continues (default: one per agent and episode); a new name starts a
    fresh context, as when an agent answers a probe beside its main conversation."""

    async def node(state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        out = await agent_turn(config, agent, messages(state), thread(state) if thread else None)
        return on_reply(state, out["text"])

    node.troupe_agent = agent  # the graph check reads which agent a node calls
    return node


async def agent_turn(config: RunnableConfig, agent: str, turns: list[dict[str, str]],
                     thread: str | None = None) -> dict[str, Any]:
    """One turn of ``agent`` from inside a graph node (for nodes that take several turns, or
    none): ``turns`` are added to the conversation ``thread`` (default: the agent's own), the
    reply is recorded in its transcript and returned (``text``, ``completion`` ids,
    ``logprobs``, ``appended`` ids, ``version``)."""
    run: _EpisodeRun = config["configurable"]["troupe_episode"]
    client = run.clients.get(agent)
    if client is None:
        raise AgentGraphError(f"agent node {agent!r}: no engine for agent {agent!r}; "
                              f"engines are given for {sorted(run.clients)}")
    transcript = run.transcripts.setdefault(thread or agent, Transcript(agent))
    out = await client.turn(transcript.context(), turns)
    transcript.add_turn(out["appended"], out["completion"], out["logprobs"], out["text"], out["version"])
    return out


@dataclasses.dataclass
class _EpisodeRun:
    """What one running episode has so far (kept when it times out)."""

    clients: Mapping[str, EngineClient]
    transcripts: dict[str, Transcript]
    state: dict[str, Any]
    chunks: int = 0

    @property
    def steps(self) -> int:
        return max(self.chunks - 1, 0)


# ---------------------------------------------------------------------------------------------
# Running


def check_graph(graph: Any, clients: Mapping[str, EngineClient], turn_limit: int) -> None:
    """The checks before any episode starts: a turn limit ≥ 1, every agent node's agent has an
    engine (a node that calls `agent_turn` itself declares its agents as ``fn.troupe_agent``,
    a name or a tuple of names), and the end is reachable from the start."""
    from langgraph.graph import END, START

    if not isinstance(turn_limit, int) or turn_limit < 1:
        raise AgentGraphError(f"turn_limit = {turn_limit!r}: an episode needs at least one graph step (≥ 1)")
    for name, spec in graph.nodes.items():
        runnable = spec.runnable  # LangGraph wraps a node's function; an async one is its afunc
        fn = getattr(runnable, "afunc", None) or getattr(runnable, "func", None)
        agents = getattr(fn, "troupe_agent", None)  # a name, or the names a multi-turn node calls
        for agent in (agents,) if isinstance(agents, str) else agents or ():
            if agent not in clients:
                raise AgentGraphError(f"graph node {name!r} calls agent {agent!r}, which has no engine; engines "
                                      f"are given for {sorted(clients)}")
    succ: dict[str, set[str]] = {}
    for a, b in graph.edges:
        succ.setdefault(a, set()).add(b)
    open_ended = False
    for node, branches in graph.branches.items():
        for branch in branches.values():
            ends = getattr(branch, "ends", None)
            if not ends:
                open_ended = True  # a router without a path map may return any node or END
                continue
            succ.setdefault(node, set()).update(ends.values())
    if open_ended:
        return
    seen, todo = set(), [START]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        todo.extend(succ.get(n, ()))
    if END not in seen:
        raise AgentGraphError("agent graph has no end: no path from START reaches END; add "
                              "graph.add_edge(NODE, END) or a conditional edge whose path map includes END")


def run_episodes(graph: Any, states: Sequence[dict[str, Any]], clients: Mapping[str, EngineClient],
                 seed: int = 0, turn_limit: int = 16, flush_after_s: float = 2.0,
                 episode_timeout_s: float | None = None) -> EpisodeResults:
    """Run one episode per initial state in ``states`` through ``graph`` (a `StateGraph`,
    compiled here), all at once; ``turn_limit`` bounds each episode's graph steps and
    ``episode_timeout_s`` its time (an episode past it ends as ``timeout``: a hung tool node
    holds up its own episode only)."""
    check_graph(graph, clients, turn_limit)
    if episode_timeout_s is not None and episode_timeout_s <= 0:
        raise AgentGraphError(f"episode_timeout_s = {episode_timeout_s!r}: expected a number of seconds > 0 (or None)")
    compiled = graph.compile()
    t0 = time.perf_counter()
    episodes = _run_loop(_run_all(compiled, list(states), clients, turn_limit, seed, flush_after_s,
                                  episode_timeout_s))
    return EpisodeResults(episodes, sum(c.calls for c in clients.values()),
                          sum(c.retried for c in clients.values()), time.perf_counter() - t0)


def _run_loop(main: Awaitable[list[Episode]]) -> list[Episode]:
    """``asyncio.run`` without joining the default executor at the end: LangGraph runs a sync node
    in a thread, and a hung one must not hold up the step after its episode timed out."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(main)
    finally:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def _run_all(compiled: Any, states: list[dict[str, Any]], clients: Mapping[str, EngineClient],
                   turn_limit: int, seed: int, flush_after_s: float, timeout_s: float | None) -> list[Episode]:
    scheduler = _Scheduler(list(clients.values()), len(states), flush_after_s)
    for c in clients.values():
        c.reset(seed, scheduler)

    async def one(i: int, s: dict[str, Any]) -> Episode:
        run = _EpisodeRun(clients, {}, dict(s))
        try:
            return await asyncio.wait_for(_run_one(compiled, i, s, run, turn_limit), timeout_s)
        except asyncio.TimeoutError:
            return Episode(i, run.state, run.transcripts, "timeout", f"exceeded episode_timeout_s={timeout_s}",
                           run.steps)
        finally:
            scheduler.episode_ended()

    return list(await asyncio.gather(*(one(i, s) for i, s in enumerate(states))))


async def _run_one(compiled: Any, index: int, state: dict[str, Any], run: _EpisodeRun,
                   turn_limit: int) -> Episode:
    from langgraph.errors import GraphRecursionError

    config = {"configurable": {"troupe_episode": run}, "recursion_limit": turn_limit}
    try:
        # stream_mode="values" yields the initial state, then the state after each graph step
        async for chunk in compiled.astream(dict(state), config, stream_mode="values"):
            run.state = chunk
            run.chunks += 1
    except GraphRecursionError:
        return Episode(index, run.state, run.transcripts, "turn_limit", f"exceeded turn_limit={turn_limit}",
                       run.steps)
    except Exception as e:  # a node's error ends its episode, never the step
        return Episode(index, run.state, run.transcripts, "failed", f"{type(e).__name__}: {e}", run.steps)
    return Episode(index, run.state, run.transcripts, "done", None, run.steps)
