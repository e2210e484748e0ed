"""A real `ray start --head` cluster with token authentication: jobs through troupe's submit
module and through the plain `ray job submit`, auth errors, and a clean stop."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

import pytest

from troupe.cluster.local import LocalCluster, LocalClusterError, ray_executable
from troupe.cluster.submit import (
    ClusterAuthError,
    connect,
    follow_logs,
    job_logs,
    job_status,
    list_jobs,
    stop_job,
    submit_entrypoint,
    wait_for_job,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]  # the working directory the jobs upload
PRINT_OK = "python -c \"import troupe; print('ok')\""


def test_cluster_runs_with_token_authentication_from_a_private_file(local_cluster: LocalCluster):
    assert local_cluster.address.startswith("http://127.0.0.1:")
    assert local_cluster.token_path is not None and local_cluster.token_path.stat().st_mode & 0o777 == 0o600
    env = local_cluster.client_env()
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == str(local_cluster.token_path)
    # The token travels by file, never on a command line.
    import psutil

    cmdlines = [" ".join(p.cmdline()) for p in [psutil.Process(local_cluster._proc.pid),
                                                *psutil.Process(local_cluster._proc.pid).children(recursive=True)]]
    assert local_cluster.token() not in " ".join(cmdlines)


def test_job_submitted_through_troupe_succeeds_and_prints_ok(local_cluster: LocalCluster):
    client = connect(local_cluster.address, env=local_cluster.client_env())
    job = submit_entrypoint(client, PRINT_OK, working_dir=REPO)
    out = io.StringIO()
    assert follow_logs(client, job, out=out) == "SUCCEEDED", job_logs(client, job)
    assert "ok" in out.getvalue().split()
    assert "ok" in job_logs(client, job).split()
    assert job in [j.submission_id for j in list_jobs(client)]


def test_client_without_the_token_gets_a_clear_auth_error(local_cluster: LocalCluster):
    with pytest.raises(ClusterAuthError, match=r"none was sent \(HTTP 401\).*RAY_AUTH_TOKEN_PATH"):
        connect(local_cluster.address, env={})
    with pytest.raises(ClusterAuthError, match=r"rejected the token from argument \(HTTP 403\)"):
        connect(local_cluster.address, token="0" * 64)


def test_plain_ray_job_submit_works_with_the_token_and_fails_without(local_cluster: LocalCluster):
    cmd = [ray_executable(), "job", "submit", "--address", local_cluster.address, "--working-dir", ".", "--",
           "python", "-c", "import troupe; print('ok')"]
    done = subprocess.run(cmd, cwd=REPO, env=local_cluster.subprocess_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok" in done.stdout.split() and "succeeded" in done.stdout

    no_mode = local_cluster.subprocess_env()
    del no_mode["RAY_AUTH_MODE"]  # Ray's clients send the token only in token mode
    denied = subprocess.run(cmd, cwd=REPO, env=no_mode, capture_output=True, text=True, timeout=120)
    assert denied.returncode != 0
    assert "Authentication required" in denied.stdout + denied.stderr


def test_a_running_job_can_be_stopped(local_cluster: LocalCluster):
    client = connect(local_cluster.address, token=local_cluster.token())
    job = submit_entrypoint(client, "python -c \"import time; print('started', flush=True); time.sleep(120)\"",
                            working_dir=None)
    deadline = time.monotonic() + 60
    while job_status(client, job) == "PENDING" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert stop_job(client, job) is True
    assert wait_for_job(client, job, timeout_s=60) == "STOPPED"


# Tests that submit jobs go above this one: it stops the session's cluster, and the next user
# of `local_cluster` pays for a new start.
def test_stop_ends_every_process_it_started_and_nothing_else(local_cluster: LocalCluster, ray_local):
    import psutil

    # Bystanders in the same process tree: a private `ray.init(address="local")` cluster (the
    # test session's) and a plain child process.
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        tree = psutil.Process(local_cluster._proc.pid).children(recursive=True) + [psutil.Process(local_cluster._proc.pid)]
        root = local_cluster.root
        local_cluster.stop()
        assert not local_cluster.running
        assert [p.pid for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
        assert root is not None and not root.exists()  # the token went with it
        assert bystander.poll() is None
        assert ray_local.get(ray_local.remote(lambda: 1).remote(), timeout=60) == 1
        local_cluster.stop()  # a second stop is harmless
    finally:
        bystander.kill()
        bystander.wait()


def test_startup_failure_names_the_cause_and_retries_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # A `ray start` that dies at once (as when a chosen port was taken meanwhile).
    fake = tmp_path / "ray"
    fake.write_text("#!/bin/sh\necho \"ValueError: Failed to bind to port\"\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr("troupe.cluster.local.ray_executable", lambda: str(fake))
    broken = LocalCluster(num_cpus=1, startup_timeout_s=30, attempts=2)
    with pytest.raises(LocalClusterError) as e:
        broken.start()
    msg = str(e.value)
    assert "exited with code 3" in msg and "Failed to bind to port" in msg and "ray-start-1.log" in msg
    assert broken.root is None and not broken.running
