"""Submit troupe runs to a Ray cluster's job API; follow, stop and list them.

The same ``troupe run ...`` command that runs on a laptop runs on a cluster as a Ray job: the
working directory is uploaded (``.gitignore`` and ``.rayignore`` honoured) and the entrypoint
``troupe run ...`` starts on the head node. Every request carries the cluster's token as
``Authorization: Bearer ...``, read from ``RAY_AUTH_TOKEN``, the file named by
``RAY_AUTH_TOKEN_PATH``, or ``~/.ray/auth_token`` (Ray's own order); a token never appears
on a command line.

    client = connect("http://127.0.0.1:8265")
    job = submit_run(client, ["grpo", "--preset", "smoke"], working_dir=".")
    status = follow_logs(client, job)

Problems a user can fix (an unreachable address, a missing or wrong token, an upload over
the job API's limit) raise a `SubmitError` that names the problem and the fix.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import shlex
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from troupe.platform.errors import TroupeError
from troupe.platform.ray_internal import walk_upload

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient

# The job API refuses a request body above this (Ray's DASHBOARD_CLIENT_MAX_SIZE), and the
# working directory travels as one zip in one request.
MAX_UPLOAD_BYTES = 100 * 1024**2
DEFAULT_ADDRESS_ENV = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
TERMINAL_STATUSES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
_ADDRESS_HELP = (
    "use the job API address (the dashboard port, 8265 by default, e.g. http://127.0.0.1:8265), check that "
    "the cluster is up, and that any tunnel is open (`ray dashboard CLUSTER.yaml`, or "
    "`kubectl port-forward service/NAME-head-svc 8265:8265`)"
)
_TOKEN_HELP = (
    "put the cluster's token in a file readable only by you (chmod 600) and set RAY_AUTH_TOKEN_PATH to it "
    "(or keep it in ~/.ray/auth_token); set RAY_AUTH_MODE=token as well for Ray's own commands such as "
    "`ray job submit`"
)
_log = logging.getLogger(__name__)


class SubmitError(TroupeError, RuntimeError):
    """A job could not be submitted, followed, stopped or listed; the message says why and what to do."""


class ClusterUnreachableError(SubmitError, ConnectionError):
    """Nothing answers at the address, or what answers is not a Ray job API."""


class ClusterAuthError(SubmitError, PermissionError):
    """The cluster refused the request: no token was sent (HTTP 401) or the token is wrong (403)."""


class UploadTooLargeError(SubmitError, ValueError):
    """The working directory would upload more than the job API accepts."""


# ---------------------------------------------------------------------------------------------
# Token and connection


@dataclasses.dataclass(frozen=True)
class AuthToken:
    """A cluster token and where it came from (the value never shows in a repr)."""

    value: str = dataclasses.field(repr=False)
    source: str

    def headers(self) -> dict[str, str]:
        """The HTTP header that carries it."""
        return {"Authorization": f"Bearer {self.value}"}


def read_auth_token(env: Mapping[str, str] | None = None) -> AuthToken | None:
    """The token Ray's own clients would use: ``RAY_AUTH_TOKEN``, then the file at
    ``RAY_AUTH_TOKEN_PATH``, then ``$HOME/.ray/auth_token``; None when there is none or
    ``RAY_AUTH_MODE=disabled``. ``env`` defaults to this process's environment."""
    env = os.environ if env is None else env
    if env.get("RAY_AUTH_MODE", "").strip().lower() == "disabled":
        return None
    if env.get("RAY_AUTH_TOKEN", "").strip():
        return AuthToken(env["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN")
    if env.get("RAY_AUTH_TOKEN_PATH"):
        path = Path(env["RAY_AUTH_TOKEN_PATH"]).expanduser()
        try:
            value = path.read_text().strip()
        except OSError as e:
            raise ClusterAuthError(
                f"RAY_AUTH_TOKEN_PATH points to {path}, which cannot be read ({e.strerror}): {_TOKEN_HELP}"
            ) from None
        if not value:
            raise ClusterAuthError(f"the token file {path} (RAY_AUTH_TOKEN_PATH) is empty: {_TOKEN_HELP}")
        return AuthToken(value, f"RAY_AUTH_TOKEN_PATH={path}")
    home = env.get("HOME")
    if home:
        path = Path(home) / ".ray" / "auth_token"
        with contextlib.suppress(OSError):
            value = path.read_text().strip()
            if value:
                return AuthToken(value, str(path))
    return None


def normalize_address(address: str | None, env: Mapping[str, str] | None = None) -> str:
    """The job API URL: ``address``, else $RAY_API_SERVER_ADDRESS or an http $RAY_ADDRESS; a bare
    ``host:port`` gets ``http://``."""
    env = os.environ if env is None else env
    if not address:
        candidates = [env.get(name, "") for name in DEFAULT_ADDRESS_ENV]
        address = next((a for a in candidates if a.startswith(("http://", "https://"))), "")
    if not address:
        raise ClusterUnreachableError(
            "no cluster address given: pass --address http://HEAD:8265 or set RAY_API_SERVER_ADDRESS; "
            + _ADDRESS_HELP
        )
    if address.startswith(("ray://", "auto", "local")):
        raise ClusterUnreachableError(f"{address!r} is not a job API address: {_ADDRESS_HELP}")
    if "://" not in address:
        address = f"http://{address}"
    return address.rstrip("/")


def connect(
    address: str | None,
    *,
    token: AuthToken | str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 10.0,
) -> JobSubmissionClient:
    """A `JobSubmissionClient` for ``address`` that sends the cluster token with every request.

    ``token`` defaults to `read_auth_token` (``env`` defaults to this process's environment).
    The address is probed first, with a timeout, so that an unreachable address, a missing
    token (401) and a wrong one (403) raise `ClusterUnreachableError` or `ClusterAuthError`
    at once instead of deep inside Ray.
    """
    url = normalize_address(address, env)
    if isinstance(token, str):
        token = AuthToken(token.strip(), "argument")
    if token is None:
        token = read_auth_token(env)
    headers = token.headers() if token else {}
    _probe(url, headers, token, timeout_s)
    from ray.job_submission import JobSubmissionClient

    with _translated_errors(url, token):
        return JobSubmissionClient(url, headers=headers)


def _probe(url: str, headers: Mapping[str, str], token: AuthToken | None, timeout_s: float) -> None:
    import requests

    try:
        r = requests.get(f"{url}/api/version", headers=dict(headers), timeout=timeout_s)
    except requests.exceptions.Timeout:
        raise ClusterUnreachableError(f"the Ray job API at {url} did not answer within {timeout_s:.0f} s: "
                                      + _ADDRESS_HELP) from None
    except requests.exceptions.RequestException as e:
        raise ClusterUnreachableError(f"cannot reach the Ray job API at {url} ({type(e).__name__}): "
                                      + _ADDRESS_HELP) from None
    if r.status_code in (401, 403):
        raise _auth_error(url, r.status_code, token)
    if r.status_code != 200 or "ray_version" not in r.text:
        raise ClusterUnreachableError(
            f"{url} answered HTTP {r.status_code} to /api/version, so it is not a Ray job API: {_ADDRESS_HELP}"
        )


def _auth_error(url: str, status: int, token: AuthToken | None) -> ClusterAuthError:
    if status == 401 or token is None:
        return ClusterAuthError(
            f"the Ray cluster at {url} requires an authentication token and none was sent (HTTP {status}): "
            + _TOKEN_HELP
        )
    return ClusterAuthError(
        f"the Ray cluster at {url} rejected the token from {token.source} (HTTP {status}): it is not this "
        f"cluster's token. {_TOKEN_HELP[0].upper()}{_TOKEN_HELP[1:]}"
    )


@contextlib.contextmanager
def _translated_errors(url: str, token: AuthToken | None) -> Iterator[None]:
    """Turn what Ray's SDK raises for an auth or connection problem into a `SubmitError`."""
    from ray.exceptions import AuthenticationError

    try:
        yield
    except TroupeError:
        raise
    except AuthenticationError as e:
        status = 401 if str(e).startswith("Authentication required") else 403
        raise _auth_error(url, status, token) from None
    except ConnectionError as e:
        raise ClusterUnreachableError(f"lost the Ray job API at {url} ({e}): {_ADDRESS_HELP}") from None
    except Exception as e:
        status = getattr(e, "status", None)  # aiohttp's refusal of the log websocket
        if status in (401, 403):
            raise _auth_error(url, status, token) from None
        if type(e).__module__.startswith(("requests", "aiohttp")):
            raise ClusterUnreachableError(f"lost the Ray job API at {url} ({type(e).__name__}: {e}): "
                                          + _ADDRESS_HELP) from None
        if isinstance(e, RuntimeError) and "status code" in str(e):
            raise SubmitError(f"the Ray job API at {url} refused the request: {e}") from None
        raise


def _url_of(client: JobSubmissionClient) -> str:
    return str(getattr(client, "_address", "the cluster"))


def _token_of(client: JobSubmissionClient) -> AuthToken | None:
    headers = getattr(client, "_headers", {}) or {}
    value = headers.get("Authorization", "")
    return AuthToken(value.removeprefix("Bearer "), "the client's headers") if value else None


# ---------------------------------------------------------------------------------------------
# Upload size


@dataclasses.dataclass(frozen=True)
class UploadSize:
    """What uploading a working directory would send."""

    total_bytes: int
    files: int
    largest: tuple[tuple[str, int], ...]  # (path relative to the directory, bytes), largest first

    @property
    def mib(self) -> float:
        """The total in MiB."""
        return self.total_bytes / 1024**2


def upload_size(working_dir: str | Path, excludes: Sequence[str] = ()) -> UploadSize:
    """The size of the zip that Ray would upload for ``working_dir``.

    Uses Ray's own walk and ignore rules (its default excludes such as ``.git``, ``.gitignore``
    unless ``RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1``, ``.rayignore``, and ``excludes``), through
    `troupe.platform.ray_internal.walk_upload`. Ray stores files uncompressed, so the zip is the
    files' bytes plus about 100 bytes per entry.
    """
    root = Path(working_dir).resolve()
    if not root.is_dir():
        raise SubmitError(f"the working directory {root} does not exist or is not a directory")
    sizes: list[tuple[str, int]] = []
    overhead = 22  # end-of-central-directory record

    def visit(path: Path) -> None:
        nonlocal overhead
        if path.is_file() or (path.is_dir() and next(path.iterdir(), None) is None):
            name = str(path.relative_to(root))
            # local header (30) + central-directory entry (46), each with the name
            overhead += 76 + 2 * len(name.encode())
            sizes.append((name, path.stat().st_size if path.is_file() else 0))

    walk_upload(root, excludes, visit)
    sizes.sort(key=lambda t: -t[1])
    return UploadSize(sum(s for _, s in sizes) + overhead, len(sizes), tuple(sizes[:5]))


def check_upload_size(
    working_dir: str | Path, excludes: Sequence[str] = (), limit_bytes: int = MAX_UPLOAD_BYTES
) -> UploadSize:
    """`upload_size`, raising `UploadTooLargeError` (naming the limit and the largest files) when over."""
    size = upload_size(working_dir, excludes)
    if size.total_bytes > limit_bytes:
        largest = ", ".join(f"{name} ({n / 1024**2:.1f} MiB)" for name, n in size.largest)
        raise UploadTooLargeError(
            f"the working directory {Path(working_dir).resolve()} would upload {size.mib:.1f} MiB in "
            f"{size.files} files, over the Ray job API's limit of {limit_bytes / 1024**2:.0f} MiB. Largest: "
            f"{largest}. List what the run does not need in .rayignore (or .gitignore), pass excludes, "
            "or put data and checkpoints in storage the cluster reads directly"
        )
    return size


# ---------------------------------------------------------------------------------------------
# Jobs


def run_entrypoint(run_args: Sequence[str]) -> str:
    """The shell command of a run: ``troupe run`` with ``run_args``, each quoted."""
    return shlex.join(["troupe", "run", *run_args])


def submit_entrypoint(
    client: JobSubmissionClient,
    entrypoint: str,
    *,
    working_dir: str | Path | None = ".",
    excludes: Sequence[str] = (),
    env_vars: Mapping[str, str] | None = None,
    submission_id: str | None = None,
    metadata: Mapping[str, str] | None = None,
) -> str:
    """Submit any shell command as a job and return its submission id.

    ``working_dir`` (a local directory, checked against the upload limit first, or a remote
    URI that the cluster fetches itself) becomes the job's working directory and is first on
    its PYTHONPATH; None submits no directory.
    """
    runtime_env: dict[str, Any] = {}
    if working_dir is not None:
        if "://" in str(working_dir):
            runtime_env["working_dir"] = str(working_dir)
        else:
            check_upload_size(working_dir, excludes)
            runtime_env["working_dir"] = str(Path(working_dir).resolve())
        if excludes:
            runtime_env["excludes"] = list(excludes)
    if env_vars:
        runtime_env["env_vars"] = dict(env_vars)
    with _translated_errors(_url_of(client), _token_of(client)):
        return client.submit_job(
            entrypoint=entrypoint,
            runtime_env=runtime_env or None,
            submission_id=submission_id,
            metadata=dict(metadata) if metadata else None,
        )


def submit_run(
    client: JobSubmissionClient,
    run_args: Sequence[str],
    *,
    working_dir: str | Path | None = ".",
    excludes: Sequence[str] = (),
    env_vars: Mapping[str, str] | None = None,
    submission_id: str | None = None,
) -> str:
    """Submit ``troupe run RUN_ARGS...`` as a job and return its submission id."""
    if not run_args:
        raise SubmitError("nothing to run: give the arguments of `troupe run`, e.g. `-- grpo --preset smoke`")
    return submit_entrypoint(
        client, run_entrypoint(run_args), working_dir=working_dir, excludes=excludes, env_vars=env_vars,
        submission_id=submission_id, metadata={"troupe_run": " ".join(run_args)[:200]},
    )


def job_status(client: JobSubmissionClient, job_id: str) -> str:
    """The job's status: PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED."""
    with _translated_errors(_url_of(client), _token_of(client)):
        return str(client.get_job_status(job_id).value)


def job_logs(client: JobSubmissionClient, job_id: str) -> str:
    """Everything the job's driver has printed so far."""
    with _translated_errors(_url_of(client), _token_of(client)):
        return client.get_job_logs(job_id)


def wait_for_job(client: JobSubmissionClient, job_id: str, timeout_s: float = 600.0, poll_s: float = 1.0) -> str:
    """Wait until the job ends and return its final status; `SubmitError` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = job_status(client, job_id)
        if status in TERMINAL_STATUSES:
            return status
        if time.monotonic() > deadline:
            raise SubmitError(
                f"job {job_id} is still {status} after {timeout_s:.0f} s; it keeps running: follow it with "
                f"`troupe submit --follow-job {job_id}` or stop it with `troupe submit --stop {job_id}`"
            )
        time.sleep(poll_s)


def follow_logs(client: JobSubmissionClient, job_id: str, out: TextIO | None = None) -> str:
    """Stream the job's logs to ``out`` (default stdout) until it ends; return its final status."""
    out = sys.stdout if out is None else out

    async def tail() -> None:
        async for lines in client.tail_job_logs(job_id):
            out.write(lines)
            out.flush()

    with _translated_errors(_url_of(client), _token_of(client)):
        asyncio.run(tail())
    # The stream closes when the driver exits; the status may lag it by a moment.
    return wait_for_job(client, job_id, timeout_s=60.0, poll_s=0.5)


RUN_DIR_PREFIX = "run directory: "  # what `troupe run` prints when its run ends


def run_dir_from_logs(logs: str) -> str | None:
    """The run directory a `troupe run` job printed last, or None before it printed one."""
    found = None
    for line in logs.splitlines():
        if line.startswith(RUN_DIR_PREFIX):
            found = line[len(RUN_DIR_PREFIX):].strip()
    return found


class _Recorder:
    """A text stream that passes writes on and keeps the last run directory printed."""

    def __init__(self, out: TextIO) -> None:
        self.out, self.run_dir, self._tail = out, None, ""

    def write(self, text: str) -> int:
        self.out.write(text)
        lines = (self._tail + text).split("\n")
        self._tail = lines.pop()
        self.run_dir = run_dir_from_logs("\n".join(lines)) or self.run_dir
        return len(text)

    def flush(self) -> None:
        self.out.flush()


def stop_job(client: JobSubmissionClient, job_id: str) -> bool:
    """Ask the cluster to stop the job; False when it had already ended."""
    with _translated_errors(_url_of(client), _token_of(client)):
        return bool(client.stop_job(job_id))


def list_jobs(client: JobSubmissionClient) -> list[JobDetails]:
    """Every job the cluster knows, oldest first."""
    with _translated_errors(_url_of(client), _token_of(client)):
        jobs = client.list_jobs()
    return sorted(jobs, key=lambda j: j.start_time or 0)


def format_jobs(jobs: Sequence[JobDetails]) -> str:
    """A plain table of jobs: submission id, status, start time and entrypoint."""
    rows = [("SUBMISSION ID", "STATUS", "STARTED", "ENTRYPOINT")]
    for j in jobs:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(j.start_time / 1000)) if j.start_time else "-"
        entry = j.entrypoint if len(j.entrypoint) <= 60 else j.entrypoint[:57] + "..."
        rows.append((str(j.submission_id or j.job_id), str(j.status.value), started, entry))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}" for r in rows)


# ---------------------------------------------------------------------------------------------
# Command line


def add_submit_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the arguments `submit_main` reads to ``parser`` (for ``troupe submit``)."""
    parser.add_argument("--address", default=None,
                        help="job API of the cluster, e.g. http://127.0.0.1:8265 (default: $RAY_API_SERVER_ADDRESS)")
    parser.add_argument("--working-dir", dest="working_dir", default=".",
                        help="directory uploaded as the job's working directory (default: .)")
    parser.add_argument("--exclude", dest="excludes", action="append", default=[],
                        help="gitignore-style pattern left out of the upload (repeatable)")
    parser.add_argument("--submission-id", dest="submission_id", default=None, help="id for the new job")
    parser.add_argument("--follow", action="store_true", help="stream the job's logs until it ends")
    parser.add_argument("--follow-job", dest="follow_job", default=None, metavar="ID",
                        help="stream the logs of an existing job until it ends")
    parser.add_argument("--stop", default=None, metavar="ID", help="stop the job with this submission id")
    parser.add_argument("--list", action="store_true", help="list the cluster's jobs")
    parser.add_argument("run_args", nargs=argparse.REMAINDER,
                        help="after --: the arguments of `troupe run`, e.g. -- grpo --preset smoke")
    return parser


def submit_main(args: argparse.Namespace) -> int:
    """``troupe submit``: submit a run, follow a job, stop one or list them. Returns the exit code.

    Reads these attributes of ``args`` (`add_submit_arguments` defines them all; missing ones
    take the default):

    - ``address`` (str | None): the job API, e.g. ``http://127.0.0.1:8265``; default
      ``$RAY_API_SERVER_ADDRESS``.
    - ``working_dir`` (str, default "."): uploaded as the job's working directory.
    - ``excludes`` (list[str]): extra patterns left out of the upload.
    - ``run_args`` (list[str]): the arguments of ``troupe run`` (a leading ``--`` is dropped).
    - ``submission_id`` (str | None): id for the new job.
    - ``follow`` (bool): after submitting, stream the logs until the job ends; the exit code
      is then 0 only if it SUCCEEDED.
    - ``follow_job`` (str | None): stream an existing job's logs instead of submitting.
    - ``stop`` (str | None): stop that job instead of submitting.
    - ``list`` (bool): list the cluster's jobs instead of submitting.

    The token comes from ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``,
    never from an argument. Problems raise `SubmitError` (a `TroupeError`) with the fix.
    """
    client = connect(getattr(args, "address", None))
    if getattr(args, "list", False):
        print(format_jobs(list_jobs(client)))
        return 0
    if getattr(args, "stop", None):
        stopped = stop_job(client, args.stop)
        print(f"{args.stop}: {'stop requested' if stopped else 'already ended'} ({job_status(client, args.stop)})")
        return 0
    if getattr(args, "follow_job", None):
        return 0 if follow_logs(client, args.follow_job) == "SUCCEEDED" else 1
    run_args = list(getattr(args, "run_args", None) or [])
    if run_args[:1] == ["--"]:
        run_args = run_args[1:]
    job_id = submit_run(
        client, run_args, working_dir=getattr(args, "working_dir", "."),
        excludes=getattr(args, "excludes", None) or (), submission_id=getattr(args, "submission_id", None),
    )
    print(f"submitted {job_id}: {run_entrypoint(run_args)}")
    if not getattr(args, "follow", False):
        print(f"follow: troupe submit --follow-job {job_id}    stop: troupe submit --stop {job_id}")
        return 0
    recorder = _Recorder(sys.stdout)
    try:
        status = follow_logs(client, job_id, out=recorder)  # type: ignore[arg-type]
    except KeyboardInterrupt:
        print(f"\nstopped following; {job_id} keeps running (troupe submit --stop {job_id} ends it)")
        return 130
    print(f"{job_id}: {status}")
    print(where_the_run_is(recorder.run_dir, job_id))
    return 0 if status == "SUCCEEDED" else 1


def where_the_run_is(run_dir: str | None, job_id: str) -> str:
    """The closing line of ``--follow``: where the job's run directory is and how to get it."""
    from troupe.platform.storage import is_uri

    if run_dir is None:
        return f"{job_id} printed no run directory (see its log above)"
    if is_uri(run_dir):
        return f"run directory: {run_dir}\ncopy it here: troupe fetch {run_dir} ./{run_dir.rstrip('/').rsplit('/', 1)[-1]}"
    return (f"run directory: {run_dir} (a path on the machine that ran the job; unless it is shared storage, "
            "pass run.out=s3://bucket/runs or a shared mount to keep runs where you can reach them, then "
            "`troupe fetch` them)")
