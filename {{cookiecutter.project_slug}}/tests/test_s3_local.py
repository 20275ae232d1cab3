"""The local S3 server (SeaweedFS) itself: real servers in tmp dirs and signed requests, no mocks."""

from __future__ import annotations

import argparse
import json
import re
import stat
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from {{ cookiecutter.package_name }}.cli import s3_local as s3_cli
from {{ cookiecutter.package_name }}.cli.exit_codes import ExitCode
from {{ cookiecutter.package_name }}.devtools.s3_local import (
    BUCKET,
    PORT_NAMES,
    LocalS3,
    running_endpoint,
)
from {{ cookiecutter.package_name }}.pipeline.config import load_config
from {{ cookiecutter.package_name }}.pipeline.session.s3 import read_credentials_file, s3_request

# One worker runs this file (make test uses two): its module server starts once.
pytestmark = pytest.mark.xdist_group("s3_local")


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3]:
    server = LocalS3(tmp_path_factory.mktemp("s3"))
    server.start()
    yield server
    # weed takes 15 s to exit on SIGTERM (its filer waits for its own metadata subscriptions); that
    # path is waited for once, in test_two_homes_run_at_once_and_stop_stops_one. A throwaway home is
    # killed after a second.
    server.stop(timeout=1)


@pytest.fixture
def endpoint(s3: LocalS3) -> str:
    return s3.start()  # at once when running; a test before may have stopped it


@pytest.fixture
def credentials(s3: LocalS3) -> tuple[str, str]:
    return read_credentials_file(s3.credentials_file)


def object_url(endpoint: str, key: str = "") -> str:
    return f"{endpoint}/{BUCKET}/{key}"


def test_start_makes_the_bucket_and_owner_only_credentials(s3: LocalS3, endpoint: str, credentials) -> None:
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", endpoint)
    for secret in (s3.credentials_file, s3.home / "s3.json"):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert s3.credentials_file.read_text().startswith("[default]\naws_access_key_id = ")

    assert s3_request("HEAD", f"{endpoint}/{BUCKET}", credentials)[0] == 200
    assert s3_request("PUT", object_url(endpoint, "hello.txt"), credentials, b"hi")[0] == 200
    assert s3_request("GET", object_url(endpoint, "hello.txt"), credentials)[0::2] == (200, b"hi")
    status, _, listing = s3_request("GET", f"{endpoint}/{BUCKET}?list-type=2&prefix=hello", credentials)
    assert status == 200 and b"<Key>hello.txt</Key>" in listing


def test_conditional_writes_refuse_a_lost_race_with_412(endpoint: str, credentials) -> None:
    key = object_url(endpoint, f"conditional/{uuid.uuid4().hex}.json")
    status, headers, _ = s3_request("PUT", key, credentials, b"v1", {"If-None-Match": "*"})
    assert status == 200
    first = headers["etag"]
    assert s3_request("PUT", key, credentials, b"v2", {"If-None-Match": "*"})[0] == 412

    status, headers, _ = s3_request("PUT", key, credentials, b"v2", {"If-Match": first})
    assert status == 200 and headers["etag"] != first
    assert s3_request("PUT", key, credentials, b"v3", {"If-Match": first})[0] == 412  # stale ETag
    assert s3_request("GET", key, credentials)[0::2] == (200, b"v2")


def test_a_wrong_secret_an_unknown_key_and_no_signature_are_refused(endpoint: str, credentials) -> None:
    access_key, secret_key = credentials
    for wrong in ((access_key, secret_key + "x"), ("LKHNOSUCHKEY00000000", secret_key)):
        assert s3_request("GET", f"{endpoint}/{BUCKET}?list-type=2", wrong)[0] == 403
        assert s3_request("PUT", object_url(endpoint, "intruder.txt"), wrong, b"x")[0] == 403
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{endpoint}/{BUCKET}?list-type=2", timeout=10)
    assert refused.value.code == 403


def test_start_again_returns_the_running_server(s3: LocalS3, endpoint: str) -> None:
    pid = s3.status()["pid"]
    assert s3.start() == endpoint
    assert LocalS3(s3.home).start() == endpoint  # another process's view, as a second `s3-local start`
    assert s3.status()["pid"] == pid
    assert running_endpoint(s3.home) == s3.endpoint == endpoint


def test_status_and_the_command_line_never_show_the_secret(
    s3: LocalS3, endpoint: str, credentials, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    secret_key = credentials[1]
    status = s3.status()
    assert status == {
        "pid": status["pid"],
        "endpoint": endpoint,
        "bucket": BUCKET,
        "credentials_file": str(s3.credentials_file),
        "data_dir": str(s3.home / "data"),
        "home": str(s3.home),
    }
    assert secret_key not in json.dumps(status) and secret_key not in s3.state_path.read_text()

    config = load_config("local", environ={"S3_LOCAL_HOME": str(s3.home)})
    assert s3_cli.s3_local_home(config) == s3.home
    for action in ("start", "status"):
        assert s3_cli.s3_local(config, argparse.Namespace(action=action)) == ExitCode.OK
    shown = capsys.readouterr()
    assert f"{endpoint}\ncredentials file: {s3.credentials_file}\n" in shown.out
    assert json.loads(shown.out.splitlines()[-1]) == status
    assert secret_key not in shown.out + shown.err


def test_a_killed_server_restarts_with_its_objects_ports_and_credentials(
    s3: LocalS3, endpoint: str, credentials
) -> None:
    key = object_url(endpoint, f"durable/{uuid.uuid4().hex}")
    assert s3_request("PUT", key, credentials, b"kept", {"If-None-Match": "*"})[0] == 200

    assert s3.stop(timeout=1) is True  # SIGKILL a second after SIGTERM: as good as a crash
    assert s3.status() is None and running_endpoint(s3.home) is None
    assert s3.start() == endpoint
    assert read_credentials_file(s3.credentials_file) == credentials
    assert s3_request("GET", key, credentials)[0::2] == (200, b"kept")
    assert s3_request("PUT", key, credentials, b"again", {"If-None-Match": "*"})[0] == 412


def test_two_homes_run_at_once_and_stop_stops_one(s3: LocalS3, endpoint: str, credentials, tmp_path: Path) -> None:
    other = LocalS3(tmp_path / "s3")
    try:
        other_endpoint = other.start()
        other_credentials = read_credentials_file(other.credentials_file)
        ours, theirs = s3._read_state(), other._read_state()
        assert not {ours[name] for name in PORT_NAMES} & {theirs[name] for name in PORT_NAMES}
        assert other_endpoint != endpoint and other_credentials != credentials
        assert s3_request("HEAD", f"{other_endpoint}/{BUCKET}", other_credentials)[0] == 200
        assert s3_request("HEAD", f"{other_endpoint}/{BUCKET}", credentials)[0] == 403
        pid = other.status()["pid"]

        assert other.stop() is True  # SIGTERM, and weed exits by itself
    finally:
        other.stop(timeout=1)
    assert not Path(f"/proc/{pid}").exists()
    with pytest.raises(urllib.error.URLError):
        s3_request("HEAD", f"{other_endpoint}/{BUCKET}", other_credentials)
    assert other.status() is None and other.endpoint is None and running_endpoint(other.home) is None
    assert other.stop() is False
    assert s3_request("HEAD", f"{endpoint}/{BUCKET}", credentials)[0] == 200


def test_a_start_that_times_out_leaves_nothing_running(tmp_path: Path) -> None:
    server = LocalS3(tmp_path / "s3")
    with pytest.raises(RuntimeError, match="not ready .* in time") as error:
        server.start(timeout=0.3)
    assert str(server.home / "weed.log") in str(error.value)
    assert server.status() is None
    data_dir = f"-dir={server.home / 'data'}".encode()
    assert not [cmdline for cmdline in Path("/proc").glob("[0-9]*/cmdline") if data_dir in _read(cmdline)]


def test_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="home must be a path"):
        LocalS3(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be positive"):
        LocalS3(tmp_path).start(timeout=0)
    with pytest.raises(TypeError, match="timeout must be a number"):
        LocalS3(tmp_path).stop(timeout="soon")  # type: ignore[arg-type]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # the process ended in between
        return b""
