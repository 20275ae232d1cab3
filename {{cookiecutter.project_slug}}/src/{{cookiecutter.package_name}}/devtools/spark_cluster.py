"""A Spark standalone cluster on this machine: one master and one worker from the pyspark install.

The same deployment users move to when one process is not enough: the driver
(`run` with SPARK_MASTER=spark://...) schedules tasks on executor JVMs that the
worker launches, and a lost executor is replaced while the query keeps running.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).resolve().parent
EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for_port(port: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.2)
    return False


class StandaloneCluster:
    def __init__(self, home: Path, worker_cores: int = 2, worker_memory: str = "2g"):
        self.home = Path(home)
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.processes: list[subprocess.Popen] = []
        self.master_url: str | None = None

    def env(self) -> dict[str, str]:
        return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1"}

    def _launch(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.home / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        process = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes.append(process)
        return process

    def start(self, timeout: float = 90.0) -> str:
        self.home.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        deadline = time.monotonic() + timeout
        self._launch(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(_free_port())),
        )
        if not _wait_for_port(port, deadline):
            self.stop()
            raise RuntimeError(f"Spark master did not listen on {port}: see {self.home / 'master.log'}")
        self.master_url = f"spark://127.0.0.1:{port}"
        self._launch(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            self.master_url,
            *("--cores", str(self.worker_cores), "--memory", self.worker_memory),
            *("--webui-port", str(_free_port()), "--work-dir", str(self.home / "work")),
        )
        master_log = self.home / "master.log"
        while time.monotonic() < deadline:
            if "Registering worker" in master_log.read_text(errors="replace"):
                return self.master_url
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"no worker registered with {self.master_url}: see {self.home}")

    def executor_pids(self) -> list[int]:
        """Executor JVMs this cluster's worker launched (they run in its work directory)."""
        pids = []
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                is_executor = EXECUTOR_MAIN.encode() in (proc / "cmdline").read_bytes().split(b"\0")
                in_our_work_dir = os.readlink(proc / "cwd").startswith(str(self.home))
            except OSError:
                continue
            if is_executor and in_our_work_dir:
                pids.append(int(proc.name))
        return pids

    def kill_executor(self) -> int | None:
        pids = self.executor_pids()
        if pids:
            os.kill(pids[0], signal.SIGKILL)
        return pids[0] if pids else None

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        self.processes.clear()
        self.master_url = None
