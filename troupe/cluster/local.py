"""A Ray cluster on this machine, started the way a real head node is: ``ray start --head``.

`LocalCluster` runs ``ray start --head --block`` as a child process on free ports, with its
own short ``--temp-dir`` and token authentication on, and waits until the job API answers.
It is what tests and users need to exercise ``ray job submit`` and `troupe.cluster.submit`
against a cluster that behaves like a remote one::

    with LocalCluster(num_cpus=2) as cluster:
        client = connect(cluster.address, token=cluster.token())
        ...
        subprocess.run(["ray", "job", "submit", "--address", cluster.address, ...],
                       env=cluster.subprocess_env())

The token is generated into a private file (mode 600) and reaches Ray through
``RAY_AUTH_TOKEN_PATH``, never through a command line, where ``ps`` would show it. On exit
only the processes this cluster started are stopped: the ``--block`` process is terminated
(it drains and stops its own children) and anything of its tree still alive afterwards is
ended by pid. ``ray stop`` is never used: it ends every Ray process of the user, including a
private ``ray.init(address="local")`` cluster in the same test run. Its own temp dir also
keeps ``ray_current_cluster`` away from ``/tmp/ray``, so ``ray.init()`` elsewhere does not
find this cluster by accident.

With ``autoscaling_config`` the head also runs an autoscaler. `fake_autoscaling_config` builds
one for Ray's fake multi-node provider, which adds and removes worker nodes as processes on
this machine (they may advertise GPUs or custom resources the machine lacks)::

    config = fake_autoscaling_config({"CPU": 2}, {"gpu_worker": {"CPU": 1, "GPU": 1}})
    with LocalCluster(num_cpus=2, autoscaling_config=config) as cluster:
        ...  # a placement group asking for a GPU makes the autoscaler add a gpu_worker

Those nodes are children of the head's processes, so `stop` ends them too.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from troupe.platform.errors import TroupeError
from troupe.platform.ray_internal import FAKE_MULTINODE_PROVIDER

# Variables a parent may carry that would point the cluster or its clients somewhere else:
# RAY_AUTH_TOKEN outranks RAY_AUTH_TOKEN_PATH, RAY_ADDRESS redirects drivers.
_INHERITED_RAY_VARS_TO_DROP = ("RAY_AUTH_TOKEN", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")
FAKE_PROVIDER = FAKE_MULTINODE_PROVIDER
_PORT_FLAGS = (
    "--port",
    "--dashboard-port",
    "--ray-client-server-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--runtime-env-agent-port",
    "--metrics-export-port",
    "--node-manager-port",
    "--object-manager-port",
)


class LocalClusterError(TroupeError, RuntimeError):
    """The local cluster did not start or answer in time; the message holds its log's tail."""


class LocalCluster:
    """``ray start --head --block`` on free ports with token authentication, as a context manager.

    Args:
        num_cpus: CPUs the head advertises (``--num-cpus``).
        num_gpus: GPUs it advertises; None lets Ray detect them.
        resources: extra custom resources (``--resources``).
        object_store_memory: bytes for the object store; kept small by default because the
            machines that run tests are shared.
        startup_timeout_s: how long to wait for the job API before giving up.
        stop_timeout_s: how long the ``--block`` process may drain before it is killed.
        env: extra environment for the head and hence for every job driver it starts.
        keep_logs: keep the temp dir (Ray's session logs) after exit; the token is removed anyway.
        attempts: start attempts; a port taken between choosing and binding it fails an attempt.
        autoscaling_config: a cluster-launcher config (a mapping) for the head's autoscaler,
            e.g. from `fake_autoscaling_config`; the fake provider's ``gcs_address`` is filled in.

    After `start` (or ``with``): ``address`` is the job API (``http://127.0.0.1:PORT``),
    ``gcs_address`` is ``host:port`` of the GCS, ``token_path`` the token file, ``temp_dir``
    Ray's temp dir and ``log_path`` the ``ray start`` output.
    """

    def __init__(
        self,
        num_cpus: int = 2,
        *,
        num_gpus: int | None = None,
        resources: Mapping[str, float] | None = None,
        object_store_memory: int | None = 512 * 1024**2,
        startup_timeout_s: float = 120.0,
        stop_timeout_s: float = 30.0,
        env: Mapping[str, str] | None = None,
        keep_logs: bool = False,
        attempts: int = 2,
        autoscaling_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.resources = dict(resources or {})
        self.object_store_memory = object_store_memory
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.extra_env = dict(env or {})
        self.keep_logs = keep_logs
        self.autoscaling_config = copy.deepcopy(dict(autoscaling_config)) if autoscaling_config else None
        self.attempts = max(1, attempts)
        self.address = ""
        self.gcs_address = ""
        self.root: Path | None = None
        self.token_path: Path | None = None
        self.temp_dir: Path | None = None
        self.log_path: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True while the ``--block`` process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> LocalCluster:
        """Start the head and wait until its job API answers; raise `LocalClusterError` if it does not."""
        if self._proc is not None:
            raise LocalClusterError("this LocalCluster is already started")
        # A private (0700) root: the token file and Ray's temp dir live under it.
        self.root = Path(tempfile.mkdtemp(prefix="trp-", dir="/tmp"))
        self.token_path = self.root / "auth_token"
        fd = os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        atexit.register(self.stop)
        last_error: LocalClusterError | None = None
        for attempt in range(self.attempts):
            try:
                self._start_once(attempt)
                return self
            except LocalClusterError as e:
                last_error = e
                self._stop_process()
        self.stop()
        assert last_error is not None
        raise last_error

    def _start_once(self, attempt: int) -> None:
        assert self.root is not None
        self.temp_dir = self.root / f"r{attempt}"
        self.log_path = self.root / f"ray-start-{attempt}.log"
        ports = dict(zip(_PORT_FLAGS, free_ports(len(_PORT_FLAGS)), strict=True))
        self.address = f"http://127.0.0.1:{ports['--dashboard-port']}"
        cmd = [
            ray_executable(), "start", "--head", "--block",
            f"--temp-dir={self.temp_dir}",
            f"--num-cpus={self.num_cpus}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            "--disable-usage-stats",
            *(f"{flag}={port}" for flag, port in ports.items()),
        ]
        if self.num_gpus is not None:
            cmd.append(f"--num-gpus={self.num_gpus}")
        if self.resources:
            cmd.append(f"--resources={json.dumps(self.resources)}")
        if self.object_store_memory is not None:
            cmd.append(f"--object-store-memory={int(self.object_store_memory)}")
        env = self._head_env()
        if self.autoscaling_config is not None:
            cmd.append(f"--autoscaling-config={self._write_autoscaling_config(attempt, ports['--port'])}")
            if self.autoscaling_config["provider"].get("module") == FAKE_PROVIDER:
                env["RAY_FAKE_CLUSTER"] = "1"  # the fake provider refuses to start without it
                env.setdefault("AUTOSCALER_UPDATE_INTERVAL_S", "1")
        with open(self.log_path, "wb") as log:
            # A session of its own: a Ctrl-C in the terminal reaches the test, which then stops
            # the cluster in order, instead of killing Ray processes half-way.
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
            )
        self._wait_ready()

    def _write_autoscaling_config(self, attempt: int, gcs_port: int) -> Path:
        assert self.root is not None and self.autoscaling_config is not None
        config = copy.deepcopy(self.autoscaling_config)
        provider = config.setdefault("provider", {})
        if provider.get("module") == FAKE_PROVIDER:
            # Its nodes join the GCS at this address (by default port 6379, not ours).
            provider["gcs_address"] = f"127.0.0.1:{gcs_port}"
        path = self.root / f"autoscaling-{attempt}.yaml"
        path.write_text(json.dumps(config, indent=1))  # JSON is YAML
        return path

    def _head_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _INHERITED_RAY_VARS_TO_DROP}
        env.update(self.extra_env)
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN_PATH"] = str(self.token_path)
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        # Job drivers run `python ...` through a shell that inherits this PATH: make it this
        # interpreter's environment.
        env["PATH"] = _path_with_python_bin(env.get("PATH", ""))
        return env

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                raise LocalClusterError(
                    f"`ray start --head` exited with code {self._proc.returncode if self._proc else '?'} "
                    f"before its job API answered.\n{self.log_tail()}"
                )
            # `ray start` writes the GCS address into its temp dir only once every process is
            # up; the dashboard alone answers seconds earlier, before the raylet exists.
            address_file = self.temp_dir / "ray_current_cluster" if self.temp_dir else None
            if address_file is None or not address_file.is_file():
                last = "`ray start` has not finished"
            else:
                status = self._get("/api/jobs/")
                if status == 200:
                    self.gcs_address = address_file.read_text().strip()
                    return
                last = f"GET {self.address}/api/jobs/ -> {status}"
            time.sleep(0.5)
        raise LocalClusterError(
            f"the job API at {self.address} did not answer within {self.startup_timeout_s:.0f} s "
            f"({last}).\n{self.log_tail()}"
        )

    def _get(self, path: str) -> int | str:
        req = urllib.request.Request(self.address + path, headers=self.auth_headers())
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except (urllib.error.URLError, OSError) as e:
            return type(e).__name__

    def stop(self) -> None:
        """Stop the processes this cluster started (never others) and remove its files."""
        atexit.unregister(self.stop)
        self._stop_process()
        if self.root is not None:
            if self.keep_logs:
                with contextlib.suppress(OSError):
                    if self.token_path is not None:
                        self.token_path.unlink()
            else:
                shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def _stop_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        import psutil

        try:
            tree = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        if proc.poll() is None:
            # SIGTERM makes `ray start --block` drain the node and stop its own children.
            proc.terminate()
            try:
                proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # Anything of this tree still alive now (a worker that outlived its raylet) is ended
        # by pid; psutil refuses to signal a pid that was reused by another process.
        alive = []
        for p in tree:
            with contextlib.suppress(psutil.Error):
                if p.is_running():
                    p.terminate()
                    alive.append(p)
        _, still = psutil.wait_procs(alive, timeout=5)
        for p in still:
            with contextlib.suppress(psutil.Error):
                p.kill()

    # -- what clients need ----------------------------------------------------------------

    def token(self) -> str:
        """The cluster's authentication token (read from its private file)."""
        if self.token_path is None:
            raise LocalClusterError("the cluster is not started: it has no token yet")
        return self.token_path.read_text().strip()

    def auth_headers(self) -> dict[str, str]:
        """HTTP headers that authenticate a request to the job API."""
        return {"Authorization": f"Bearer {self.token()}"}

    def client_env(self) -> dict[str, str]:
        """Variables a client (``ray job submit``, ``troupe submit``) needs to reach this cluster.

        ``RAY_AUTH_MODE=token`` makes Ray's clients send the token at all, and
        ``RAY_AUTH_TOKEN_PATH`` says where it is; ``RAY_API_SERVER_ADDRESS`` is the job API,
        the default address of ``ray job`` commands. Merge it into an environment that has no
        ``RAY_AUTH_TOKEN`` (it would outrank the path), or use `subprocess_env`.
        """
        if not self.address or self.token_path is None:
            raise LocalClusterError("the cluster is not started: no address or token yet")
        return {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token_path),
            "RAY_API_SERVER_ADDRESS": self.address,
        }

    def subprocess_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """A whole environment for a client subprocess: ``base`` (default: this process's)
        without variables that would point elsewhere, plus `client_env`, with this
        interpreter's ``bin`` first on PATH."""
        env = {k: v for k, v in (os.environ if base is None else base).items()
               if k not in _INHERITED_RAY_VARS_TO_DROP}
        env.update(self.client_env())
        env["PATH"] = _path_with_python_bin(env.get("PATH", ""))
        return env

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the ``ray start`` output, for error messages."""
        if self.log_path is None or not self.log_path.is_file():
            return "(no ray start log)"
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return f"--- last lines of {self.log_path} ---\n" + "\n".join(text)


def fake_autoscaling_config(
    head_resources: Mapping[str, float],
    worker_types: Mapping[str, Mapping[str, float]],
    *,
    max_workers: int = 1,
    idle_timeout_s: float = 5.0,
    worker_object_store_memory: int = 128 * 1024**2,
) -> dict[str, Any]:
    """A cluster-launcher config for Ray's fake multi-node provider, for `LocalCluster`.

    ``worker_types`` maps a node type to what one node of it advertises (``{"CPU": 1, "GPU":
    1}``: fake GPUs are fine); each type scales from zero to ``max_workers`` nodes, and a node
    idle for ``idle_timeout_s`` is removed. Pass the head's ``num_cpus`` to `LocalCluster` as
    well: the head advertises what ``ray start`` gives it, the config only describes it.
    """
    types: dict[str, Any] = {
        "ray.head.default": {"resources": dict(head_resources), "node_config": {}, "max_workers": 0},
    }
    for name, resources in worker_types.items():
        # The fake provider takes a node's object store size from its resources.
        res = {**resources, "object_store_memory": worker_object_store_memory}
        types[name] = {"resources": res, "node_config": {}, "min_workers": 0, "max_workers": max_workers}
    return {
        "cluster_name": "troupe-fake",
        "max_workers": max_workers * len(worker_types),
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_s / 60,
        # A fake node is up once its processes run: no updater may set it up over SSH (the
        # provider's tags are read-only, so an updater fails and ends the node as "launch
        # failed"), and no liveness check may end it for a first heartbeat over 30 s late, as
        # it often is on a loaded machine. Every node has this machine's IP, so the autoscaler
        # must tell nodes (and so their idle time) apart by node id, as the provider does.
        "provider": {"type": "external", "module": FAKE_PROVIDER, "disable_node_updaters": True,
                     "worker_liveness_check": False, "use_node_id_as_ip": True},
        "head_node_type": "ray.head.default",
        "available_node_types": types,
        "auth": {"ssh_user": "ubuntu"},
        "docker": {},
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports that are free now (held together while choosing, so distinct)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def ray_executable() -> str:
    """The ``ray`` command of this interpreter's environment (else the first on PATH)."""
    beside = Path(sys.executable).parent / "ray"
    if beside.is_file():
        return str(beside)
    found = shutil.which("ray")
    if not found:
        raise LocalClusterError("the `ray` command is not installed: pip install 'ray[default]'")
    return found


def _path_with_python_bin(path: str) -> str:
    bin_dir = str(Path(sys.executable).parent)
    parts = [p for p in path.split(os.pathsep) if p and p != bin_dir]
    return os.pathsep.join([bin_dir, *parts])
