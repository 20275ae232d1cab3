"""One process per stream: a lease beside the stream's checkpoint, and a holder that stops in time.

``<lakehouse>/checkpoints/<stream>.leases/<generation>`` holds who runs the stream (host, boot id,
PID namespace, pid, start time, a random owner id) and when it last renewed the lease; the
highest generation is the lease. A process takes the lease before it starts the stream and a
heartbeat thread renews it while the query runs. It is released once the query's micro-batch
thread has ended, not when Spark first reports the query inactive: a stopped query is inactive
at once while its batch still runs and writes (a SIGTERM during a long batch), and that batch
writes under the lease to its last line. Once released, the lease's ``check_held`` raises, so
no write of this process for the stream passes after it. Another process that finds a lease
refuses to start the stream, or to reset it, while the lease is live. A lease is not live when:

* it was not renewed for ``ttl_s`` (the holder crashed, hangs or lost storage), or
* its holder ran in this very system (same host name, boot id and PID namespace) and that pid is
  gone (or a zombie): a process killed with SIGKILL on the same machine frees its streams at
  once. A holder on a host of the same name in another boot or another PID namespace (two
  containers sharing the host's network, and so its name) is judged by its age only, since its
  pid means another process here. A record that names neither a boot id nor a PID namespace is
  judged by host name and pid.

Taking the lease, free or expired, is one exclusive create of the next generation's file
(``create`` without overwrite): of two processes that both found generation 3 expired, only one
creates generation 4; nothing is deleted first. A holder writes its own generation's file and
nothing else, and loses the lease as soon as a higher generation exists.

A holder that stood still stops by itself. It measures the age of its last successful renewal
on its own clock that counts a suspend (``clock``: ``CLOCK_BOOTTIME`` on Linux, where
``CLOCK_MONOTONIC`` stands still while the system sleeps or the VM is paused; the monotonic
clock elsewhere), from the moment that renewal began, and may write for the stream
only while that age is below ``ttl_s`` less a quarter (``SAFETY_MARGIN_SHARE``). Every batch
checks this right before it writes to a table or a sink (``check_held``), and the heartbeat stops
the query once it is past; a renewal that fails does not count. Another process can take over
only ``ttl_s`` after the last renewal by its wall clock, so a process that wakes from a pause
(GC, SIGSTOP, a frozen VM, a storage stall) after losing the stream finds it out before its next
write. What remains, said plainly: the checks run at the edges of a batch's writes; a process
frozen for longer than the margin inside one Delta commit or one sink commit, after its check,
writes that one commit late. Delta's conflict detection and the sinks' own fencing (a reset
fences the old stream id on every sink: recovery/checkpoints.py, the egresses) close that for
the writes they cover.

The directory is beside the checkpoint directory, not in it, so ``checkpoints reset`` (which
deletes the directory) never drops a live lease.

Limits, said plainly. The lease is advisory: only this pipeline's code reads it, so an operator's
own ``RESTORE``, ``DELETE`` or a hand-run job is not excluded. The exclusive create is atomic on a
local disk (a link), on HDFS and on S3, where it is a conditional upload (``If-None-Match``,
``files.create_new``); a renewal replaces the holder's own generation, which no rival writes, so it
needs no condition. On a local disk and on S3 a record is never seen half written, even when its
writer is killed or stopped mid-write (``files``); on HDFS it can be, and a record that cannot be
read is judged by its file's age and names no process. On another object store without conditional
writes, Hadoop checks and then writes, and two processes taking the same generation at the same
moment can both believe they won; each reads the lease back after writing it and at every renewal,
and the loser stops.
Host names must be unique among the machines that run the pipeline (containers that share one
are told apart by their PID namespaces), and their clocks must agree
to well within the margin (15 s at the default ``ttl_s``), since a contender judges expiry on the
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
from ..session.spark import java_class
from .checkpoints import CheckpointError

log = logging.getLogger(__name__)

# Long enough that a busy driver (a full GC, a slow object store) renews in
# time; short enough that a holder lost with its host frees the stream soon.
DEFAULT_TTL_S = 60.0
# The owner of a lease record that cannot be read: judged by its file's age, and it names no process.
UNREADABLE = "unreadable"
# A holder writes only while its last renewal is younger than ttl less this share of it: the
# margin covers the clock difference between hosts and the time a renewal takes to land.
SAFETY_MARGIN_SHARE = 0.25
# How often a held query is looked at: a stream stopped by its process frees
# its lease within this, so a restart in the same process never waits on it.
WATCH_INTERVAL_S = 0.5
# Where this process's system tells one boot and one PID namespace from another.
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
PID_NAMESPACE_PATH = "/proc/self/ns/pid"


def _clock_id() -> int | None:
    clock_id = getattr(time, "CLOCK_BOOTTIME", None)
    if clock_id is None:
        return None
    try:
        time.clock_gettime(clock_id)
    except OSError:  # a kernel without it
        return None
    return clock_id


_CLOCK_ID = _clock_id()


def clock() -> float:
    """Seconds on the clock a holder measures its lease's age on: one that counts a suspend.

    ``CLOCK_BOOTTIME`` where the system has it (Linux): it goes on while the system sleeps or its VM
    is paused, where ``CLOCK_MONOTONIC`` stands still, and a holder woken after an hour would take
    its last renewal for seconds old. Elsewhere the monotonic clock. Only differences mean anything.

    Example::

        began = clock()
        renew_the_lease()
        print(f"the renewal took {clock() - began:.1f} s, a suspend in between included")
    """
    return time.monotonic() if _CLOCK_ID is None else time.clock_gettime(_CLOCK_ID)


def _read_boot_id() -> str | None:
    try:
        with open(BOOT_ID_PATH) as boot_id:
            return boot_id.read().strip() or None
    except OSError:  # not Linux, or no /proc
        return None


def _read_pid_namespace() -> str | None:
    try:
        return os.readlink(PID_NAMESPACE_PATH)
    except OSError:
        return None


def system_identity() -> tuple[str, str | None, str | None]:
    """(host name, boot id, PID namespace) of this process: what a pid means only within.

    A pid names one process only in one boot of one system and one PID namespace: two containers
    sharing the host's network share its host name, not their pids. The boot id or the namespace
    is None where the system does not tell it (not Linux).

    Example::

        system_identity()  # ("worker-3", "cbccad9d-1bfb-...", "pid:[4026531836]")
    """
    return socket.gethostname(), _read_boot_id(), _read_pid_namespace()


class LeaseHeld(CheckpointError):
    """Another live process holds the stream's lease."""


class LeaseLost(CheckpointError):
    """This process held the stream's lease and may no longer write for the stream."""


class LeaseStatus(Enum):
    FREE = "free"
    HELD = "held"
    EXPIRED = "expired"  # not renewed within its ttl
    HOLDER_DEAD = "holder dead"  # holder ran in this system (host, boot, PID namespace) and its pid is gone


@dataclass(frozen=True)
class LeaseRecord:
    owner: str
    stream: str
    host: str
    pid: int
    started: str
    renewed_ms: int
    ttl_s: float
    # None in a record that names neither: such a holder is judged by host and pid alone.
    boot_id: str | None = None
    pid_namespace: str | None = None

    def describe(self) -> str:
        if self.owner == UNREADABLE:
            return "a process whose record cannot be read (its writer died mid-write, or it was edited)"
        return f"pid {self.pid} on host {self.host}, started {self.started}"


def lease_directory(lakehouse: Lakehouse, stream: str) -> str:
    """Where a stream's lease lives, one file per generation: beside its checkpoint directory.

    Example::

        lease_directory(Lakehouse("/data/lake"), "bronze")  # "/data/lake/checkpoints/bronze.leases"
    """
    if not stream:
        raise ValueError("stream must be a stream name, e.g. 'bronze'")
    return f"{lakehouse.checkpoint(stream)}.leases"


def lease_path(lakehouse: Lakehouse, stream: str, generation: int) -> str:
    """The file of one generation of a stream's lease.

    Example::

        lease_path(Lakehouse("/data/lake"), "bronze", 3)  # "/data/lake/checkpoints/bronze.leases/0000000003"
    """
    if not isinstance(generation, int) or generation < 1:
        raise ValueError(f"generation must be a positive int, not {generation!r}")
    return _generation_path(lease_directory(lakehouse, stream), generation)


def read_lease(spark: SparkSession, lakehouse: Lakehouse, stream: str) -> tuple[LeaseStatus, LeaseRecord | None]:
    """The stream's lease, if any, and whether it is live.

    Example::

        status, record = read_lease(spark, Lakehouse("/data/lake"), "bronze")
        if status is LeaseStatus.HELD:
            print(f"bronze runs as {record.describe()}")
    """
    _, record = _current(spark, lease_directory(lakehouse, stream))
    return _status(record), record


def check_held(lakehouse: Lakehouse, stream: str) -> None:
    """Raise LeaseLost if this process held ``stream``'s lease and may no longer write for it.

    A batch calls it right before each write to a table or sink. It raises once the lease was
    lost, and once this process released it (until it takes the lease again): no write of this
    process passes after its lease was let go. A process that never held the stream's lease (a
    test driving a writer directly) passes.

    Example::

        check_held(Lakehouse("/data/lake"), "gold")  # then MERGE the batch into gold
    """
    directory = lease_directory(lakehouse, stream)
    held = _HELD.get(directory) or _RELEASED.get(directory)
    if held is not None:
        held.check()


def check_not_lost(lakehouse: Lakehouse, stream: str) -> None:
    """Raise LeaseLost if this process's lease of ``stream`` was lost while its query ran.

    The heartbeat stops a query whose lease is lost (``Lease.guard``), and Spark reports a
    stopped query as ended, not failed: whoever awaited the query calls this to tell a stream
    that finished from one that was stopped with its work not done. A lease released after
    its query ended, or never held here, passes.

    Example::

        start_stream(spark, config, "gold", available_now=True).awaitTermination()
        check_not_lost(Lakehouse("/data/lake"), "gold")  # the run did all it had to, or raise
    """
    held = _HELD.get(lease_directory(lakehouse, stream))
    if held is not None and held.lost.is_set():
        held.check()


class Lease:
    """A lease this process holds; renew it with a heartbeat, release it when done."""

    def __init__(self, spark: SparkSession, directory: str, generation: int, record: LeaseRecord, renewed_at: float):
        self._spark = spark
        self.directory = directory
        self.generation = generation
        self.path = _generation_path(directory, generation)
        self.record = record
        self.lost = threading.Event()
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._query = None
        self._beating: threading.Thread | None = None
        # clock() when the last successful write of the lease began.
        self._renewed_at = renewed_at
        self._released_at: float | None = None

    @property
    def active(self) -> bool:
        return not self._released.is_set() and not self.lost.is_set()

    @property
    def writable_s(self) -> float:
        """How long after a renewal began this process may still write for the stream."""
        return self.record.ttl_s * (1 - SAFETY_MARGIN_SHARE)

    def age_s(self) -> float:
        """Seconds since the last successful renewal began, on this process's ``clock`` (a suspend counts)."""
        return clock() - self._renewed_at

    def check(self) -> None:
        """Raise LeaseLost unless this process may still write for the stream (see the module)."""
        if self._released.is_set():  # _released_at is set before it
            raise LeaseLost(
                Refusal.LEASE_RELEASED.message(
                    self.record.stream,
                    path=self.path,
                    ago=f"{clock() - self._released_at:.0f}",
                    stream_name=self.record.stream,
                )
            )
        age = self.age_s()
        if age >= self.writable_s and not self.lost.is_set():
            self._lose(f"not renewed for {age:.1f} s")
        if self.lost.is_set():
            raise LeaseLost(
                Refusal.LEASE_LOST.message(
                    self.record.stream,
                    path=self.path,
                    age=f"{age:.0f}",
                    limit=f"{self.writable_s:.0f}",
                    ttl=f"{self.record.ttl_s:.0f}",
                    stream_name=self.record.stream,
                )
            )

    def renew(self) -> bool:
        """Write a new renewal time; False (and ``lost`` set) once the lease is no longer this process's."""
        with self._lock:
            if not self.active:
                return False
            began = clock()
            if began - self._renewed_at >= self.writable_s:
                self._lose(f"not renewed for {began - self._renewed_at:.1f} s")
                return False
            generation, found = _current(self._spark, self.directory)
            if generation != self.generation or found is None or found.owner != self.record.owner:
                taker = "nobody (deleted)" if found is None else found.describe()
                self._lose(f"taken over by {taker} (generation {generation})")
                return False
            record = LeaseRecord(**{**asdict(self.record), "renewed_ms": _now_ms()})
            _write(self._spark, self.path, record, overwrite=True)
            self.record, self._renewed_at = record, began
            return True

    def _lose(self, why: str) -> None:
        self.lost.set()
        report_lease(self.record.stream, "none")
        log.error("lease %s: %s; this process writes nothing more for %s", self.path, why, self.record.stream)

    def release(self, wait_s: float | None = None) -> bool:
        """Delete the lease file if it is still ours, once the guarded query's batch thread has ended.

        Spark reports a stopped query inactive at once, while its batch still runs and writes: the
        lease is kept (and renewed by the heartbeat) until that thread is gone. ``wait_s`` bounds the
        wait (None: as long as the batch runs); False when it ran out and the lease is kept, to be
        released later or to expire. Idempotent; ``check`` raises from the release on.
        """
        deadline = None if wait_s is None else clock() + wait_s
        while self._query is not None and not batch_thread_ended(self._query):
            if deadline is not None and clock() >= deadline:
                return False
            time.sleep(min(WATCH_INTERVAL_S / 5, 0.1))
        with self._lock:
            if self._released.is_set():
                return True
            self._released_at = clock()
            self._released.set()
            report_lease(self.record.stream, "none")
            try:
                found = _read(self._spark, self.path)
                if found is not None and found.owner == self.record.owner:
                    files.delete(self._spark, self.path)
            except Exception:  # the JVM may be gone at interpreter exit: the lease then expires
                log.warning("lease %s: not released; it expires in %.0f s", self.path, self.record.ttl_s)
            finally:
                # Forgotten only once its file is gone: an acquire in this process that still finds
                # this lease in _HELD waits on the lock above instead of reading the file and
                # refusing the stream as held by this very process.
                if _HELD.get(self.directory) is self:
                    del _HELD[self.directory]
                    _RELEASED[self.directory] = self  # check_held raises from here on, until taken again
        return True

    def heartbeat(self, on_lost: Callable[[], None] | None = None) -> threading.Thread:
        """Renew in a daemon thread (started once) until the lease is released or lost.

        Start it right after ``acquire``: the time a stream takes to start counts against the
        lease like any other. Once ``guard`` attached a query, the thread releases the lease when
        the query's batch thread has ended (not when Spark first reports it inactive) and stops the
        query when the lease is lost.
        """
        with self._lock:
            if self._beating is not None:
                return self._beating

            def beat() -> None:
                interval = self.record.ttl_s / 6
                next_renewal = clock() + interval
                while self.active:
                    query = self._query
                    # Not at the first sight of an inactive query: a stopped query's batch still runs.
                    if query is not None and batch_thread_ended(query):
                        self.release()
                        return
                    if clock() >= next_renewal or self.age_s() >= self.writable_s:
                        try:
                            renewed = self.renew()
                        except Exception:  # storage hiccup: try again soon; the margin covers several misses
                            log.warning("lease %s: renewal failed, retrying", self.path, exc_info=True)
                            renewed = self.age_s() < self.writable_s
                            if not renewed:
                                self._lose(f"no renewal succeeded for {self.age_s():.1f} s")
                        if not renewed:
                            if self._query is not None:
                                self._query.stop()
                            if on_lost is not None:
                                on_lost()
                            return
                        next_renewal = clock() + interval
                    self._released.wait(min(WATCH_INTERVAL_S, interval))

            self._beating = threading.Thread(target=beat, name=f"lease-{self.record.stream}", daemon=True)
            self._beating.start()
            return self._beating

    def guard(self, query) -> None:
        """Hold the lease for as long as ``query``'s batch thread runs; stop the query if the lease is lost."""
        self._query = query
        self.heartbeat()


def acquire(
    spark: SparkSession, lakehouse: Lakehouse, stream: str, ttl_s: float = DEFAULT_TTL_S, way_out: str = ""
) -> Lease:
    """Take the stream's lease or raise LeaseHeld naming its holder.

    ``way_out`` is appended to the refusal (what the caller suggests doing).

    Example::

        lease = acquire(spark, Lakehouse("/data/lake"), "bronze")
        lease.heartbeat()  # renewed from now on
        query = start_the_stream()
        lease.guard(query)  # released when the query stops; the query stopped if the lease is lost
    """
    if ttl_s <= 0:
        raise ValueError(f"ttl_s must be positive, not {ttl_s}")
    directory = lease_directory(lakehouse, stream)
    mine = _HELD.get(directory)
    if mine is not None:
        if mine._query is None or not mine._query.isActive:
            # This process ran the stream and it ended (or never started): the watcher has not
            # released yet, so do it now rather than refuse ourselves, once its batch has ended.
            mine.release()
        else:
            raise LeaseHeld(Refusal.LEASE_OWN.message(stream, then=way_out, path=mine.path))
    began = clock()
    generation, found = _current(spark, directory)
    status = _status(found)
    if status is LeaseStatus.HELD:
        raise LeaseHeld(_held_message(stream, _generation_path(directory, generation), found, way_out))
    if found is not None:
        log.warning("%s: taking over a lease that is %s (%s)", stream, status.value, found.describe())
    host, boot_id, pid_namespace = system_identity()
    record = LeaseRecord(
        owner=str(uuid.uuid4()),
        stream=stream,
        host=host,
        pid=os.getpid(),
        started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        renewed_ms=_now_ms(),
        ttl_s=float(ttl_s),
        boot_id=boot_id,
        pid_namespace=pid_namespace,
    )
    taken = (generation or 0) + 1
    path = _generation_path(directory, taken)
    if not _write(spark, path, record, overwrite=False):
        raise LeaseHeld(Refusal.LEASE_RACE.message(stream, then=way_out, path=path))
    # Read back: on an object store without conditional writes a racing process may have written after us.
    generation, found = _current(spark, directory)
    if generation != taken or found is None or found.owner != record.owner:
        raise LeaseHeld(Refusal.LEASE_RACE.message(stream, then=way_out, path=path))
    lease = Lease(spark, directory, taken, record, renewed_at=began)
    for older in _generations(spark, directory):
        if older < taken:
            files.delete(spark, _generation_path(directory, older))
    report_lease(stream, record.describe())
    _RELEASED.pop(directory, None)
    _HELD[directory] = lease
    _release_at_exit()
    return lease


@contextmanager
def holding(
    spark: SparkSession, lakehouse: Lakehouse, streams: list[str], way_out: str = "", ttl_s: float = DEFAULT_TTL_S
) -> Iterator[list[Lease]]:
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
            leases.append(acquire(spark, lakehouse, stream, ttl_s=ttl_s, way_out=way_out))
            leases[-1].heartbeat()
        yield leases
    finally:
        for lease in leases:
            lease.release()


def _held_message(stream: str, path: str, found: LeaseRecord | None, way_out: str) -> str:
    if found is None:
        return Refusal.LEASE_RACE.message(stream, then=way_out, path=path)
    # Never `kill -TERM -1` (every process the user may signal) for a record that names no pid.
    unknown = found.owner == UNREADABLE
    return Refusal.LEASE_HELD.message(
        stream,
        then=way_out,
        path=path,
        holder=found.describe(),
        age=f"{(_now_ms() - found.renewed_ms) / 1000:.0f}",
        pid="<pid>" if unknown else found.pid,
        host="<the host running it>" if unknown else found.host,
        expires=time.strftime("%H:%M:%S", time.localtime(found.renewed_ms / 1000 + found.ttl_s)),
        ttl=f"{found.ttl_s:.0f}",
    )


def batch_thread_ended(query) -> bool:
    """Whether ``query`` has ended and its micro-batch thread with it: only then has its last batch
    stopped writing. Spark reports a stopped query inactive at once, while its batch still runs.

    Example::

        query.stop()  # from another thread, during a long batch
        query.isActive, batch_thread_ended(query)  # (False, False) until the batch returns
    """
    try:
        if query.isActive:
            return False
        return not query._jsq.streamingQuery().queryExecutionThread().isAlive()
    except Exception:  # the JVM is gone (at interpreter exit): no batch of it runs
        return True


def _same_system(record: LeaseRecord) -> bool:
    """Whether ``record``'s pid names a process of this system: same host, boot and PID namespace. A record
    that names no boot id or namespace is judged by its host alone."""
    host, boot_id, pid_namespace = system_identity()
    if record.host != host:
        return False
    return all(
        theirs is None or theirs == mine
        for theirs, mine in ((record.boot_id, boot_id), (record.pid_namespace, pid_namespace))
    )


def _status(record: LeaseRecord | None) -> LeaseStatus:
    if record is None:
        return LeaseStatus.FREE
    if _same_system(record) and not _pid_alive(record.pid):
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
# The last lease of each directory this process released and has not taken again: check_held raises.
_RELEASED: dict[str, Lease] = {}
# At interpreter exit, how long a lease waits for its query's batch thread before it is left to expire.
EXIT_WAIT_S = 10.0


def _release_all() -> None:
    for lease in list(_HELD.values()):
        if not lease.release(wait_s=EXIT_WAIT_S):
            log.warning("lease %s: its batch still runs at exit; it expires in %.0f s", lease.path, lease.record.ttl_s)


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


def _generation_path(directory: str, generation: int | None) -> str:
    return f"{directory}/{generation or 0:010d}"


def _generations(spark: SparkSession, directory: str) -> list[int]:
    return sorted(int(name) for name in files.list_names(spark, directory) if name.isdigit())


def _current(spark: SparkSession, directory: str) -> tuple[int | None, LeaseRecord | None]:
    """(highest generation, its record) of a lease directory; (None, None) when it holds none."""
    generations = _generations(spark, directory)
    if not generations:
        return None, None
    return generations[-1], _read(spark, _generation_path(directory, generations[-1]))


def _read(spark: SparkSession, path: str) -> LeaseRecord | None:
    fs, jvm_path = files.filesystem(spark, path)
    for _ in range(5):
        if not fs.exists(jvm_path):
            return None
        try:
            stream = fs.open(jvm_path)
            try:
                text = java_class(spark, "org.apache.commons.io.IOUtils").toString(stream, "UTF-8")
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
    return LeaseRecord(UNREADABLE, "?", "?", -1, "?", modified, DEFAULT_TTL_S)


def _write(spark: SparkSession, path: str, record: LeaseRecord, overwrite: bool) -> bool:
    """Renew (``overwrite``: only the holder writes its own generation) or create a new generation."""
    text = json.dumps(asdict(record))
    if overwrite:
        files.write_text(spark, path, text, overwrite=True)
        return True
    return files.create_new(spark, path, text)
