"""Run a real single-node Apache Kafka broker (KRaft, combined broker+controller) as a plain JVM.

Jars come from Maven Central via the Ivy jar that pyspark ships: no Docker, no Kafka install.

    <console script> kafka-local start    # prints the bootstrap address
    <console script> kafka-local start --secure   # adds a SASL_SSL and a mutual-TLS listener
    <console script> kafka-local status   # exit code 1 when not running
    <console script> kafka-local stop
"""

from __future__ import annotations

import base64
import importlib.util
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from . import kafka_secure
from .server_state import StateFile, cmdline_has, log_tail_since, tail, terminate

KAFKA_VERSION = "4.4.0"
SCALA_BINARY_VERSION = "2.13"
# Kafka 4 logs through slf4j 1.7 -> Log4j 2: the kafka-server pom brings log4j-api and log4j-core
# (its LoggingController drives Log4j 2 directly), but not the slf4j binding its own distribution
# ships, so add exactly that one, at the Log4j 2 version Kafka declares.
LOG4J2_VERSION = "2.25.5"

_JVM_OPTS = ["-Xms256m", "-Xmx512m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true"]
_LOG4J2_PROPERTIES = """\
status = warn
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""
_IVY_XML = """\
<ivy-module version="2.0">
  <info organisation="local" module="lakehouse-kafka-broker"/>
  <configurations><conf name="default"/></configurations>
  <dependencies>
    <dependency org="org.apache.kafka" name="kafka_{scala}" rev="{kafka}" conf="default->default"/>
    <dependency org="org.apache.logging.log4j" name="log4j-slf4j-impl" rev="{log4j2}" conf="default->default"/>
  </dependencies>
</ivy-module>
"""


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("java not found: install a JDK (17+) or set JAVA_HOME")
    return java


def _ivy_jar() -> Path:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise RuntimeError("pyspark is not installed; its bundled Ivy jar resolves the Kafka jars")
    jars = sorted((Path(spec.origin).parent / "jars").glob("ivy-*.jar"))
    if not jars:
        raise RuntimeError(f"no ivy-*.jar in {Path(spec.origin).parent / 'jars'}")
    return jars[-1]


def resolve_broker_jars(cache_dir: Path | None = None) -> list[Path]:
    """Return the broker classpath, downloading it from Maven Central on first use only."""
    base = cache_dir or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = Path(base) / "lakehouse-kafka"
    dist = root / f"kafka_{SCALA_BINARY_VERSION}-{KAFKA_VERSION}"
    libs = dist / "libs"
    # The marker is written last and lists the jars, so an interrupted retrieve is redone.
    marker = dist / "libs.complete"
    if marker.exists():
        jars = [libs / name for name in marker.read_text().split()]
        if jars and all(jar.exists() for jar in jars):
            return jars
        marker.unlink()

    dist.mkdir(parents=True, exist_ok=True)
    ivy_xml = dist / "ivy.xml"
    ivy_xml.write_text(_IVY_XML.format(scala=SCALA_BINARY_VERSION, kafka=KAFKA_VERSION, log4j2=LOG4J2_VERSION))
    cmd = [
        _java(),
        "-jar",
        str(_ivy_jar()),
        "-cache",
        str(root / "ivy-cache"),
        "-ivy",
        str(ivy_xml),
        "-confs",
        "default",
        # Several Kafka deps (snappy-java, scala-logging, dropwizard metrics) are OSGi "bundle"s.
        "-types",
        "jar",
        "bundle",
        # -sync removes leftovers of an earlier, interrupted retrieve.
        "-sync",
        "-retrieve",
        str(libs) + "/[artifact]-[revision](-[classifier]).[ext]",
    ]
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    (dist / "ivy.log").write_text(result.stdout)
    jars = sorted(libs.glob("*.jar")) if libs.is_dir() else []
    if result.returncode != 0 or not (libs / f"kafka_{SCALA_BINARY_VERSION}-{KAFKA_VERSION}.jar").exists():
        raise RuntimeError(
            f"Ivy could not resolve Kafka {KAFKA_VERSION} (exit {result.returncode}):\n{tail(result.stdout)}"
        )
    marker.write_text("\n".join(jar.name for jar in jars) + "\n")
    return jars


def _random_cluster_id() -> str:
    # Kafka's Uuid string form: unpadded base64url of 16 random bytes. A leading '-' would be
    # taken for an option by StorageTool's argument parser, so draw again (as Kafka does).
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        # The JVM binds with SO_REUSEADDR, so TIME_WAIT leftovers of our last run don't block it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def pick_ports(previous: list[int | None]) -> list[int]:
    """Reuse each previous port that is still free (None: pick one), so an address survives restarts."""
    chosen: list[int] = []
    for port in previous:
        while not port or port in chosen or not _port_is_free(port):
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
        chosen.append(port)
    return chosen


class LocalKafka:
    """A broker whose config, data, log and state all live in one `home` directory."""

    def __init__(self, home: Path):
        self.home = Path(home).resolve()
        self.config_path = self.home / "server.properties"
        self.log4j_path = self.home / "log4j2.properties"
        self.data_dir = self.home / "data"
        self.log_path = self.home / "logs" / "broker.log"
        self.state_path = self.home / "broker.json"
        self._state_file = StateFile(self.state_path)
        self.secure = kafka_secure.secure_files(self.home / "secure")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str | None:
        status = self.status()
        return status["bootstrap"] if status else None

    def status(self) -> dict | None:
        state = self._state_file.read()
        pid = state.get("pid")
        if not pid or not self._is_our_broker(pid):
            return None
        secure = {"secure": state["secure"]} if state.get("secure") else {}
        return {"pid": pid, "bootstrap": state["bootstrap"], "home": str(self.home), **secure}

    def secure_listeners(self) -> dict | None:
        """What a client of the running secure broker needs: bootstraps and file paths, no secret.

        Example::

            print(LocalKafka(Path(".kafka-local")).secure_listeners()["sasl_ssl"])
        """
        status = self.status()
        return status.get("secure") if status else None

    def start(self, timeout: float = 90.0, secure: bool = False) -> str:
        """Start (or find running) the broker; return its plaintext bootstrap address.

        With ``secure`` it also listens with SASL_SSL (PLAIN, SCRAM-SHA-256/512) and with
        TLS that requires a client certificate; see ``secure_listeners()``.

        Example::

            bootstrap = LocalKafka(Path(".kafka-local")).start(secure=True)
        """
        if not isinstance(secure, bool):
            raise TypeError(f"secure must be a bool, not {type(secure).__name__}")
        running = self.status()
        if running:
            if secure and not running.get("secure"):
                raise RuntimeError(f"the broker in {self.home} runs without --secure; stop it first")
            return running["bootstrap"]
        jars = resolve_broker_jars()
        state = self._state_file.read()
        previous = [state.get("port"), state.get("controller_port")]
        if secure:
            previous += [state.get("sasl_ssl_port"), state.get("mtls_port")]
        port, controller_port, *secure_ports = pick_ports(previous)
        bootstrap = f"127.0.0.1:{port}"

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        secure_state = None
        if secure:
            kafka_secure.create_certificates(self.secure.directory)
            secure_state = kafka_secure.client_state(self.secure, *secure_ports)
        self._write_config(port, controller_port, secure_ports)
        self.log4j_path.write_text(_LOG4J2_PROPERTIES)
        classpath = os.pathsep.join(str(jar) for jar in jars)
        jvm = [_java(), *_JVM_OPTS, f"-Dlog4j2.configurationFile={self.log4j_path.as_uri()}", "-cp", classpath]
        if not (self.data_dir / "meta.properties").exists():
            self._format_storage(jvm)

        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            log.write(f"==== starting Kafka {KAFKA_VERSION} at {time.ctime()} ====\n".encode())
            log.flush()
            # A new session detaches the broker, so it outlives a short-lived CLI and ignores its Ctrl-C.
            proc = self._proc = subprocess.Popen(
                [*jvm, "kafka.Kafka", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                start_new_session=True,
            )
        ports = dict(zip(("sasl_ssl_port", "mtls_port"), secure_ports, strict=False))  # empty unless secure
        self._state_file.write(
            pid=proc.pid,
            port=port,
            controller_port=controller_port,
            bootstrap=bootstrap,
            cluster_id=self._cluster_id(),
            secure=secure_state,
            **ports,
        )
        deadline = time.monotonic() + timeout
        self._wait_ready(proc, {"bootstrap.servers": bootstrap}, deadline, log_offset)
        if secure_state:
            try:
                login = kafka_secure.create_scram_users(bootstrap, self.secure)
            except Exception:
                self.stop()
                raise
            # The user reaches the listener through the metadata log: wait until it logs in.
            self._wait_ready(proc, {"bootstrap.servers": secure_state["sasl_ssl"], **login}, deadline, log_offset)
        return bootstrap

    def stop(self, timeout: float = 30.0) -> bool:
        state = self._state_file.read()
        pid = state.pop("pid", None)
        was_running = bool(pid) and self._is_our_broker(pid)
        if was_running:
            terminate(self._is_our_broker, pid, timeout)
        if self.state_path.exists():
            self._state_file.write(**state)
        self._proc = None
        return was_running

    def _write_config(self, port: int, controller_port: int, secure_ports: list[int]) -> None:
        listeners = {"PLAINTEXT": port}
        if secure_ports:
            listeners.update(zip(("SASL_SSL", "MTLS"), secure_ports, strict=True))
        advertised = ",".join(f"{name}://127.0.0.1:{number}" for name, number in listeners.items())
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
            "listeners": f"{advertised},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": advertised,
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,MTLS:SSL,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data_dir),
            # A single node cannot satisfy the production defaults of 3 replicas.
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "min.insync.replicas": "1",
            "default.replication.factor": "1",
            "num.partitions": "1",
            # 50 partitions per internal topic only slow down the first group and transaction here.
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.num.partitions": "1",
            # Consumers in tests should not wait 3 s for group members that never come.
            "group.initial.rebalance.delay.ms": "0",
            # A transaction open past its timeout is aborted within a second, not ten.
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
            # The log cleaner looks for compactable segments every second, not every 15 s: a
            # compacted topic (tests, the nemesis) is cleaned soon after its segment rolls.
            "log.cleaner.backoff.ms": "1000",
            # Topics are created explicitly, so a typo fails instead of silently creating one.
            "auto.create.topics.enable": "false",
        }
        if secure_ports:
            settings.update(kafka_secure.broker_settings(self.secure))
        # Owner-only: a secure broker's config holds its keystore password and the PLAIN user.
        text = "".join(f"{key}={value}\n" for key, value in settings.items())
        kafka_secure.write_owner_only(self.config_path, text.encode())

    def _format_storage(self, jvm: list[str]) -> None:
        # A static controller.quorum.voters: Kafka 4 formats it as is, and refuses --standalone
        # or --initial-controllers, which are for a dynamic quorum (controller.quorum.bootstrap.servers).
        cmd = [*jvm, "kafka.tools.StorageTool", "format", "-t", _random_cluster_id(), "-c", str(self.config_path)]
        result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        with open(self.log_path, "a") as log:
            log.write(result.stdout)
        if result.returncode != 0:
            raise RuntimeError(f"formatting {self.data_dir} failed:\n{tail(result.stdout)}")

    def _cluster_id(self) -> str | None:
        lines = (self.data_dir / "meta.properties").read_text().splitlines()
        return next((line.partition("=")[2] for line in lines if line.startswith("cluster.id=")), None)

    def _wait_ready(self, proc: subprocess.Popen[bytes], client: dict, deadline: float, log_offset: int) -> None:
        # A short reconnect backoff notices the listener quickly; log_level 0 hides the
        # "connection refused" noise librdkafka prints while the JVM is still booting.
        admin = AdminClient({**client, "reconnect.backoff.max.ms": 500, "log_level": 0})
        bootstrap = client["bootstrap.servers"]
        while proc.poll() is None:
            try:
                if admin.list_topics(timeout=1).brokers:
                    return
            except KafkaException:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"Kafka at {bootstrap} not ready in time:\n{log_tail_since(self.log_path, log_offset)}"
                )
        self.stop()
        raise RuntimeError(
            f"Kafka exited with code {proc.returncode} while starting:\n{log_tail_since(self.log_path, log_offset)}"
        )

    def _is_our_broker(self, pid: int) -> bool:
        if self._proc is not None and self._proc.pid == pid:
            return self._proc.poll() is None  # also reaps our own exited child
        # The pid may have been reused by another process since broker.json was written.
        return cmdline_has(pid, "kafka.Kafka", self.config_path)


def running_bootstrap(home: Path) -> str | None:
    return LocalKafka(home).bootstrap_servers


def partitions_with_leaders(client, topic: str, timeout_s: float = 60.0) -> list[int]:
    """The partitions of ``topic``, each with a leader, asked again while a broker that has just (re)started
    has not loaded the topic yet: until then its metadata names the topic with an error and no partitions,
    or with partitions that have no leader, and a reader taking that answer would read nothing.

    ``client`` is any confluent-kafka client (a Consumer, a Producer or an AdminClient).

    Example::

        partitions = partitions_with_leaders(consumer, "events")
    """
    if not isinstance(topic, str) or not topic:
        raise ValueError(f"topic must be a non-empty string, not {topic!r}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, not {timeout_s!r}")
    deadline = time.monotonic() + timeout_s
    while True:
        found = client.list_topics(topic, timeout=min(30.0, timeout_s)).topics.get(topic)
        partitions = {} if found is None else found.partitions
        if found is not None and found.error is None and partitions:
            if all(partition.leader >= 0 and partition.error is None for partition in partitions.values()):
                return sorted(partitions)
        if time.monotonic() > deadline:
            answer = "no metadata" if found is None else f"error {found.error}, partitions {sorted(partitions)}"
            raise RuntimeError(f"{topic}: no leader for every partition within {timeout_s:g} s ({answer})")
        time.sleep(0.5)
