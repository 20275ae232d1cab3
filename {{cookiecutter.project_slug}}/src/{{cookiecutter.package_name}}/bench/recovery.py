"""Recovery: draining a backlog killed part-way and restarted, against draining it undisturbed.

With the default sizes each drain is the project's own `run --layer all --available-now` in a
new process, SIGKILLed (driver and JVM together) part-way and run again. With the quick sizes
the streams run in this driver and the running query is stopped (warm JVM); one process is still
started, on a drained lakehouse, to time a start.

A process is observed through its log only, each line timestamped when it appears: the
`[<layer>] started (id ...)` line of each stream, its batch lines, and `[stream <id>] stopped`.
A drain is timed from its first stream start to the end of its last stream, so the process,
JVM and SparkSession start (jvm_start_s) is left out of every drain alike.

The kill is placed after one of these events ("silver started", "bronze ended", ...): the last
one the undisturbed drain had seen at ``kill_fraction`` of its time, and as long after it.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path

from ..devtools.chaos import pending_batches, pipeline_command
from ..pipeline.config import Config
from ..pipeline.delta.tables import LAYERS, Lakehouse, ensure_tables
from ..pipeline.kafka.clients import bootstrap_servers
from ..pipeline.streams import start_stream
from .harness import Bench, await_query, on_cpus, say

STARTED = re.compile(r"\[(\w+)\] started \(id ([0-9a-f-]+)\)")
BATCH = re.compile(r"\[(\w+)\] batch \d+: (\d+) rows")
ENDED = re.compile(r"\[stream ([0-9a-f-]+)\] (stopped|failed)")
EDGES = ("started", "ended")
# What a kill is placed after: "<layer> started" or "<layer> ended".
ANCHORS = tuple(f"{layer} {edge}" for layer in LAYERS for edge in EDGES)
POLL_S = 0.05
ATTEMPTS = 3


def _check_kill_at(kill_at: tuple[str, float] | None) -> None:
    if kill_at is not None and (kill_at[0] not in ANCHORS or kill_at[1] < 0):
        raise ValueError(f"kill_at must be (one of {ANCHORS}, seconds >= 0), got {kill_at!r}")


def _spans(events: dict[str, float], began: float, end: float) -> dict[str, list[float]]:
    """Each started layer's [start, end] in seconds from ``began``; a layer still running ends at ``end``."""
    return {
        layer: [events[f"{layer} started"] - began, events.get(f"{layer} ended", end) - began]
        for layer in LAYERS
        if f"{layer} started" in events
    }


class ChildLog:
    """Follows a pipeline process's log file: when each stream started and ended, its batches."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._offset = 0
        self._partial = b""
        self._layer_of: dict[str, str] = {}
        self.events: dict[str, float] = {}  # "<layer> <edge>" -> time.monotonic() when its line appeared
        self.failed: list[str] = []
        self.batches: Counter[str] = Counter()

    def poll(self) -> None:
        with self.path.open("rb") as log:
            log.seek(self._offset)
            data = log.read()
        self._offset += len(data)
        now = time.monotonic()
        *lines, self._partial = (self._partial + data).split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace")
            if match := STARTED.match(line):
                self._layer_of[match[2]] = match[1]
                self.events.setdefault(f"{match[1]} started", now)
            elif match := BATCH.match(line):
                if int(match[2]) > 0:
                    self.batches[match[1]] += 1
            elif (match := ENDED.match(line)) and match[1] in self._layer_of:
                self.events.setdefault(f"{self._layer_of[match[1]]} ended", now)
                if match[2] == "failed":
                    self.failed.append(line)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def child_env(config: Config) -> dict[str, str]:
    """The environment that points `run` at ``config``'s broker, topic, lakehouse and batch size."""
    if len(config.kafka.topics) != 1:
        raise ValueError(f"a bench drain reads one topic, not {config.kafka.topics}")
    # A crash point armed by the caller would stop every drain at the same place.
    inherited = {key: value for key, value in os.environ.items() if key != "PIPELINE_CRASH_POINT"}
    return {
        **inherited,
        "PIPELINE_ENV": config.env,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers(config),
        "KAFKA_TOPICS": config.kafka.topics[0],
        "LAKEHOUSE_ROOT": config.lakehouse_root,
        "KAFKA_MAX_OFFSETS_PER_TRIGGER": str(config.kafka.max_offsets_per_trigger),
        "PIPELINE_TRIGGER_INTERVAL": config.trigger_interval,
        "SPARK_MASTER": config.spark_master,
        # The bench measures the three layers (phase_config turns the egresses off): its drains must not
        # start the egress streams a default bake turns on, whose sinks (a local PostgreSQL) it never starts.
        "PIPELINE_EGRESS": "none",
        # It measures the first dataset: a bake's second dataset, whose topics the bench never fills, stays off.
        "PIPELINE_DATASETS": "none",
    }


def drain_process(
    bench: Bench, config: Config, kill_at: tuple[str, float] | None = None, cpus: str | None = None
) -> dict:
    """`run --layer all --available-now` in a new process; ``kill_at`` = (anchor, seconds): SIGKILL its
    process group that long after the anchor event (see ANCHORS), whichever layer then runs; ``cpus``:
    the process runs on those CPUs alone (``harness.on_cpus``)."""
    _check_kill_at(kill_at)
    log_path = bench.work / f"drain-{uuid.uuid4().hex[:8]}.log"
    with log_path.open("wb") as log:
        launched = time.monotonic()
        launched_at = time.time()
        process = subprocess.Popen(
            on_cpus(pipeline_command("run", "--layer", "all", "--available-now"), cpus),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env(config),
            start_new_session=True,
        )
    child = ChildLog(log_path)
    killed_at = exited_at = None
    try:
        while process.poll() is None:
            child.poll()
            now = time.monotonic()
            if kill_at is not None and kill_at[0] in child.events and now >= child.events[kill_at[0]] + kill_at[1]:
                killed_at = now
                os.killpg(process.pid, signal.SIGKILL)  # the driver and its JVM, without warning
                break
            if now > launched + bench.sizes.timeout_s:
                raise RuntimeError(f"the drain process did not finish within {bench.sizes.timeout_s:.0f} s")
            time.sleep(POLL_S)
        exited_at = time.monotonic()
    finally:
        if process.poll() is None and killed_at is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    child.poll()
    events = child.events
    first = f"{LAYERS[0]} started"
    if first not in events:
        raise RuntimeError(f"the drain process started no stream (exit {process.returncode}):\n{child.tail()}")
    if killed_at is None and (process.returncode != 0 or child.failed):
        raise RuntimeError(f"the drain process failed (exit {process.returncode}):\n{child.tail()}")
    began = events[first]
    end = killed_at if killed_at is not None else events.get(f"{LAYERS[-1]} ended", exited_at)
    spans = _spans(events, began, end)
    return {
        "start_s": began - launched,
        "drain_s": end - began,
        # The whole process, from its launch to its exit (None when it was killed), and its launch in wall-clock
        # seconds: tables' Delta commit timestamps are measured from it.
        "exit_s": exited_at - launched if killed_at is None else None,
        "launched_at": launched_at,
        "log": str(log_path),
        "finished": killed_at is None,
        "killed": killed_at is not None,
        "killed_in": next((layer for layer in spans if f"{layer} ended" not in events), None),
        "layer_spans": spans,
        "batches": dict(child.batches),
    }


def drain_in_process(bench: Bench, config: Config, kill_at: tuple[str, float] | None = None) -> dict:
    """Every layer availableNow in this driver; ``kill_at`` (as for drain_process) stops the running query."""
    _check_kill_at(kill_at)
    began = time.monotonic()
    events: dict[str, float] = {}
    deadline = None
    killed_in = None
    for layer in LAYERS:
        deadline = _mark(events, f"{layer} started", kill_at) or deadline
        query = start_stream(bench.spark, config, layer, available_now=True)
        if deadline is None:
            await_query(query, bench.sizes.timeout_s)
        # PySpark refuses a timeout of zero: a deadline already passed waits one millisecond.
        elif not query.awaitTermination(max(0.001, deadline - time.monotonic())):
            query.stop()  # mid-batch: its offsets are logged, its commit is not
            killed_in = layer
            break
        elif query.exception() is not None:
            raise RuntimeError(f"stream {layer} failed: {query.exception()}")
        deadline = _mark(events, f"{layer} ended", kill_at) or deadline
    end = time.monotonic()
    return {
        "start_s": 0.0,
        "drain_s": end - began,
        "finished": killed_in is None,
        "killed": killed_in is not None,
        "killed_in": killed_in,
        "layer_spans": _spans(events, began, end),
    }


def _mark(events: dict[str, float], event: str, kill_at: tuple[str, float] | None) -> float | None:
    """Record ``event`` now; returns the kill deadline when ``event`` is the kill's anchor."""
    events[event] = now = time.monotonic()
    return now + kill_at[1] if kill_at is not None and kill_at[0] == event else None


def kill_point(undisturbed: dict, fraction: float) -> tuple[str, float]:
    """Where the undisturbed drain was at ``fraction`` of its time: the last event (see ANCHORS) it
    had seen, and how long after it.

    Counted from an event rather than from the start, the kill lands at the same point of the
    work even when the killed run is faster or slower overall (a shared machine).
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be between 0 and 1, got {fraction}")
    moment = fraction * undisturbed["drain_s"]
    seen = [
        (f"{layer} {edge}", at)
        for layer, span in undisturbed["layer_spans"].items()
        for edge, at in zip(EDGES, span, strict=True)
        if at <= moment
    ]
    anchor, at = seen[-1]
    return anchor, moment - at


def measure(bench: Bench, topic: str) -> None:
    sizes = bench.sizes
    in_process = sizes.recovery_in_process

    def drain(root: Path, kill_at: tuple[str, float] | None = None) -> dict:
        config = bench.phase_config(root, topic)
        if in_process:
            return drain_in_process(bench, config, kill_at)
        # Tables first, so every process starts on existing tables and its start times compare.
        ensure_tables(bench.spark, Lakehouse(config.lakehouse_root))
        return drain_process(bench, config, kill_at)

    undisturbed_root = bench.work / "recovery-undisturbed"
    say(f"recovery: draining {sizes.records:,} records {'in this process' if in_process else 'in a new process'}")
    undisturbed = drain(undisturbed_root)
    anchor, after = kill_point(undisturbed, sizes.kill_fraction)
    attempts = []
    for attempt in range(ATTEMPTS):
        killed_root = bench.work / f"recovery-killed-{attempt}"
        how = "stopped" if in_process else "SIGKILLed"
        say(f"recovery: the same drain, {how} {after:.1f} s after {anchor}, then restarted")
        first = drain(killed_root, kill_at=(anchor, after))
        attempts.append(first)
        if first["killed"]:
            break
        after /= 2  # it finished first: this run was faster than the undisturbed one
    else:
        raise RuntimeError(f"recovery: all {ATTEMPTS} drains finished before the kill")
    pending = pending_batches(bench.spark, str(killed_root / "checkpoints"))
    second = drain(killed_root)
    drained = first["drain_s"] + second["drain_s"]
    if in_process:
        say("recovery: timing a process start on the drained lakehouse")
        starts = [drain_process(bench, bench.phase_config(undisturbed_root, topic))["start_s"]]
    else:
        starts = [undisturbed["start_s"], first["start_s"], second["start_s"]]
    rows = {
        "undisturbed": bench.table_rows(bench.phase_config(undisturbed_root, topic)),
        "killed_and_restarted": bench.table_rows(bench.phase_config(killed_root, topic)),
    }
    if rows["undisturbed"] != rows["killed_and_restarted"]:
        say(f"recovery: the killed and restarted drain left other rows than the undisturbed one: {rows}")
    bench.add("jvm_start_s", "process + JVM start, to the first stream (median)", statistics.median(starts), "s")
    bench.add("drain_undisturbed_s", "drain, undisturbed (without start)", undisturbed["drain_s"], "s")
    bench.add("drain_killed_s", "drain killed + restarted (without starts)", drained, "s")
    bench.add("recovery_cost", "killed / undisturbed drain", drained / undisturbed["drain_s"], "ratio")
    bench.details["recovery"] = {
        "mode": "in-process query.stop()" if in_process else "SIGKILL of a separate process",
        "records": sizes.records,
        "kill_point": {"after": anchor, "seconds": after},
        "undisturbed": undisturbed,
        "killed_run": first,
        "attempts_finished_before_kill": len(attempts) - 1,
        "restarted_run": second,
        "batches_pending_after_kill": pending,
        "process_starts_s": starts,
        "table_rows": rows,
    }
