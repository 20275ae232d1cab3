"""One process per stream: a lease file beside the stream's checkpoint.

``<lakehouse>/checkpoints/<stream>.lease`` holds who runs the stream (host, pid,
start time, a random owner id) and when it last renewed the lease. A process
takes the lease before it starts the stream and a heartbeat thread renews it
while the query runs; it is released when the query ends. Another process
that finds a lease refuses to start the stream, or to reset it, while the
lease is live. A lease is not live when:

* it was not renewed for ``ttl_s`` (the holder crashed, hangs or lost storage), or
* its holder ran on this host and that pid is gone (or a zombie): a process
  killed with SIGKILL on the same machine frees its streams at once.

The file is beside the checkpoint directory, not in it, so ``checkpoints
reset`` (which deletes the directory) never drops a live lease.

Limits, said plainly. The lease is advisory: only this pipeline's code reads
it, so an operator's own ``RESTORE``, ``DELETE`` or a hand-run job is not
excluded. Taking a free lease is "create if absent" through Hadoop's
FileSystem: exclusive on a local disk and on HDFS (``create`` without
overwrite fails if the file exists), but on object stores (S3A, ABFS, GCS)
Hadoop checks existence and then writes, so two processes starting within the
same moment can both believe they won. Each holder reads the file back after
writing it and at every renewal; a holder that finds another owner's lease
stops its stream at once, so such an overlap lasts at most one renewal
interval. Within it, both runs tag their Delta commits with the same stream
id, and Delta rejects the second commit of the same (stream id, batch id),
which bounds the damage; it does not make object stores a lock service. Host
names must be unique among the machines that run the pipeline, and clocks
must agree to well within ``ttl_s``, since freshness is judged on the
renewal time the holder wrote.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from enum import Enum

from pyspark.sql import SparkSession

from ..delta import files
from ..delta.tables import Lakehouse
from ..monitoring import report_lease
from ..refusals import Refusal
from .checkpoints import CheckpointError

log = logging.getLogger(__name__)

# Long enough that a busy driver (a full GC, a slow object store) renews in
# time; short enough that a holder lost with its host frees the stream soon.
DEFAULT_TTL_S = 60.0
# How often a held query is looked at: a stream stopped by its process frees
# its lease within this, so a restart in the same process never waits on it.
WATCH_INTERVAL_S = 0.5


class LeaseHeld(CheckpointError):
    """Another live process holds the stream's lease."""


class LeaseStatus(Enum):
    FREE = "free"
    HELD = "held"
    EXPIRED = "expired"  # not renewed within its ttl
    HOLDER_DEAD = "holder dead"  # holder was on this host and its pid is gone


@dataclass(frozen=True)
class LeaseRecord:
    owner: str
    stream: str
    host: str
    pid: int
    started: str
    renewed_ms: int
    ttl_s: float

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}, started {self.started}"


def lease_path(lakehouse: Lakehouse, stream: str) -> str:
    """Where a stream's lease lives: beside its checkpoint directory.

    Example::

        lease_path(Lakehouse("/data/lake"), "bronze")  # "/data/lake/checkpoints/bronze.lease"
    """
    if not stream:
        raise ValueError("stream must be a stream name, e.g. 'bronze'")
    return f"{lakehouse.checkpoint(stream)}.lease"


def read_lease(spark: SparkSession, lakehouse: Lakehouse, stream: str) -> tuple[LeaseStatus, LeaseRecord | None]:
    """The stream's lease, if any, and whether it is live.

    Example::

        status, record = read_lease(spark, Lakehouse("/data/lake"), "bronze")
        if status is LeaseStatus.HELD:
            print(f"bronze runs as {record.describe()}")
    """
    record = _read(spark, lease_path(lakehouse, stream))
    return _status(record), record


class Lease:
    """A lease this process holds; renew it with a heartbeat, release it when done."""

    def __init__(self, spark: SparkSession, path: str, record: LeaseRecord):
        self._spark = spark
        self.path = path
        self.record = record
        self.lost = threading.Event()
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._query = None

    @property
    def active(self) -> bool:
        return not self._released.is_set() and not self.lost.is_set()

    def renew(self) -> bool:
        """Write a new renewal time; False (and ``lost`` set) if another process owns the file now."""
        with self._lock:
            if not self.active:
                return False
            found = _read(self._spark, self.path)
            if found is None or found.owner != self.record.owner:
                self.lost.set()
                log.error(
                    "lease %s: taken over by %s; this process stops the stream",
                    self.path,
                    "nobody (deleted)" if found is None else found.describe(),
                )
                return False
            self.record = LeaseRecord(**{**asdict(self.record), "renewed_ms": _now_ms()})
            _write(self._spark, self.path, self.record, overwrite=True)
            return True

    def release(self) -> None:
        """Delete the lease file if it is still ours; idempotent."""
        with self._lock:
            if self._released.is_set():
                return
            self._released.set()
            _HELD.pop(self.path, None)
            report_lease(self.record.stream, "none")
            try:
                found = _read(self._spark, self.path)
                if found is not None and found.owner == self.record.owner:
                    files.delete(self._spark, self.path)
            except Exception:  # the JVM may be gone at interpreter exit: the lease then expires
                log.warning("lease %s: not released; it expires in %.0f s", self.path, self.record.ttl_s)

    def heartbeat(self, still_running: Callable[[], bool] | None = None, on_lost: Callable[[], None] | None = None):
        """Renew in a daemon thread until ``still_running()`` is False (then release) or the lease is lost."""

        def beat() -> None:
            interval = self.record.ttl_s / 6
            next_renewal = time.monotonic() + interval
            while self.active:
                if still_running is not None and not still_running():
                    self.release()
                    return
                if time.monotonic() >= next_renewal:
                    try:
                        renewed = self.renew()
                    except Exception:  # storage hiccup: try again; the ttl covers several misses
                        log.warning("lease %s: renewal failed, retrying", self.path, exc_info=True)
                        renewed = True
                    if not renewed:
                        if on_lost is not None:
                            on_lost()
                        return
                    next_renewal = time.monotonic() + interval
                self._released.wait(min(WATCH_INTERVAL_S, interval))

        thread = threading.Thread(target=beat, name=f"lease-{self.record.stream}", daemon=True)
        thread.start()
        return thread

    def guard(self, query) -> None:
        """Hold the lease for as long as ``query`` runs; stop the query if the lease is lost."""
        self._query = query
        self.heartbeat(still_running=lambda: query.isActive, on_lost=query.stop)


def acquire(
    spark: SparkSession, lakehouse: Lakehouse, stream: str, ttl_s: float = DEFAULT_TTL_S, way_out: str = ""
) -> Lease:
    """Take the stream's lease or raise LeaseHeld naming its holder.

    ``way_out`` is appended to the refusal (what the caller suggests doing).

    Example::

        lease = acquire(spark, Lakehouse("/data/lake"), "bronze")
        query = start_the_stream()
        lease.guard(query)  # renewed while the query runs, released when it stops
    """
    if ttl_s <= 0:
        raise ValueError(f"ttl_s must be positive, not {ttl_s}")
    path = lease_path(lakehouse, stream)
    mine = _HELD.get(path)
    if mine is not None:
        if mine._query is None or not mine._query.isActive:
            # This process ran the stream and it ended (or never started): the
            # watcher has not released yet, so do it now rather than refuse ourselves.
            mine.release()
        else:
            raise LeaseHeld(Refusal.LEASE_OWN.message(stream, then=way_out, path=path))
    found = _read(spark, path)
    status = _status(found)
    if status is LeaseStatus.HELD:
        raise LeaseHeld(_held_message(stream, path, found, way_out))
    if found is not None:
        log.warning("%s: taking over a lease that is %s (%s)", stream, status.value, found.describe())
        files.delete(spark, path)
    record = LeaseRecord(
        owner=str(uuid.uuid4()),
        stream=stream,
        host=socket.gethostname(),
        pid=os.getpid(),
        started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        renewed_ms=_now_ms(),
        ttl_s=float(ttl_s),
    )
    if not _write(spark, path, record, overwrite=False):
        found = _read(spark, path)
        raise LeaseHeld(_held_message(stream, path, found, way_out))
    # Read back: on an object store a racing process may have written after us.
    found = _read(spark, path)
    if found is None or found.owner != record.owner:
        raise LeaseHeld(_held_message(stream, path, found, way_out))
    lease = Lease(spark, path, record)
    report_lease(stream, record.describe())
    _HELD[path] = lease
    _release_at_exit()
    return lease


@contextmanager
def holding(spark: SparkSession, lakehouse: Lakehouse, streams: list[str], way_out: str = "") -> Iterator[list[Lease]]:
    """Hold the leases of ``streams`` (renewed) for the duration of a block, e.g. a reset.

    Example::

        with holding(spark, Lakehouse("/data/lake"), ["silver", "gold"]):
            ...  # no other process starts silver or gold meanwhile
    """
    if not streams:
        raise ValueError("streams must name at least one stream")
    leases: list[Lease] = []
    try:
        for stream in streams:
            leases.append(acquire(spark, lakehouse, stream, way_out=way_out))
            leases[-1].heartbeat()
        yield leases
    finally:
        for lease in leases:
            lease.release()


def _held_message(stream: str, path: str, found: LeaseRecord | None, way_out: str) -> str:
    if found is None:
        return Refusal.LEASE_RACE.message(stream, then=way_out, path=path)
    return Refusal.LEASE_HELD.message(
        stream,
        then=way_out,
        path=path,
        holder=found.describe(),
        age=f"{(_now_ms() - found.renewed_ms) / 1000:.0f}",
        pid=found.pid,
        host=found.host,
        expires=time.strftime("%H:%M:%S", time.localtime(found.renewed_ms / 1000 + found.ttl_s)),
        ttl=f"{found.ttl_s:.0f}",
    )


def _status(record: LeaseRecord | None) -> LeaseStatus:
    if record is None:
        return LeaseStatus.FREE
    if record.host == socket.gethostname() and not _pid_alive(record.pid):
        return LeaseStatus.HOLDER_DEAD
    if _now_ms() - record.renewed_ms > record.ttl_s * 1000:
        return LeaseStatus.EXPIRED
    return LeaseStatus.HELD


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A killed child not yet reaped by its parent still answers signal 0.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _now_ms() -> int:
    return int(time.time() * 1000)


# Leases this process holds, so a stream restarted in the same process is not
# refused by its own previous run.
_HELD: dict[str, Lease] = {}


def _release_all() -> None:
    for lease in list(_HELD.values()):
        lease.release()


_exit_hook = threading.Lock()
_exit_hook_registered = False


def _release_at_exit() -> None:
    # Registered on the first acquire, after Spark started: exit hooks run last
    # registered first, so the leases go while the JVM that writes them still runs.
    global _exit_hook_registered
    with _exit_hook:
        if not _exit_hook_registered:
            atexit.register(_release_all)
            _exit_hook_registered = True


def _read(spark: SparkSession, path: str) -> LeaseRecord | None:
    fs, jvm_path = files.filesystem(spark, path)
    for _ in range(5):
        if not fs.exists(jvm_path):
            return None
        try:
            stream = fs.open(jvm_path)
            try:
                text = spark._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
            finally:
                stream.close()
            return LeaseRecord(**json.loads(text))
        except Exception:  # caught mid-renewal (rewritten in place) or deleted meanwhile
            time.sleep(0.1)
    # Unreadable for half a second: a writer died mid-write. Judge it by its age.
    try:
        modified = fs.getFileStatus(jvm_path).getModificationTime()
    except Exception:
        return None
    return LeaseRecord("unreadable", "?", "?", -1, "?", modified, DEFAULT_TTL_S)


def _write(spark: SparkSession, path: str, record: LeaseRecord, overwrite: bool) -> bool:
    fs, jvm_path = files.filesystem(spark, path)
    try:
        stream = fs.create(jvm_path, overwrite)
    except Exception as error:
        if "FileAlreadyExistsException" in str(error):
            return False
        raise
    try:
        stream.write(bytearray(json.dumps(asdict(record)).encode("utf-8")))
    finally:
        stream.close()
    return True
