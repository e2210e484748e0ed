"""Job submission without a cluster: token lookup, addresses, upload size, auth and connection errors."""

from __future__ import annotations

import argparse
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from troupe.cluster.local import free_ports
from troupe.cluster.submit import (
    MAX_UPLOAD_BYTES,
    ClusterAuthError,
    ClusterUnreachableError,
    SubmitError,
    UploadTooLargeError,
    add_submit_arguments,
    check_upload_size,
    connect,
    normalize_address,
    read_auth_token,
    run_entrypoint,
    submit_main,
    upload_size,
)
from troupe.platform.errors import TroupeError


def write_token(path: Path, value: str) -> Path:
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def test_token_comes_from_env_then_path_then_home(tmp_path: Path):
    home = tmp_path / "home"
    write_token((home / ".ray").mkdir(parents=True) or home / ".ray" / "auth_token", "from-home")
    path = write_token(tmp_path / "tok", "from-path")
    assert read_auth_token({"HOME": str(home)}).value == "from-home"
    assert read_auth_token({"HOME": str(home), "RAY_AUTH_TOKEN_PATH": str(path)}).value == "from-path"
    env = {"HOME": str(home), "RAY_AUTH_TOKEN_PATH": str(path), "RAY_AUTH_TOKEN": "from-env"}
    assert read_auth_token(env).value == "from-env"
    assert read_auth_token({**env, "RAY_AUTH_MODE": "disabled"}) is None
    assert read_auth_token({}) is None


def test_token_never_shows_in_its_repr(tmp_path: Path):
    token = read_auth_token({"RAY_AUTH_TOKEN_PATH": str(write_token(tmp_path / "t", "s3cret"))})
    assert "s3cret" not in repr(token) and str(tmp_path) in token.source
    assert token.headers() == {"Authorization": "Bearer s3cret"}


def test_unreadable_token_path_is_a_clear_error(tmp_path: Path):
    with pytest.raises(ClusterAuthError, match="RAY_AUTH_TOKEN_PATH points to .*missing"):
        read_auth_token({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "missing")})
    with pytest.raises(ClusterAuthError, match="is empty"):
        read_auth_token({"RAY_AUTH_TOKEN_PATH": str(write_token(tmp_path / "empty", ""))})


def test_address_defaults_and_scheme():
    assert normalize_address("127.0.0.1:8265", {}) == "http://127.0.0.1:8265"
    assert normalize_address(None, {"RAY_API_SERVER_ADDRESS": "http://h:8265/"}) == "http://h:8265"
    assert normalize_address(None, {"RAY_ADDRESS": "http://h:1"}) == "http://h:1"
    with pytest.raises(ClusterUnreachableError, match="--address"):
        normalize_address(None, {"RAY_ADDRESS": "10.0.0.1:6379"})
    with pytest.raises(ClusterUnreachableError, match="8265"):
        normalize_address("ray://h:10001", {})


def test_unreachable_address_is_a_clear_troupe_error():
    (port,) = free_ports(1)
    with pytest.raises(ClusterUnreachableError, match=rf"cannot reach the Ray job API at http://127.0.0.1:{port}") as e:
        connect(f"127.0.0.1:{port}", env={}, timeout_s=5)
    assert isinstance(e.value, TroupeError) and "8265" in str(e.value)


class FakeJobAPI(http.server.BaseHTTPRequestHandler):
    """Answers /api/version like a token-protected Ray dashboard whose token is 'right'."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        auth = self.headers.get("Authorization")
        status, body = (401, b"Unauthorized") if not auth else (
            (200, b'{"ray_version": "2.60.0"}') if auth == "Bearer right" else (403, b"Forbidden"))
        if self.path != "/api/version":
            status, body = 404, b"not found"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def fake_api() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeJobAPI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_missing_token_is_named_with_the_fix(fake_api: str):
    with pytest.raises(ClusterAuthError) as e:
        connect(fake_api, env={})
    msg = str(e.value)
    assert "requires an authentication token and none was sent (HTTP 401)" in msg
    assert "RAY_AUTH_TOKEN_PATH" in msg and "RAY_AUTH_MODE=token" in msg


def test_wrong_token_is_named_with_its_source(fake_api: str, tmp_path: Path):
    path = write_token(tmp_path / "tok", "f00dcafe")
    with pytest.raises(ClusterAuthError) as e:
        connect(fake_api, env={"RAY_AUTH_TOKEN_PATH": str(path)})
    assert f"rejected the token from RAY_AUTH_TOKEN_PATH={path} (HTTP 403)" in str(e.value)
    assert "f00dcafe" not in str(e.value)


def test_something_that_is_not_a_job_api_is_named(fake_api: str):
    with pytest.raises(ClusterUnreachableError, match="not a Ray job API"):
        connect(fake_api + "/sub", token="right")


def make_dir(tmp_path: Path) -> Path:
    root = tmp_path / "wd"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "code.py").write_text("x = 1\n" * 100)
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"\0" * 300_000)
    (root / "ckpt.safetensors").write_bytes(b"\0" * 200_000)
    return root


def test_upload_size_honours_gitignore_rayignore_and_excludes(tmp_path: Path):
    root = make_dir(tmp_path)
    full = upload_size(root)
    assert full.files == 3 and 500_600 < full.total_bytes < 502_000
    assert full.largest[0] == ("data/big.bin", 300_000)
    (root / ".gitignore").write_text("data/\n")
    assert upload_size(root).total_bytes < full.total_bytes - 300_000 + 200
    (root / ".rayignore").write_text("*.safetensors\n")
    assert upload_size(root).total_bytes < 2_000
    assert upload_size(root, excludes=["pkg"]).files == 2  # the two ignore files themselves


def test_upload_over_the_job_api_limit_fails_naming_the_limit_and_largest_file(tmp_path: Path):
    root = make_dir(tmp_path)
    with open(root / "data" / "huge.bin", "wb") as f:  # sparse: 101 MiB without writing it
        f.truncate(101 * 1024**2)
    with pytest.raises(UploadTooLargeError) as e:
        check_upload_size(root)
    msg = str(e.value)
    assert "over the Ray job API's limit of 100 MiB" in msg and "data/huge.bin (101.0 MiB)" in msg
    assert ".rayignore" in msg
    assert check_upload_size(root, excludes=["huge.bin"]).total_bytes < MAX_UPLOAD_BYTES


def test_missing_working_dir_is_a_clear_error(tmp_path: Path):
    with pytest.raises(SubmitError, match="does not exist"):
        upload_size(tmp_path / "nope")


def test_entrypoint_is_troupe_run_with_quoted_arguments():
    assert run_entrypoint(["grpo", "--preset", "smoke"]) == "troupe run grpo --preset smoke"
    assert run_entrypoint(["grpo", "run.name=a b"]) == "troupe run grpo 'run.name=a b'"


def test_submit_arguments_parse_for_the_cli():
    parser = add_submit_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--address", "http://h:8265", "--follow", "--", "grpo", "--preset", "smoke"])
    assert args.address == "http://h:8265" and args.follow and args.working_dir == "."
    assert args.run_args[-3:] == ["grpo", "--preset", "smoke"]
    args = parser.parse_args(["--list"])
    assert args.list and args.run_args == []


def test_submit_main_reports_an_unreachable_cluster():
    (port,) = free_ports(1)
    args = argparse.Namespace(address=f"http://127.0.0.1:{port}", list=True)
    with pytest.raises(ClusterUnreachableError):
        submit_main(args)


def test_follow_keeps_the_last_run_directory_printed_even_split_across_writes():
    import io

    from troupe.cluster.submit import _Recorder, run_dir_from_logs, where_the_run_is

    assert run_dir_from_logs("x\nrun directory: /a\nrun directory: s3://b/runs/grpo-1\nreport: ...") == (
        "s3://b/runs/grpo-1")
    assert run_dir_from_logs("no run here\n") is None
    sink = io.StringIO()
    rec = _Recorder(sink)
    for piece in ["step 1\nrun dir", "ectory: gs://bucket/runs/bpo-2", "\nreport: gs://bucket/runs/bpo-2/report.md\n"]:
        rec.write(piece)
    assert rec.run_dir == "gs://bucket/runs/bpo-2" and sink.getvalue().startswith("step 1\nrun directory")
    assert where_the_run_is(rec.run_dir, "job1").endswith("troupe fetch gs://bucket/runs/bpo-2 ./bpo-2")
    assert "shared storage" in where_the_run_is("/tmp/ray/session/runs/x", "job1")
    assert "printed no run directory" in where_the_run_is(None, "job1")
