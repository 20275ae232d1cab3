"""Records Kafka deleted before bronze read them: found at every bronze start, refused or recorded, never silent.

Kafka deletes a partition's oldest records by retention (time or size) or on request (DeleteRecords).
A bronze that falls further behind than that, or that was stopped for longer, needs next an offset
below the partition's first one: those records are gone. Spark's source stops on it, mid-run ("Some
data may have been lost because they are not available in Kafka any more") and at every start after;
with ``kafka.fail_on_data_loss = false`` it skips them without a word. And the audit reads Kafka as it
is now, so it cannot see records that are no longer there.

Bronze therefore compares, at every start, the next offset it needs in each partition (where the last
batch it holds ended, or where its checkpoint began before any, see ``bronze.next_offsets``; starting
without a checkpoint, after the offsets it holds; in a partition added to the topic since, 0, where
Spark reads an added partition from) with the first offset Kafka still holds:

* with ``kafka.fail_on_data_loss`` (the default) a gap is refused (``Refusal.SOURCE_RECORDS_LOST``),
  naming each partition and its offsets, with the way out ``checkpoints accept-loss``: it records the
  gaps on bronze, then starts bronze's checkpoint anew after them;
* without it, the gaps are recorded as accepted by that setting, and bronze goes on. Only the gaps
  found at a start: records deleted while bronze runs are skipped by Spark without a record (one
  more reason to keep the setting on).

The record is a file per gap beside the tables (``lost_records``, JSON): the topic, its id, the
partition, the offsets [start, end), and when and by what it was accepted. Not a property of bronze's
table: an operator who puts bronze back from an older copy, or RESTOREs it to an older version, must
not make the lakehouse forget what Kafka deleted (bronze would be refused again for the same gap, and
the audit would report fewer offsets lost than were). Created once and never rewritten, so two processes
recording the same gap need no read-modify-write. The audit reports them. Offsets, not records: in a
transactional topic some offsets are transaction markers, and the records themselves are gone, so no
one can count them.

Gaps between the offsets Kafka still holds (transaction markers, aborted records, compaction) are not
losses, and are not looked for here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from ..config import Config
from ..dataset import Dataset
from ..datasets.events import DATASET as EVENTS_DATASET
from ..delta.files import create_new, list_names, read_text
from ..delta.tables import Lakehouse
from .clients import earliest_offsets

# What accepted a gap: the operator's command, or the setting that lets Spark skip lost records.
ACCEPTED_BY_COMMAND = "checkpoints accept-loss"
ACCEPTED_BY_SETTING = "kafka.fail_on_data_loss = false"


@dataclass(frozen=True)
class Gap:
    """Offsets [start, end) of one partition of one topic incarnation that Kafka deleted before bronze read them."""

    topic: str
    topic_id: str
    partition: int
    start: int
    end: int

    def __post_init__(self):
        if self.start < 0 or self.end <= self.start:
            raise ValueError(f"a gap needs 0 <= start < end, got [{self.start}, {self.end})")

    @property
    def offsets(self) -> int:
        return self.end - self.start

    def describe(self) -> str:
        """In words, e.g. "events[0] offsets 100-149 (50)"."""
        return f"{self.topic}[{self.partition}] offsets {self.start}-{self.end - 1} ({self.offsets})"

    def file_name(self) -> str:
        """The name of its record in ``lost_records``: one per gap.

        A topic id is base64 as the Kafka client prints it, which may hold "/" and "+": in a name they
        become "_" and "-" (URL-safe base64, one to one), or a "/" would make a directory. A topic name
        holds only letters, digits, ".", "_" and "-".
        """
        topic_id = (self.topic_id or "unknown").replace("+", "-").replace("/", "_")
        return f"{self.topic}.{topic_id}.{self.partition}.{self.start}-{self.end}.json"


def needed_offsets(
    offsets_json: str | None, partitions: dict[str, list[int]] | None = None
) -> dict[tuple[str, int], int]:
    """The next offset a stream needs in each partition, from a Spark Kafka offsets JSON; "earliest" and
    "latest" (negative) name no offset and are left out.

    With ``partitions`` (each topic's partitions as Kafka reports them now), a partition of a topic in
    the JSON that the JSON leaves out was added to the topic after those offsets were written. Spark
    reads such a partition from offset 0 (a later first offset is a data loss to it), so it is needed
    from 0.

    Example::

        needed_offsets('{"events": {"0": 120, "1": -2}}')  # {("events", 0): 120}
        needed_offsets('{"events": {"0": 120}}', {"events": [0, 1]})  # {("events", 0): 120, ("events", 1): 0}
    """
    if partitions is not None and not isinstance(partitions, dict):
        raise TypeError(f"partitions must map each topic to its partitions, not {type(partitions).__name__}")
    if not offsets_json:
        return {}
    parsed = json.loads(offsets_json)
    if not isinstance(parsed, dict):
        raise ValueError(f"not a Kafka offsets JSON: {offsets_json!r}")
    needed = {
        (topic, int(partition)): int(offset)
        for topic, offsets in parsed.items()
        for partition, offset in offsets.items()
        if int(offset) >= 0
    }
    for topic, offsets in parsed.items():
        for partition in (partitions or {}).get(topic, []):
            if str(partition) not in offsets:
                needed[(topic, partition)] = 0
    return needed


def find_gaps(config: Config, needed: dict[tuple[str, int], int], topic_ids: dict[str, str]) -> list[Gap]:
    """The partitions whose next needed offset Kafka no longer holds, as gaps up to its first offset.

    ``topic_ids``: each topic's id as bronze recorded it (the incarnation the offsets belong to).

    Example::

        find_gaps(config, {("events", 0): 100}, {"events": "Xh1..."})  # [Gap("events", "Xh1...", 0, 100, 150)]
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be a pipeline Config, not {type(config).__name__}")
    if not needed:
        return []
    firsts = earliest_offsets(config, sorted({topic for topic, _ in needed}))
    return [
        Gap(topic, topic_ids.get(topic, ""), partition, offset, firsts[(topic, partition)])
        for (topic, partition), offset in sorted(needed.items())
        if firsts.get((topic, partition), 0) > offset
    ]


def lost_records(lakehouse: Lakehouse, dataset: Dataset = EVENTS_DATASET) -> str:
    """The directory where each gap accepted as lost is recorded, a file per gap (``Gap.file_name``).

    Example::

        lost_records(Lakehouse("/data/lake"))  # "/data/lake/sources/lost"
    """
    if not isinstance(lakehouse, Lakehouse):
        raise TypeError(f"lakehouse must be a Lakehouse, not {type(lakehouse).__name__}")
    return f"{lakehouse.sources(dataset)}/lost"


def recorded(spark: SparkSession, lakehouse: Lakehouse, dataset: Dataset = EVENTS_DATASET) -> list[dict]:
    """Every gap recorded, oldest first: topic, topic_id, partition, start, end, accepted_at, accepted_by.

    Example::

        recorded(spark, Lakehouse("/data/lake"))
        # [{"topic": "events", "topic_id": "Xh1...", "partition": 0, "start": 100, "end": 150, ...}]
    """
    directory = lost_records(lakehouse, dataset)
    # A hidden name is a record another process is creating (delta/files.create_new), not yet one.
    names = [name for name in list_names(spark, directory) if not name.startswith(".")]
    texts = (read_text(spark, f"{directory}/{name}") for name in names)
    entries = [json.loads(text) for text in texts if text]
    return sorted(entries, key=lambda gap: (gap["accepted_at"], gap["topic"], gap["partition"], gap["start"]))


def accepted_ends(
    spark: SparkSession, lakehouse: Lakehouse, dataset: Dataset = EVENTS_DATASET
) -> dict[tuple[str, str, int], int]:
    """Per (topic, topic id, partition): the end of the last gap recorded, where bronze resumes at the earliest."""
    ends: dict[tuple[str, str, int], int] = {}
    for gap in recorded(spark, lakehouse, dataset):
        key = (gap["topic"], gap["topic_id"], gap["partition"])
        ends[key] = max(ends.get(key, 0), gap["end"])
    return ends


def record(
    spark: SparkSession, lakehouse: Lakehouse, gaps: list[Gap], accepted_by: str, dataset: Dataset = EVENTS_DATASET
) -> list[Gap]:
    """Record ``gaps``, a file each, leaving out the offsets recorded already; returns what was new.

    Example::

        record(spark, lakehouse, [Gap("events", "Xh1...", 0, 100, 150)], ACCEPTED_BY_COMMAND)
    """
    if accepted_by not in (ACCEPTED_BY_COMMAND, ACCEPTED_BY_SETTING):
        raise ValueError(f"accepted_by must be {ACCEPTED_BY_COMMAND!r} or {ACCEPTED_BY_SETTING!r}")
    if any(not isinstance(gap, Gap) for gap in gaps):
        raise TypeError("gaps must be retention.Gap values")
    ends = accepted_ends(spark, lakehouse, dataset)
    new = []
    for gap in gaps:
        start = max(gap.start, ends.get((gap.topic, gap.topic_id, gap.partition), 0))
        if start < gap.end:
            new.append(Gap(gap.topic, gap.topic_id, gap.partition, start, gap.end))
    at = datetime.now(UTC).isoformat(timespec="seconds")
    directory = lost_records(lakehouse, dataset)
    for gap in new:
        entry = {**asdict(gap), "accepted_at": at, "accepted_by": accepted_by}
        create_new(spark, f"{directory}/{gap.file_name()}", json.dumps(entry, separators=(",", ":")))
    return new


def lost_offsets(spark: SparkSession, lakehouse: Lakehouse, dataset: Dataset = EVENTS_DATASET) -> int:
    """How many offsets the recorded gaps span (what the audit reports as lost), each offset once: two
    processes that found a partition's gap at different moments record overlapping ones."""
    spans: dict[tuple[str, str, int], list[tuple[int, int]]] = {}
    for gap in recorded(spark, lakehouse, dataset):
        spans.setdefault((gap["topic"], gap["topic_id"], gap["partition"]), []).append((gap["start"], gap["end"]))
    lost = 0
    for intervals in spans.values():
        reached = 0
        for start, end in sorted(intervals):
            lost += max(0, end - max(start, reached))
            reached = max(reached, end)
    return lost
