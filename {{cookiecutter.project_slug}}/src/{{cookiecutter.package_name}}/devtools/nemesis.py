"""Nemesis: a seeded schedule of combined faults against the pipeline, judged by an independent oracle.

In the spirit of Jepsen's nemesis and of Spark's own streaming stress tests: each step draws one
action, by weight, among those whose precondition holds, and every action runs the pipeline as an
operator would (its command line, as separate processes) or does to the storage and the broker
what the world does to them:

* ``produce``   a transaction of numbered records (every 17th malformed), committed or aborted, to
                one of the run's topics; one in six carries events days late, one in four gives its
                records the Kafka keys of earlier ones;
* ``drain``     ``run --layer all --available-now``; then the oracle judges every table and sink
                against the ledger of what was committed to Kafka, and the pipeline's audit (as
                ``audit`` runs it, in this runner's Spark) must agree with it;
* ``step``      ``run --layer <one stream> --available-now``;
* ``kill``      a continuous ``run`` SIGKILLed while it starts or after its first batch;
* ``crash``     one stream's next batch killed at a crash point (an egress's too, when the run has one,
                also inside its sink's write);
* ``freeze``    one stream's process (a layer's or an egress's, a backfill or a continuous run)
                stopped (SIGSTOP) inside a batch for longer than its lease, while another process
                runs the stream or an operator resets it; woken, it must write nothing more;
* ``lose``      a stream's checkpoint deleted (an egress's too);
* ``snapshot``  a copy of every checkpoint and every table, for ``restore`` and ``rollback``;
* ``restore``   a stream's checkpoint put back from that older copy;
* ``rollback``  a table put back to that older copy: its directory replaced, or Delta's RESTORE; a
                record bronze loses that way which retention has deleted from Kafka meanwhile is lost
                for good: bronze's start after the reset that gets out refuses to skip it, and the
                oracle stops expecting it;
* ``reset``     ``checkpoints reset <stream> --yes`` (an egress's too), with or without ``--only``
                for bronze and silver;
* ``maintain``  OPTIMIZE or VACUUM of a table by another Spark application (this runner's), while a
                continuous run may be writing to it;
* ``foreign``   rows appended to bronze, silver, quarantine or gold by another application, while a
                run may write: the oracle and the audit must both find them, and the way out the
                runbook gives for what the audit reports must make every table and sink exact again;
* ``retention`` the oldest records of a partition deleted (DeleteRecords, as retention does): only
                records bronze holds, or records it has not read yet too, which its next start must
                refuse to skip, naming ``checkpoints accept-loss``; those records are lost on purpose
                and the oracle stops expecting them;
* ``partition`` a partition added to the topic (up to four), which every stream must take in from
                its first record;
* ``broker``    the broker restarted (when the runner started it), while a continuous run writes; the
                run must carry on through it;
* ``subscribe`` a topic added to ``kafka.topics`` (up to three), which bronze must read from its first
                record;
* ``compact``   a topic made compacted, with records that supersede earlier ones: bronze must refuse it
                until the operator sets the policy back or names it in ``kafka.compacted_topics``;
* ``reconfigure`` a config key changed that the pipeline must refuse (gold's window on a gold with rows,
                a topic dropped from the subscription): the refused start writes nothing, and the
                operator either sets the key back or, for the window, takes the way out and keeps it.

Where the project has a second dataset (``datasets/``), it runs beside the first from a topic of its own:
one ``produce`` in three also commits or aborts a transaction of its records (drawn from its contract,
retries of a record among them, some breaking an expectation, every 17th broken), and every ``crash``
also kills one of its streams at a crash point (its silver between its two commits and its fused stream
between its commits too) or, in the layered mode, its ``quarantine replay`` at one of the replay's
crash points, then replays whole: with the expectations unchanged, nothing may move; every run of a
layer or of ``all`` runs its streams too, and each drain judges its tables with its own oracle
(``oracle.py``) and audits it. Its draws come after the first dataset's in each action, so the first
dataset's part of an action is the same with it or without it. The faults on storage and
on the broker's topics stay with the first dataset.

In the fused mode (``pipeline.mode``, ``PIPELINE_MODE=fused``) the one fused stream stands for the three
layers in every action: it is the one stepped, killed, crashed (at its inner points too), frozen, lost,
restored and reset (``--only`` as well), the owner of every table a rollback or a foreign writer touches,
and the reader of Kafka that retention, compaction and a changed subscription meet.

Some actions must make the next start refuse (gold's checkpoint lost, a checkpoint older than its
table): the runner predicts which refusals may come, and a refusal it did not predict is an
anomaly. A refusal's message names its way out; the runner runs exactly that command (with
``--yes``), and the oracle then judges what it did. The oracle uses none of the pipeline's code:
Spark only reads the Delta tables; the ledger and the checks are plain Python (``chaos.py``).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)
from delta.tables import DeltaTable
from py4j.protocol import Py4JJavaError
from pyspark.sql.functions import col, expr, get_json_object, input_file_name
from pyspark.sql.functions import max as max_

from ..pipeline.config import Mode
from ..pipeline.delta.tables import BRONZE, GOLD, QUARANTINE, SILVER, Lakehouse, latest_snapshot
from ..pipeline.session.codegen import COMPILED, FACTORY_MODE
from ..pipeline.session.spark import java_class
from .chaos import (
    ABORT_EVERY,
    BATCH_DONE,
    KAFKA_EGRESS,
    POSTGRES_EGRESS,
    Ledger,
    batch_ids,
    dataset_values,
    egress_env,
    hadoop_filesystem,
    judge,
    judge_published_gold,
    numbered_record,
    pipeline_command,
    read_topic,
    record_id,
    registry_env,
    send_transaction,
    storage_env,
    wait_while_running,
)
from .oracle import judge_dataset
from .sample import dataset_writer, registry_client

# Each action's weight, in the order the schedule draws among those whose precondition holds.
WEIGHTS = {
    "produce": 6,
    "drain": 3,
    "step": 3,
    "kill": 3,
    "crash": 2,
    "freeze": 1,
    "snapshot": 1,
    "restore": 1,
    "rollback": 1,
    "lose": 1,
    "reset": 1,
    "maintain": 1,
    "foreign": 1,
    "retention": 1,
    "partition": 1,
    "broker": 1,
    "subscribe": 1,
    "reconfigure": 1,
    "compact": 1,
}
# How a schedule file writes the run's name, which each run draws afresh.
RUN = "{run}"
STREAMS = ("bronze", "silver", "gold")
FUSED_STREAM = "fused"
# A copy of a file S3 refuses as changed (a read's If-Match on an ETag the file no longer has) is
# taken again, this many times at most.
COPY_ATTEMPTS = 5
CHANGED_WHILE_READ = re.compile(
    r"RemoteFileChangedException|pre-conditions you specified did not hold|Status Code: 412"
)
TABLES = {"bronze": BRONZE, "silver": SILVER, "quarantine": QUARANTINE, "gold": GOLD}
# Every process of the run holds its stream's lease this long without renewal: short, so that a
# frozen process loses it within the run, long enough that a busy machine renews in time.
LEASE_TTL_S = 12
MAX_PARTITIONS = 4
MAX_TOPICS = 3
# One transaction in this many carries events this many days before the others' hour, at most.
LATE_EVERY, MAX_DAYS_LATE = 6, 7
# One transaction in this many gives its records the Kafka keys of earlier records.
REPEAT_KEYS_EVERY = 4
# One produce in this many also sends the second dataset's records, where the project has one.
SECOND_DATASET_EVERY = 3
# A compacted topic whose log cleaner removes superseded records within seconds: segments roll after a
# second and are cleaned as soon as any of them is superseded.
COMPACT_AT_ONCE = {
    "cleanup.policy": "compact",
    "segment.ms": "1000",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
}
# Where a foreign writer's rows land: offsets no Kafka partition of the run reaches, windows years ahead.
FOREIGN_OFFSET = 10**9
FOREIGN_DAYS = 3650
# Refusals, recognised by what their message says was found (pipeline/refusals.py words them).
CHECKPOINT_LOST = "gold's checkpoint lost"
TABLE_AHEAD = "a table ahead of its checkpoint"
MISMATCH = "a checkpoint of another stream"
BATCHES_MISSING = "bronze behind its checkpoint"
VERSION_BEHIND = "a table put back from an older copy"
TABLE_RESTORED = "a table restored"
SOURCE_LOST = "records Kafka deleted before bronze read them"
WINDOW_CHANGED = "gold's window changed"
TOPIC_DROPPED = "a topic dropped from the subscription"
SOURCE_COMPACTED = "a compacted topic bronze was not told of"
MARKER_AHEAD = "the Kafka egress's checkpoint behind its topic"
MARKER_LOST = "the Kafka egress's marker lost"
MARKER_MISMATCH = "the PostgreSQL egress's checkpoint and marker row disagree"
MARKER_MOVED = "the PostgreSQL egress's marker row changed"
SOURCE_BEHIND = "a source table put back behind the stream reading it"
SOURCE_REWRITTEN = "a source table restored or rewritten under the stream reading it"
FOUND = {
    CHECKPOINT_LOST: "is missing while",
    TABLE_AHEAD: "has committed batch",
    MISMATCH: "does not match the tables it writes",
    BATCHES_MISSING: "has committed only batch",
    VERSION_BEHIND: "but it was at version",
    TABLE_RESTORED: "was restored (RESTORE at table version",
    SOURCE_LOST: "Kafka no longer holds the records bronze needs next",
    SOURCE_COMPACTED: "cleanup.policy compacts, and kafka.compacted_topics",
    WINDOW_CHANGED: "holds windows of",
    TOPIC_DROPPED: "but kafka.topics is",
    MARKER_AHEAD: "committed (consumer group",
    MARKER_LOST: "the topic may lack batches the stream published",
    MARKER_MISMATCH: " records batch ",
    MARKER_MOVED: "does not hold the batches before this one",
    SOURCE_BEHIND: "was put back from an older copy or replaced",
    SOURCE_REWRITTEN: "has a commit that removes rows",
}
REFUSED = 3
# The command a refusal's way out names, after the console script (one word, or `python -m <package>`):
# the last one in the output, since the way out comes after what was found.
WAY_OUT = re.compile(r"`[^`]*?(checkpoints (?:reset|accept-loss)[^`]*)`")
LOST_LEASE = "writes nothing more for {stream}"


class Draws(random.Random):
    """The random numbers the actions draw, recorded step by step so that a later run can play them again.

    Recording changes no number: a seed gives the same schedule and the same draws with or without it.
    Played back (``pin``), a step's draws come out in the order recorded, each while it still answers
    the call (a choice among options that include it, a number in the range asked for); once one does
    not, because the state differs from the recorded run's (a schedule with actions taken out), the
    rest of the step draws afresh. A draw made inside another (``randint`` calls ``randrange``) is
    neither recorded nor pinned: only what the action asked for.

    Example::

        draws = Draws("1:actions")
        draws.choice(["bronze", "gold"])
        recorded = draws.take()           # ["gold"], say
        again = Draws("other seed")
        again.pin(recorded)
        again.choice(["bronze", "gold"])  # "gold"
    """

    # A subclass that defines random() would otherwise get random.Random's other way of drawing an index
    # (Random.__init_subclass__), and every choice of a seed would change.
    _randbelow = random.Random._randbelow_with_getrandbits

    def __init__(self, seed, run: str = "") -> None:
        super().__init__(seed)
        # The run's name (in its topics' and records' names) is recorded as RUN, so that another run's
        # draws answer the same calls: its own topic, its own record of that number.
        self.run = run
        self.recorded: list = []
        self.pinned: list = []
        self._depth = 0

    def pin(self, draws: list) -> None:
        """Start a step whose draws come from ``draws`` while they answer the calls."""
        self.recorded, self.pinned = [], [_renamed(draw, RUN, self.run) for draw in draws]

    def take(self) -> list:
        """The draws of the step that ends, recorded; the next step starts afresh."""
        recorded, self.recorded, self.pinned = self.recorded, [], []
        return [_renamed(draw, self.run, RUN) for draw in recorded]

    def _draw(self, answers: Callable[[object], bool], draw: Callable[[], object]):
        self._depth += 1
        try:
            if self._depth == 1 and self.pinned:
                value = self.pinned.pop(0)
                if not answers(value):
                    self.pinned.clear()
                    value = draw()
            else:
                value = draw()
        finally:
            self._depth -= 1
        if self._depth == 0:
            self.recorded.append(value)
        return value

    def choice(self, seq):
        return self._draw(lambda value: value in seq, lambda: random.Random.choice(self, seq))

    def random(self) -> float:
        return self._draw(
            lambda value: isinstance(value, float) and 0.0 <= value < 1.0, lambda: random.Random.random(self)
        )

    def uniform(self, a: float, b: float) -> float:
        low, high = min(a, b), max(a, b)
        return self._draw(
            lambda value: isinstance(value, float) and low <= value <= high, lambda: random.Random.uniform(self, a, b)
        )

    def randint(self, a: int, b: int) -> int:
        return self._draw(
            lambda value: isinstance(value, int) and a <= value <= b, lambda: random.Random.randint(self, a, b)
        )

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
        def answers(value) -> bool:
            numbers = range(start) if stop is None else range(start, stop, step)
            return isinstance(value, int) and value in numbers

        return self._draw(answers, lambda: random.Random.randrange(self, start, stop, step))


@dataclass
class Step:
    number: int
    action: str
    detail: str
    seconds: float
    # What the action drew (``Draws``), and the anomalies found while it ran.
    draws: list = field(default_factory=list)
    anomalies: dict[str, int] = field(default_factory=dict)
    # The drain every run ends with: not part of the schedule a replay plays (it ends with its own).
    final: bool = False


@dataclass
class Schedule:
    """The actions a run took, with their draws, in the file a later run plays again (``nemesis --replay``).

    A failing run's schedule ends at its first step with an anomaly: what came after cannot have
    caused it. ``anomalies`` are the kinds that step found, the ones a shorter schedule must still find.
    ``mode`` is the pipeline mode the run played in, ``compiled`` whether its streams compiled every
    batch (``nemesis --compiled``); a replay plays the same way, whatever its shell says.

    Example::

        Schedule.of(seed=1, report=report, mode=Mode.FUSED).save(workdir / "schedule.json")
        Schedule.load(workdir / "schedule.json").names()  # ["produce", "kill", "drain"]
    """

    seed: int
    actions: list[dict]
    anomalies: list[str] = field(default_factory=list)
    mode: Mode = Mode.LAYERED
    compiled: bool = False

    @classmethod
    def of(cls, seed: int, report: NemesisReport, mode: Mode = Mode.LAYERED, compiled: bool = False) -> Schedule:
        actions, anomalies = [], []
        for step in report.steps:
            if not step.final:
                actions.append({"action": step.action, "draws": step.draws})
            if step.anomalies:
                anomalies = sorted(step.anomalies)
                break
        return cls(seed, actions, anomalies, Mode(mode), compiled)

    @classmethod
    def load(cls, path: Path) -> Schedule:
        """Read a schedule file; a ``ValueError`` names what is wrong with it."""
        try:
            data = json.loads(Path(path).read_text())
            # A schedule saved before the mode was recorded was played in the layered mode.
            mode = Mode(data.get("mode", Mode.LAYERED.value))
            compiled = data.get("compiled", False)
            if not isinstance(compiled, bool):
                raise ValueError(f"compiled is {compiled!r}, not true or false")
            schedule = cls(int(data["seed"]), list(data["actions"]), list(data.get("anomalies", [])), mode, compiled)
            for action in schedule.actions:
                action["draws"] = list(_tuples(action.get("draws", [])))
                if action["action"] not in WEIGHTS:
                    raise ValueError(f"unknown action {action['action']!r}")
        except (OSError, KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path}: not a nemesis schedule ({error})") from error
        return schedule

    def save(self, path: Path) -> None:
        saved = {
            "seed": self.seed,
            "mode": self.mode.value,
            "compiled": self.compiled,
            "anomalies": self.anomalies,
            "actions": self.actions,
        }
        path.write_text(json.dumps(saved, indent=1))

    def names(self) -> list[str]:
        return [action["action"] for action in self.actions]

    def without(self, kept: list[dict]) -> Schedule:
        return Schedule(self.seed, kept, self.anomalies, self.mode, self.compiled)


class Predictions:
    """The refusals a start of each stream may meet after the faults played so far, and whether it must
    meet one: a start refused with none of them, or a certain one not met, is an anomaly.

    Example::

        predictions = Predictions()
        predictions.expect("gold", {CHECKPOINT_LOST}, certain=True)
        predictions.pending(["bronze", "gold"])  # {CHECKPOINT_LOST}
        predictions.cleared(["gold"])             # gold ran: nothing is pending
    """

    def __init__(self) -> None:
        self._by_stream: dict[str, tuple[set[str], bool]] = {}

    def expect(self, stream: str, kinds: set[str], certain: bool) -> None:
        """A start of ``stream`` may now meet one of ``kinds`` (must meet one, when ``certain``), as well
        as what it was predicted to meet before."""
        before, was_certain = self._by_stream.get(stream, (set(), False))
        self._by_stream[stream] = (before | set(kinds), was_certain or certain)

    def pending(self, streams) -> set[str]:
        return set().union(*(self._by_stream.get(name, (set(), False))[0] for name in streams))

    def certain(self, streams) -> bool:
        return any(self._by_stream.get(name, (set(), False))[1] for name in streams)

    def cleared(self, streams, reset: bool = False) -> None:
        """``streams`` ran (or were ``reset``): what was predicted for them is behind them. A reset leaves
        records Kafka lost to bronze lost: bronze resumes after what it holds, and still finds them gone."""
        for name in streams:
            kinds, certain = self._by_stream.pop(name, (set(), False))
            if reset and SOURCE_LOST in kinds:
                self._by_stream[name] = ({SOURCE_LOST}, certain)

    def checkpoint_lost(self, stream: str) -> None:
        """``stream``'s checkpoint is gone. A refusal the checkpoint was bound to meet (a copy put back
        behind its table or its marker) may not come now, since the stream starts without it (an egress
        as a new stream): it stays possible, no longer certain. A loss in Kafka is met all the same."""
        kinds, certain = self._by_stream.pop(stream, (set(), False))
        if kinds:
            self._by_stream[stream] = (kinds, certain and SOURCE_LOST in kinds)


@dataclass
class NemesisReport:
    steps: list[Step] = field(default_factory=list)
    anomalies: Counter = field(default_factory=Counter)
    findings: list[str] = field(default_factory=list)
    refusals: Counter = field(default_factory=Counter)
    records_committed: int = 0
    records_aborted: int = 0
    # The second dataset's name and records, where the project has one.
    second_dataset: str | None = None
    second_committed: int = 0
    second_aborted: int = 0
    # Committed records a compacted topic's cleaner removed before bronze read them: no longer expected.
    records_compacted_away: int = 0
    records_rolled_away: int = 0
    oracle_checks: int = 0
    # The silver sink's commits to silver and quarantine, and the gold sink's to gold, by the way each
    # took (append, MERGE), from the final tables' logs: what the schedule made them do, both ways
    # being part of the guarantee.
    silver_sink_commits: Counter = field(default_factory=Counter)
    gold_sink_commits: Counter = field(default_factory=Counter)

    @property
    def clean(self) -> bool:
        return not any(self.anomalies.values())

    def actions(self) -> Counter:
        return Counter(step.action for step in self.steps)

    def table(self) -> str:
        rows = [(f"action: {name}", count) for name, count in sorted(self.actions().items())]
        rows += [(f"refusal predicted and met: {name}", count) for name, count in sorted(self.refusals.items())]
        rows += [
            ("records committed", self.records_committed),
            ("records aborted", self.records_aborted),
            *(
                [
                    (f"{self.second_dataset} records committed", self.second_committed),
                    (f"{self.second_dataset} records aborted", self.second_aborted),
                ]
                if self.second_dataset
                else []
            ),
            ("records compacted away before bronze", self.records_compacted_away),
            ("records lost with bronze put back past retention", self.records_rolled_away),
            ("oracle checks", self.oracle_checks),
            *[(f"silver sink commits: {way}", count) for way, count in sorted(self.silver_sink_commits.items())],
            *[(f"gold sink commits: {way}", count) for way, count in sorted(self.gold_sink_commits.items())],
            ("seconds", round(sum(step.seconds for step in self.steps))),
        ]
        rows += [(f"anomaly: {name}", count) for name, count in sorted(self.anomalies.items())]
        rows.append(("verdict", "clean" if self.clean else "ANOMALIES"))
        width = max(len(name) for name, _ in rows) + 2
        lines = [f"{name:<{width}}{value:>8}" for name, value in rows]
        return "\n".join(lines + [f"finding: {finding}" for finding in self.findings])


class Nemesis:
    """One run: a private topic and lakehouse, the ledger, this runner's Spark, and the actions."""

    def __init__(
        self,
        config,
        seed: int,
        logs: Path,
        broker=None,
        records_per_transaction: int = 40,
        schedule_file: Path | None = None,
        compiled: bool = False,
    ):
        from ..pipeline.datasets import DATASETS
        from ..pipeline.egress import settings_of
        from ..pipeline.kafka.clients import bootstrap_servers, client_config
        from ..pipeline.session import s3
        from ..pipeline.session.spark import build_spark

        self.config = config
        # Which action comes next, and how each action plays out, from two streams of the same seed: a
        # schedule stays the same when an action's own draws change.
        self.run = f"nemesis{seed}-{uuid.uuid4().hex[:6]}"
        self.schedule = random.Random(seed)
        self.rng = Draws(f"{seed}:actions", run=self.run)
        self.seed = seed
        self.schedule_file = schedule_file
        self.compiled = compiled
        self.logs = logs
        self.broker = broker
        self.records_per_transaction = records_per_transaction
        self.topic = self.run
        self.topics = [self.topic]
        self.client = client_config(config)
        self.admin = AdminClient(self.client)
        self.partitions = 2
        topic = NewTopic(self.topic, num_partitions=self.partitions, replication_factor=1)
        self.admin.create_topics([topic])[self.topic].result(30)
        inherited = {key: value for key, value in os.environ.items() if key != "PIPELINE_CRASH_POINT"}
        self.env = {
            **inherited,
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers(config),
            "KAFKA_TOPICS": self.topic,
            "LAKEHOUSE_ROOT": config.lakehouse_root,
            "PIPELINE_TRIGGER_INTERVAL": "1 second",
            "PIPELINE_LEASE_TTL": f"{LEASE_TTL_S} seconds",
            # Batches small enough that a backlog takes several: more boundaries for faults to land on.
            "KAFKA_MAX_OFFSETS_PER_TRIGGER": "60",
            **storage_env(config),
            **registry_env(config),
        }
        # The project's second dataset, where it has one: a topic of its own, its records from its contract,
        # and its first gold published by each egress.
        self.second = DATASETS[1] if len(DATASETS) > 1 else None
        self.env.update(egress_env(config, self.run, self.admin, self.second))
        if self.second is not None:
            self.second_topic = f"{self.run}-{self.second.name}"
            second_topic = NewTopic(self.second_topic, num_partitions=2, replication_factor=1)
            self.admin.create_topics([second_topic])[self.second_topic].result(30)
            self.env["PIPELINE_DATASETS"] = self.second.name
            self.env[f"DATASET_{self.second.name.upper()}_TOPICS"] = self.second_topic
            write = dataset_writer(config, self.second, self.second_topic)
            self.second_values = dataset_values(self.second, self.run, seed, write)
        if compiled:
            self.env["JAVA_TOOL_OPTIONS"] = compiled_java_options(self.env.get("JAVA_TOOL_OPTIONS", ""))
        # The layers (or the fused stream), then each egress the run turns on: an egress runs after gold.
        fused = config.mode.value == FUSED_STREAM
        self.layers = (FUSED_STREAM,) if fused else STREAMS
        self.env["PIPELINE_MODE"] = config.mode.value
        # The stream that reads Kafka, and the one that writes gold.
        self.reader, self.aggregator = self.layers[0], self.layers[-1]
        self.streams = (*self.layers, *settings_of(config))
        s3.prepare(config)
        packages, conf = s3.session_options(config)
        self.spark = build_spark(
            "nemesis", config.spark_master, config.shuffle_partitions, extra_conf=conf, extra_packages=packages
        )
        self.ledger = Ledger()
        self.report = NemesisReport()
        self.producer = Producer({**self.client, "transactional.id": f"nemesis-{self.run}", "linger.ms": 5})
        self.producer.init_transactions(30)
        self.produced = 0
        self.copies: dict[str, Path] = {}
        self.table_copies: dict[str, tuple[Path, int]] = {}
        # Each topic's record keys so far (for records that repeat one), and where each committed record went.
        self.keys: dict[str, list[str]] = {}
        self.placed: dict[str, tuple[str, str]] = {}
        # The topics named in kafka.compacted_topics (a changelog by design), and every topic made compacted.
        self.compacted: list[str] = []
        self.compacted_once: list[str] = []
        # Whether silver may hold records a rollback of bronze lost (_forget_rolled_away), until a reset rebuilds it.
        self.silver_holds_lost = False
        self.predictions = Predictions()
        self.commands = 0
        acts = {
            "produce": self.produce,
            "drain": self.drain,
            "step": self.step,
            "kill": self.kill,
            "crash": self.crash,
            "freeze": self.freeze,
            "snapshot": self.snapshot,
            "restore": self.restore,
            "rollback": self.rollback,
            "lose": self.lose,
            "reset": self.reset,
            "maintain": self.maintain,
            "foreign": self.foreign,
            "retention": self.retention,
            "partition": self.add_partition,
            "broker": self.restart_broker,
            "subscribe": self.subscribe,
            "reconfigure": self.reconfigure,
            "compact": self.compact,
        }
        preconditions = {
            "restore": lambda: bool(self.copies),
            "rollback": lambda: bool(self.table_copies),
            "partition": lambda: self.partitions < MAX_PARTITIONS,
            "broker": lambda: self.broker is not None,
            "subscribe": lambda: len(self.topics) < MAX_TOPICS,
            "compact": lambda: len(self.compacted) < len(self.topics),
        }
        self.actions: list[tuple[str, int, Callable[[], bool], Callable[[], str]]] = [
            (name, weight, preconditions.get(name, lambda: True), acts[name]) for name, weight in WEIGHTS.items()
        ]

    # --- the schedule -------------------------------------------------------------------------

    def play(self, actions: int | None = None, replay: Schedule | None = None, judged: bool = True) -> NemesisReport:
        """Take ``actions`` seeded actions, or the actions of a recorded schedule with their draws, then a
        final drain judged by the oracle and the audit (``judged=False`` leaves it out: a run that only
        records a schedule to play). After every step the schedule so far is saved (``schedule_file``),
        so that a run stopped halfway can be played again too."""
        if replay is None:
            for number in range(1, actions + 1):
                ready = [(name, weight, act) for name, weight, possible, act in self.actions if possible()]
                name, _, act = self.schedule.choices(ready, weights=[weight for _, weight, _ in ready])[0]
                self._take(number, name, act)
        else:
            by_name = {name: (possible, act) for name, _, possible, act in self.actions}
            for number, recorded in enumerate(replay.actions, 1):
                possible, act = by_name[recorded["action"]]
                if possible():
                    self._take(number, recorded["action"], act, draws=recorded["draws"])
                else:
                    # A shortened schedule can leave an action without what it needs (a restore without a copy).
                    print(f"[{number:3d}] {recorded['action']:<8} skipped: its precondition does not hold", flush=True)
        if judged:
            self._take(len(self.report.steps) + 1, "drain", self.drain, final=True)
            for table in ("silver", "quarantine"):
                self.report.silver_sink_commits.update(self._sink_commits(table))
            self.report.gold_sink_commits.update(self._sink_commits("gold"))
        self.report.records_committed = len(self.ledger.committed)
        self.report.records_aborted = len(self.ledger.aborted)
        if self.second is not None:
            self.report.second_dataset = self.second.name
            self.report.second_committed = len(self.ledger.second)
            self.report.second_aborted = self.ledger.second_aborted
        return self.report

    def _take(self, number: int, name: str, act: Callable[[], str], draws: list = (), final: bool = False) -> None:
        found_before = Counter(self.report.anomalies)
        self.rng.pin(draws)
        started = time.monotonic()
        detail = act()
        seconds = time.monotonic() - started
        found = dict(Counter(self.report.anomalies) - found_before)
        step = Step(number, name, detail, seconds, draws=self.rng.take(), anomalies=found, final=final)
        self.report.steps.append(step)
        print(f"[{number:3d}] {name:<8} {step.seconds:6.1f} s  {detail}", flush=True)
        if self.schedule_file is not None:
            Schedule.of(self.seed, self.report, self.config.mode, self.compiled).save(self.schedule_file)

    # --- running the pipeline -----------------------------------------------------------------

    def command(self, *args: str, extra_env: dict[str, str] | None = None):
        """Run a pipeline command to its end. A refusal is checked against what the runner predicted
        for the streams it starts, the way out its message names is run, and the command runs again.
        Returns the last run's (exit code, output)."""
        stream = args[2] if args[:2] == ("run", "--layer") and args[2] != "all" else None
        expected, certain = self.pending_refusals(stream), self.certain_refusal(stream)
        code, output = self._run(args, extra_env)
        refused = 0
        while code == REFUSED and refused < len(self.streams):
            refused += 1
            found = refusals_found(output)
            if found & expected:
                self.report.refusals[sorted(found & expected)[0]] += 1
            else:
                self.report.anomalies["unpredicted_refusals"] += 1
                self.report.findings.append(f"unpredicted refusal of {' '.join(args)}: {_last_lines(output)}")
            way_out = way_out_of(output)
            if way_out is None:
                self.report.anomalies["refusals_without_a_way_out"] += 1
                self.report.findings.append(f"no way out named: {_last_lines(output)}")
                return code, output
            command = way_out.split()
            exit_code, out = self._run([*command, *(["--yes"] if "--yes" not in command else [])], None)
            if exit_code != 0:
                self.report.anomalies["ways_out_that_failed"] += 1
                self.report.findings.append(f"way out {' '.join(command)} exited {exit_code}: {_last_lines(out)}")
                return exit_code, out
            reset = reset_by(command)
            if reset is not None:
                # What the reset rebuilt (with a cascade, the streams below too) starts anew, as after `reset`.
                self._refusals_cleared(reset[0], downstream=reset[1], reset=True)
            code, output = self._run(args, extra_env)
        if certain and not refused and args[0] == "run":
            self.report.anomalies["predicted_refusals_missed"] += 1
            self.report.findings.append(f"{' '.join(args)} did not refuse ({sorted(expected)})")
        if code == 0 and args[0] == "run":
            self._refusals_cleared(stream)
        return code, output

    def _run(self, args, extra_env: dict[str, str] | None) -> tuple[int, str]:
        self.commands += 1
        log_path = self.logs / f"{self.commands:04d}-{'-'.join(args[:3]).replace('/', '_')}.log"
        with log_path.open("w") as log:
            finished = subprocess.run(
                pipeline_command(*args),
                env={**self.env, **(extra_env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=900,
            )
        return finished.returncode, log_path.read_text(errors="replace")

    def start(self, *args: str, extra_env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
        self.commands += 1
        log_path = self.logs / f"{self.commands:04d}-{'-'.join(args[:3])}.log"
        with log_path.open("w") as log:
            process = subprocess.Popen(
                pipeline_command(*args),
                env={**self.env, **(extra_env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return process, log_path

    def _kill(self, process: subprocess.Popen, log_path: Path, what: str) -> bool:
        """SIGKILL a continuous run (driver and JVM); False, an anomaly, when it had ended on its own."""
        if process.poll() is not None:
            self.report.anomalies["runs_that_ended_on_their_own"] += 1
            self.report.findings.append(f"{what} exited {process.returncode} before its kill: see {log_path}")
            return False
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return True

    def _stop(self, process: subprocess.Popen, log_path: Path, what: str) -> None:
        """Stop a continuous run as an operator does (`kill -TERM <pid>` of the driver: it stops after its
        current batch and releases its leases); an anomaly when it had ended on its own or does not stop
        in time. Only the driver: a SIGTERM to its JVM too (the whole process group) stops the JVM under
        a lease renewal it is writing (docs/runbook.md, When a stream fails)."""
        if process.poll() is not None:
            self.report.anomalies["runs_that_ended_on_their_own"] += 1
            self.report.findings.append(f"{what} exited {process.returncode} before its stop: see {log_path}")
            return
        process.send_signal(signal.SIGTERM)
        self._wait_or_kill(
            process, 180, "runs_that_did_not_stop", f"{what} did not stop within 180 s of SIGTERM: see {log_path}"
        )

    def _wait_or_kill(self, process: subprocess.Popen, timeout_s: float, anomaly: str, finding: str) -> None:
        """Wait for ``process`` to end; one still running after ``timeout_s`` is an ``anomaly``, SIGKILLed
        with its process group (its JVM)."""
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.report.anomalies[anomaly] += 1
            self.report.findings.append(finding)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def expect_ok(self, what: str, code: int, output: str) -> None:
        if code != 0:
            self.report.anomalies["commands_that_failed"] += 1
            self.report.findings.append(f"{what} exited {code}: {_last_lines(output)}")

    # --- the actions ----------------------------------------------------------------------------

    def produce(
        self,
        committed: bool | None = None,
        topic: str | None = None,
        repeat: bool | None = None,
        count: int | None = None,
        second: bool | None = None,
    ) -> str:
        """A transaction of ``count`` numbered records to ``topic``, committed or aborted; ``repeat``: its records
        take the keys of earlier records of the topic. Each drawn when None. ``second``: then a transaction of
        the second dataset's records to its topic too (drawn when None: one in ``SECOND_DATASET_EVERY``)."""
        count = self.rng.randint(1, self.records_per_transaction) if count is None else count
        committed = self.rng.randrange(ABORT_EVERY) != 0 if committed is None else committed
        topic = self.rng.choice(self.topics) if topic is None else topic
        days_late = self.rng.randint(1, MAX_DAYS_LATE) if self.rng.randrange(LATE_EVERY) == 0 else 0
        batch = [numbered_record(self.run, self.produced + index, self.rng, days_late) for index in range(count)]
        # Keys repeat in real topics (a user's or a session's events): the pipeline keeps every record, each
        # once, by its Kafka coordinates; the oracle knows a record by the id its value carries. (In a
        # compacted topic a repeated key is what lets Kafka remove the record it supersedes.)
        earlier = self.keys.get(topic, [])
        repeat = self.rng.randrange(REPEAT_KEYS_EVERY) == 0 if repeat is None else repeat
        repeat = repeat and bool(earlier)
        keys = [self.rng.choice(earlier) if repeat else name for name, _ in batch]
        records = [(key.encode(), value) for key, (_, value) in zip(keys, batch, strict=True)]
        send_transaction(self.producer, topic, records, committed)
        self.produced += count
        if not repeat:
            self.keys.setdefault(topic, []).extend(keys)
        if committed:
            self.ledger.committed.update(batch)
            self.placed.update({name: (topic, key) for (name, _), key in zip(batch, keys, strict=True)})
        else:
            self.ledger.aborted.update(name for name, _ in batch)
        late = f", {days_late} days late" if days_late else ""
        to = f" to {topic}" if len(self.topics) > 1 else ""
        repeated = ", keys of earlier records" if repeat else ""
        detail = f"{count} records {'committed' if committed else 'aborted'}{to}{late}{repeated}"
        # Drawn after the first dataset's: its transaction is the same with a second dataset or without.
        if second is None:
            second = self.second is not None and self.rng.randrange(SECOND_DATASET_EVERY) == 0
        if second:
            count = self.rng.randint(1, self.records_per_transaction)
            detail += f"; {self._produce_second(self.rng.randrange(ABORT_EVERY) != 0, count)}"
        return detail

    def _produce_second(self, committed: bool, count: int) -> str:
        values = [next(self.second_values) for _ in range(count)]
        send_transaction(self.producer, self.second_topic, [(None, value) for value in values], committed)
        if committed:
            self.ledger.second.extend(values)
        else:
            self.ledger.second_aborted += count
        return f"{count} {self.second.name} records {'committed' if committed else 'aborted'}"

    def work(self) -> None:
        """Records for the batch a fault is about to land in: an aborted transaction, then a committed
        one, so that the batch's source must skip the first (``read_committed``) where it is killed."""
        self.produce(committed=False, second=False)
        self.produce(committed=True, second=False)

    def drain(self) -> str:
        code, output = self.command("run", "--layer", "all", "--available-now")
        self.expect_ok("drain", code, output)
        wrong, clean, verdict = self.judge()
        self.report.anomalies.update(wrong)
        # The audit must agree with the oracle: clean exactly when every anomaly is zero.
        if clean != (not wrong):
            self.report.anomalies["audit_disagrees_with_oracle"] += 1
            self.report.findings.append(f"audit {verdict}, oracle found {wrong}")
        return f"oracle {'clean' if not wrong else wrong}, audit {verdict}"

    def judge(self) -> tuple[dict[str, int], bool, str]:
        """What the oracle finds wrong (anomalies by kind, zeros left out), and the audit's verdict."""
        # A topic set back to delete may still finish a cleaning pass begun before: every topic made
        # compacted, not only the named ones (a delete policy never removes from the middle of a log).
        self._forget_compacted(self.compacted_once)
        anomalies, _ = judge(self.spark, self.config, self.ledger, self.env)
        if self.second is not None:
            lakehouse = Lakehouse(self.config.lakehouse_root)
            registry = registry_client(self.config, self.second)
            found = judge_dataset(
                self.spark, lakehouse, self.second, self.ledger.second, self.config.gold_window, registry
            )
            anomalies.update({f"{self.second.name}_{kind}": count for kind, count in found.items()})
            anomalies.update(judge_published_gold(self.config, self.env, self.second, self.ledger.second))
        self.report.oracle_checks += 1
        clean, verdict = self.audit()
        return {name: count for name, count in anomalies.items() if count}, clean, verdict

    def audit(self) -> tuple[bool, str]:
        """The verdict of the pipeline's audit (``run_audit``, what `audit` runs) on the config a
        pipeline process of this run reads from its environment, in this runner's Spark: a process of
        its own would start a JVM for each drain (about a minute on 2 cores). An error is a verdict
        that is not clean, as `audit` exiting non-zero was."""
        from ..pipeline.audit.reconcile import run_audit
        from ..pipeline.config import load_config
        from ..pipeline.datasets import DATASETS
        from ..pipeline.egress import configure

        config = configure(load_config(environ=self.env), self.env)
        found = {}
        for dataset in (DATASETS[0], self.second) if self.second is not None else (DATASETS[0],):
            try:
                report = run_audit(self.spark, config, dataset, environ=self.env)
            except Exception as error:  # noqa: BLE001 - any failure to reach a verdict is reported, not raised
                return False, f"failed: {dataset.name}: {type(error).__name__}: {_last_lines(str(error), 3)}"
            found.update({f"{dataset.name}: {name}": count for name, count in report.errors.items() if count})
        return (True, "clean") if not found else (False, f"FAILED {found}")

    def step(self) -> str:
        stream = self.rng.choice(self.layers)
        code, output = self.command("run", "--layer", stream, "--available-now")
        self.expect_ok(f"run --layer {stream}", code, output)
        return f"{stream} exit {code}"

    def kill(self) -> str:
        layer = self.rng.choice(["all", "all", *self.layers])
        if self.pending_refusals(None if layer == "all" else layer):
            # A refused start exits on its own: let a drain meet the refusal instead.
            return self.drain()
        while_starting = self.rng.random() < 0.25
        if layer == "all" or while_starting:
            self.work()
        else:
            # A stream run alone reads only what the one above it holds: carried up to it, the records
            # give the run a batch to be killed after (silver or gold would otherwise wait for none).
            self._feed(layer)
        process, log_path = self.start("run", "--layer", layer)
        if while_starting:
            time.sleep(self.rng.uniform(1.0, 8.0))
        else:
            if not wait_while_running(lambda: BATCH_DONE in log_path.read_text(errors="replace"), process, 300):
                self.report.findings.append(f"run --layer {layer} ended or stalled before a batch: see {log_path}")
            time.sleep(self.rng.uniform(0.0, 4.0))
        if not self._kill(process, log_path, f"run --layer {layer}"):
            return f"{layer} ended with {process.returncode}"
        return f"{layer} killed {'while starting' if while_starting else 'after a batch'}"

    def crash(self) -> str:
        from ..pipeline.recovery.crash_points import AFTER_PRE_COMMIT, AFTER_STAGING, FUSED_POINTS, POINTS

        chosen = self._stream_with_work()
        if chosen is None:
            return self.step()
        stream, batch = chosen
        # Inside an egress's write too: its transaction or database work pre-committed, not committed.
        # (PostgreSQL stages only a large batch: a point not reached leaves the run to finish.)
        # The fused stream between its four commits, too.
        inner = {
            KAFKA_EGRESS: (AFTER_PRE_COMMIT,),
            POSTGRES_EGRESS: (AFTER_STAGING, AFTER_PRE_COMMIT),
            FUSED_STREAM: FUSED_POINTS,
        }
        point = self.rng.choice((*POINTS, *inner.get(stream, ())))
        code, output = self.command(
            "run", "--layer", stream, "--available-now", extra_env={"PIPELINE_CRASH_POINT": f"{stream}:{point}:{batch}"}
        )
        if code not in (0, -signal.SIGKILL):
            self.expect_ok(f"run --layer {stream} with a crash point", code, output)
        detail = f"{stream}:{point}:{batch} {'killed' if code == -signal.SIGKILL else f'exit {code}'}"
        # Drawn after the first dataset's crash: it is the same with a second dataset or without.
        if self.second is not None:
            detail += f"; {self._crash_second()}"
        return detail

    def _crash_second(self) -> str:
        """One of the second dataset's streams killed at a crash point of its next batch, records made ready
        for it first (``_ready_second``: the streams above it run), or its quarantine replay killed."""
        from ..pipeline.delta.tables import dataset_streams, fused_stream
        from ..pipeline.quarantine_replay import stream_name as replay_stream
        from ..pipeline.recovery.crash_points import BETWEEN_SINK_COMMITS, FUSED_POINTS, POINTS

        second = self.second
        if self.layers == STREAMS:
            streams = dataset_streams(second)
            stream = self.rng.choice([*streams, replay_stream(second)])
            if stream == replay_stream(second):
                return self.replay_quarantine()
            layer = streams[stream].layer.value
        else:
            stream, layer = fused_stream(second).name, FUSED_STREAM
        inner = {second.stream("silver"): (BETWEEN_SINK_COMMITS,), second.stream("fused"): FUSED_POINTS}
        point = self.rng.choice((*POINTS, *inner.get(stream, ())))
        self._ready_second({"silver": ("bronze",), "gold": ("bronze", "silver")}.get(layer, ()))
        where = f"{stream}:{point}:{self.next_batch(stream)}"
        code, output = self._run(
            ["run", "--layer", layer, "--dataset", second.name, "--available-now"], {"PIPELINE_CRASH_POINT": where}
        )
        if code not in (0, -signal.SIGKILL):
            self.expect_ok(f"run --layer {layer} --dataset {second.name} with a crash point", code, output)
        return f"{where} {'killed' if code == -signal.SIGKILL else f'exit {code}'}"

    def _ready_second(self, layers: tuple[str, ...]) -> None:
        """Records for the second dataset's next batch: a transaction of them aborted and one committed to its
        topic, then its streams of ``layers`` run, in that order."""
        self._produce_second(False, self.rng.randint(1, self.records_per_transaction))
        self._produce_second(True, self.rng.randint(1, self.records_per_transaction))
        for layer in layers:
            code, output = self._run(["run", "--layer", layer, "--dataset", self.second.name, "--available-now"], None)
            self.expect_ok(f"run --layer {layer} --dataset {self.second.name}", code, output)

    def replay_quarantine(self) -> str:
        """The second dataset's quarantine judged again (``quarantine replay``) in a process killed at one of
        the replay's crash points, records made ready for it first, then in one that runs whole and must
        finish what the killed one began. Its expectations are the same as when the records were
        quarantined, so no record may move to silver: one that does is an anomaly."""
        from ..pipeline.quarantine_replay import app_id, stream_name
        from ..pipeline.recovery.crash_points import AFTER_QUARANTINE_COMMIT, AFTER_SILVER_COMMIT
        from ..pipeline.recovery.sink_progress import last_tagged_batch

        second = self.second
        point = self.rng.choice((AFTER_SILVER_COMMIT, AFTER_QUARANTINE_COMMIT))
        self._ready_second(("bronze", "silver"))
        silver = latest_snapshot(self.spark, Lakehouse(self.config.lakehouse_root).table(second.silver))
        last = last_tagged_batch(silver, app_id(second))
        where = f"{stream_name(second)}:{point}:{0 if last is None else last + 1}"
        replay = ["quarantine", "replay", "--dataset", second.name]
        code, output = self._run(replay, {"PIPELINE_CRASH_POINT": where})
        if code not in (0, -signal.SIGKILL):
            self.expect_ok(f"quarantine replay --dataset {second.name} with a crash point", code, output)
        killed = "killed" if code == -signal.SIGKILL else f"exit {code}"
        code, output = self._run(replay, None)
        self.expect_ok(f"quarantine replay --dataset {second.name}", code, output)
        summary = re.search(rf"^{second.name}: (?:replay|no record).*$", output, re.MULTILINE)
        moved = re.search(r" (\d+) moved to ", summary.group(0)) if summary else None
        if summary is None or (moved is not None and int(moved.group(1))):
            self.report.anomalies["replay_moved_records_its_expectations_refuse"] += 1
            self.report.findings.append(f"quarantine replay --dataset {second.name}: {_last_lines(output, 3)}")
        return f"{where} {killed}, then whole: {summary.group(0) if summary else 'no summary'}"

    def freeze(self) -> str:
        from ..pipeline.recovery.crash_points import BEFORE_SINK_COMMIT

        chosen = self._stream_with_work()
        if chosen is None:
            return self.step()
        stream, batch = chosen
        at = f"{stream}:{BEFORE_SINK_COMMIT}:{batch}"
        # A backfill's process (--available-now) or a continuous one: both must stop writing once woken.
        continuous = self.rng.random() < 0.5
        frozen, log_path = self.start(
            "run",
            "--layer",
            stream,
            *(() if continuous else ("--available-now",)),
            extra_env={"PIPELINE_CRASH_POINT": f"{at}:freeze"},
        )
        if not wait_while_running(lambda: _state(frozen.pid) == "T", frozen, 300):
            return f"{stream} batch {batch} never froze (exit {frozen.poll()})"
        time.sleep(LEASE_TTL_S + 2)
        taken_by = self.rng.choice(["another process", "reset"])
        if taken_by == "reset":
            code, output = self._run(("checkpoints", "reset", stream, "--yes"), None)
            self.expect_ok(f"checkpoints reset {stream}", code, output)
            self._refusals_cleared(stream, downstream=True, reset=True)
        code, output = self.command("run", "--layer", stream, "--available-now")
        self.expect_ok(f"run --layer {stream} while one is frozen", code, output)
        os.kill(frozen.pid, signal.SIGCONT)
        went_on = f"the woken {stream} process still ran 300 s later: see {log_path}"
        self._wait_or_kill(frozen, 300, "woken_writers_that_went_on", went_on)
        if LOST_LEASE.format(stream=stream) not in log_path.read_text(errors="replace"):
            self.report.anomalies["woken_writers_not_fenced"] += 1
            self.report.findings.append(f"the frozen {stream} process did not stop on its lost lease: see {log_path}")
        run = "continuous run" if continuous else "run"
        return f"{stream} batch {batch} frozen in a {run}, taken by {taken_by}, woken: exit {frozen.returncode}"

    def snapshot(self) -> str:
        """A backup of every checkpoint and table there is, as an operator's copy of the lakehouse would
        hold (tables with the version they were copied at)."""
        copied = []
        copies = self.logs.parent / "copies"
        for stream in self.streams:
            copy = copies / f"{stream}-{len(self.report.steps)}"
            if copy_directory(self.spark, self.checkpoint(stream), str(copy)):
                self.copies[stream] = copy
                copied.append(stream)
        for table in TABLES:
            path = self._table(table)
            if not self._exists(path):
                continue
            copy = copies / f"table-{table}-{len(self.report.steps)}"
            version = latest_snapshot(self.spark, path).version()
            copy_directory(self.spark, path, str(copy))
            self.table_copies[table] = (copy, version)
            copied.append(f"table {table} at version {version}")
        return f"copied: {', '.join(copied) or 'nothing yet'}"

    def restore(self) -> str:
        stream = self.rng.choice(sorted(self.copies))
        copy = str(self.copies.pop(stream))
        current, older = self.checkpoint(stream), copy
        lost = not self._exists(current)
        same_stream = not lost and self._read(f"{current}/metadata") == self._read(f"{older}/metadata")
        moved_on = self.committed_batches(current) != self.committed_batches(older)
        self._delete(current)
        copy_directory(self.spark, older, current)
        # A layer's tables record the batches it wrote; an egress's marker, in its sink, does.
        behind = {KAFKA_EGRESS: {MARKER_AHEAD}, POSTGRES_EGRESS: {MARKER_MISMATCH}}.get(stream, {TABLE_AHEAD})
        other = {KAFKA_EGRESS: {MARKER_LOST}, POSTGRES_EGRESS: {MARKER_MOVED}}.get(stream, {MISMATCH})
        if lost:
            # Whether the table moved on since the copy is unknown here: a refusal may come, or not.
            self.expect(stream, behind | other, False)
        elif not same_stream:
            # Another stream id's checkpoint: a layer's tables name the current one; an egress resumes the
            # older stream where its marker is, or is refused when the copy is behind that marker.
            self.expect(stream, behind | other, stream in self.layers)
        elif moved_on:
            self.expect(stream, behind, True)
        return f"{stream}'s checkpoint put back ({'lost before' if lost else 'moved on' if moved_on else 'same'})"

    def rollback(self) -> str:
        """A table put back to an older state, as an operator's mistake or a restore from backup does: its
        directory replaced by the older copy ``snapshot`` made, or Delta's ``RESTORE`` to the version that
        copy was at. The stream writing it must refuse to resume over it (its checkpoint has batches the
        table lost); the streams below it may meet that, and the one reading the table a refusal of its
        own: the table behind what it read, or a RESTORE's removed rows after it."""
        table = self.rng.choice(sorted(self.table_copies))
        copy, version = self.table_copies.pop(table)
        path = self._table(table)
        held_before = self._bronze_ids() if table == "bronze" else set()
        now = latest_snapshot(self.spark, path).version() if self._exists(path) else None
        how = self.rng.choice(["copy", "RESTORE"]) if now is not None and now > version else "copy"
        if how == "copy":
            self._delete(path)
            copy_directory(self.spark, str(copy), path)
        else:
            try:
                self.spark.sql(f"RESTORE TABLE delta.`{path}` TO VERSION AS OF {version}").collect()
            except Exception as error:  # noqa: BLE001 - files VACUUM removed: the operator cannot restore
                return f"RESTORE {table} to version {version} failed: {str(error).splitlines()[0][:120]}"
        owner = self._owner(table)
        gone = self._forget_rolled_away(held_before) if table == "bronze" else 0
        kinds = {TABLE_AHEAD, MISMATCH, BATCHES_MISSING, VERSION_BEHIND, TABLE_RESTORED}
        egresses = set(self.streams[len(self.layers) :])
        # The streams that read the table as a Delta stream (the fused stream reads none of them back).
        layered = {"bronze": {"silver"}, "silver": {"gold"}, "gold": egresses}
        readers = (layered if self.layers == STREAMS else {"gold": egresses}).get(table, set())
        for stream in self._downstream(owner):
            # Whether the table lost a batch of its stream (and not only maintenance commits) is not
            # known here: a refusal may come, or not; the oracle judges what the way out leaves.
            egress = {MARKER_MOVED, MARKER_LOST} if stream in egresses else set()
            # An egress reads gold's change feed, in which a RESTORE's removed rows are changes.
            reading = {SOURCE_BEHIND} | ({SOURCE_REWRITTEN} if stream in self.layers else set())
            self.expect(stream, kinds | egress | (reading if stream in readers else set()), False)
        at = f"version {now}" if now is not None else "no table"
        lost = f"; {gone} committed records gone with Kafka's copy" if gone else ""
        return f"{table} put back from {at} to version {version} ({'its older copy' if how == 'copy' else how}){lost}"

    def _forget_rolled_away(self, held_before: set[str]) -> int:
        """Forget (as lost) each committed record bronze held before its table was put back and holds no
        more, which Kafka no longer holds either (retention deleted it after bronze read it): nothing can
        bring it back. Bronze's start after the way out of the rollback (a reset, which resumes after what
        the table holds) then meets Kafka's loss, and its way out accepts it. Until a reset of bronze with
        the layers below it rebuilds silver from the table, silver still holds such records: a reset of
        bronze alone would keep them there, so ``reset`` plays none meanwhile. Returns how many."""
        in_kafka = set()
        for topic in self.topics:
            in_kafka |= {record_id(value) for _, _, _, value, _ in read_topic(self.client, topic, "read_committed")}
        gone = sorted((held_before - self._bronze_ids() - in_kafka) & set(self.ledger.committed))
        for name in gone:
            del self.ledger.committed[name]
            self.ledger.lost.add(name)
        if gone:
            self.expect(self.reader, {SOURCE_LOST}, False)
            self.silver_holds_lost = True
        self.report.records_rolled_away += len(gone)
        return len(gone)

    def lose(self) -> str:
        stream = self.rng.choice(self.streams)
        self._delete(self.checkpoint(stream))
        self.predictions.checkpoint_lost(stream)
        # Bronze and silver resume without one; gold's rows are sums, which it would count again (the fused
        # stream's too: its tables hold rows once bronze does); an egress starts a new stream id, which
        # publishes gold's current rows as a new changelog.
        if (stream == "gold" and self._has_rows("gold")) or (stream == FUSED_STREAM and self._has_rows("bronze")):
            self.expect(stream, {CHECKPOINT_LOST}, True)
        return f"{stream}'s checkpoint deleted"

    def reset(self) -> str:
        stream = self.rng.choice(self.streams)
        # A reset of bronze alone would leave silver holding records a rollback lost (_forget_rolled_away).
        only = stream in ("bronze", "silver", FUSED_STREAM) and self.rng.random() < 0.5
        only = only and not (self.silver_holds_lost and stream == self.reader)
        code, output = self._run(("checkpoints", "reset", stream, *(["--only"] if only else []), "--yes"), None)
        self.expect_ok(f"checkpoints reset {stream}", code, output)
        if code == 0:
            # A reset rebuilds the stream and, without --only, everything downstream of it.
            self._refusals_cleared(stream, downstream=not only, reset=True)
        return f"{stream}{' --only' if only else ''} exit {code}"

    def maintain(self) -> str:
        table = self.rng.choice(sorted(TABLES))
        path = self._table(table)
        if not self._has_rows(table):
            return f"{table} is empty"
        operation = self.rng.choice(["OPTIMIZE", "VACUUM"])
        running = None
        if not self.pending_refusals() and self.rng.random() < 0.5:
            self.work()
            running = self.start("run", "--layer", "all")
        outcome = "done"
        try:
            self.spark.sql(f"{operation} delta.`{path}`").collect()
        except Exception as error:  # noqa: BLE001 - a maintenance job losing a race to a stream is allowed
            # Delta fails the later of two conflicting commits (an OPTIMIZE racing a MERGE); an operator
            # runs it again. What matters is that the stream's commits are whole, which the oracle judges.
            outcome = f"failed: {str(error).splitlines()[0][:120]}"
        finally:
            if running is not None:
                time.sleep(self.rng.uniform(0.0, 5.0))
                self._kill(*running, f"run during {operation}")
        return f"{operation} {table}{' while a run wrote' if running else ''}: {outcome}"

    def foreign(self) -> str:
        """Another application appends rows to bronze, silver, quarantine or gold (a hand-made backfill),
        while a continuous run may be writing: Delta commits both, and the pipeline's commits stay whole.
        The rows are copies of the table's own: as they are (bronze: records it holds twice, which silver
        must keep once), with other coordinates (silver, quarantine) or windows years later (gold), and
        flow downstream with the next run (silver's into gold and the egresses). Then both the oracle and
        the audit must find the lakehouse wrong; the operator takes the way out the runbook gives for what
        the audit reports (`checkpoints drop-bronze-copies`, `checkpoints reset silver`, or `gold`), and
        from then on every drain must be exact again."""
        table = self.rng.choice(["bronze", "silver", "quarantine", "gold"])
        if self.pending_refusals() or not self._has_rows(table):
            return self.drain()
        path = self._table(table)
        rows = self.spark.read.format("delta").load(path).limit(self.rng.randint(1, 3))
        if table == "gold":
            shift = expr(f"INTERVAL {FOREIGN_DAYS} DAYS")
            foreign = rows.withColumns(
                {"window_start": col("window_start") + shift, "window_end": col("window_end") + shift}
            )
        elif table == "bronze":
            foreign = rows
        else:
            foreign = rows.withColumn("offset", col("offset") + FOREIGN_OFFSET)
        running = None
        if self.rng.random() < 0.5:
            self.work()
            running = self.start("run", "--layer", "all")
        try:
            foreign.write.format("delta").mode("append").save(path)
        finally:
            if running is not None:
                time.sleep(self.rng.uniform(0.0, 5.0))
                self._kill(*running, f"run while a foreign writer appended to {table}")
        code, output = self.command("run", "--layer", "all", "--available-now")
        self.expect_ok(f"run --layer all after rows appended to {table}", code, output)
        wrong, clean, verdict = self.judge()
        if not wrong or clean:
            self.report.anomalies["foreign_rows_not_found"] += 1
            self.report.findings.append(f"rows appended to {table}: oracle found {wrong or 'nothing'}, audit {verdict}")
        stream = self._owner("gold" if table == "gold" else "silver")
        # Bronze holds the only copy of the raw records: its copies are dropped, then silver is reset (the
        # fused stream never reads bronze back: only bronze is mended).
        way_out = ("drop-bronze-copies",) if table == "bronze" else ("reset", stream)
        code, output = self._run(("checkpoints", *way_out, "--yes"), None)
        self.expect_ok(f"checkpoints {' '.join(way_out)}", code, output)
        self._refusals_cleared(stream, downstream=True, reset=True)
        way = f"audit {verdict}; checkpoints {' '.join(way_out)} exit {code}"
        return f"rows appended to {table}{' while a run wrote' if running else ''}: {way}"

    def retention(self) -> str:
        """Kafka deletes the oldest records of one partition, as retention does. Half the time only
        records bronze holds (nothing is lost), otherwise also records it has not read yet, through a
        committed one: bronze's next start must refuse to skip them and name the way out. The runner
        forgets those records (they are lost on purpose); a start that skips them without a refusal
        shows as a predicted refusal missed.

        Only topics that delete by retention: Kafka refuses to delete records of a compacted one
        (POLICY_VIOLATION), whose cleaner ``compact`` plays instead."""
        held = {partition: end for partition, end in self._bronze_ends().items() if self._deletes(partition[0])}
        if not held:
            return "bronze holds no record of a topic that deletes by retention yet"
        past = self.rng.random() < 0.5 and not self.pending_refusals(self.reader)
        unread = self._unread_committed(held) if past else []
        if past and not unread:
            self.produce(committed=True)  # to a topic of the run: perhaps a compacted one, then none is unread
            unread = self._unread_committed(held)
        if unread:
            partition = self.rng.choice(sorted({(topic, number) for topic, number, _, _ in unread}))
            in_partition = sorted(
                (offset, key) for topic, number, offset, key in unread if (topic, number) == partition
            )
            through = self.rng.randrange(len(in_partition))
            cut = in_partition[through][0] + 1
            lost = [key for _, key in in_partition[: through + 1]]
        else:
            partition = self.rng.choice(sorted(held))
            cut = self.rng.randint(1, held[partition])
            lost = []
        topic, number = partition
        for future in self.admin.delete_records([TopicPartition(topic, number, cut)]).values():
            future.result(30)
        for key in lost:
            del self.ledger.committed[key]
            self.ledger.lost.add(key)
        if lost:
            self.expect(self.reader, {SOURCE_LOST}, True)
        what = f"{len(lost)} committed records bronze had not read" if lost else "only records bronze holds"
        return f"{topic}[{number}] deleted below offset {cut}: {what}"

    def _deletes(self, topic: str) -> bool:
        """Whether ``topic`` deletes by retention now: not one named a changelog (left compacted)."""
        return topic not in self.compacted

    def add_partition(self) -> str:
        """One more partition in the topic: the producer's keys spread over it from now on."""
        self.partitions += 1
        self.admin.create_partitions([NewPartitions(self.topic, self.partitions)])[self.topic].result(30)
        # The producer learns of it now, not at its next metadata refresh minutes later.
        self.producer.list_topics(self.topic, timeout=10)
        return f"the topic has {self.partitions} partitions"

    def restart_broker(self) -> str:
        """The broker stopped and started again while a continuous run of every stream writes. The run
        must carry on through the restart: the records committed after it reach bronze, or the run is an
        anomaly (then stopped either way). A refusal predicted for a start is met first, by a run to the
        end of what is there, so that the continuous run starts."""
        if self.pending_refusals():
            code, output = self.command("run", "--layer", "all", "--available-now")
            self.expect_ok("run --layer all before a broker restart", code, output)
        self.work()
        process, log_path = self.start("run", "--layer", "all")
        if not wait_while_running(lambda: BATCH_DONE in log_path.read_text(errors="replace"), process, 300):
            self.report.findings.append(f"run --layer all ended or stalled before a batch: see {log_path}")
        self.broker.stop(timeout=10)
        time.sleep(self.rng.uniform(0.0, 3.0))
        self.broker.start()
        before = set(self.ledger.committed)
        self.produce(committed=True, repeat=False)  # new keys: nothing a compacted topic could remove
        after = sorted(set(self.ledger.committed) - before)
        resumed = wait_while_running(lambda: self._in_bronze(after), process, 180, every_s=2.0)
        if not resumed:
            self.report.anomalies["runs_stalled_by_a_broker_restart"] += 1
            self.report.findings.append(f"the run did not take in records after the broker restart: see {log_path}")
        self._stop(process, log_path, "run across a broker restart")
        return f"broker restarted while a run wrote: {'it carried on' if resumed else 'it stalled'}"

    def subscribe(self) -> str:
        """One more topic in ``kafka.topics``, with a committed transaction in it: Spark reads a topic added
        to the subscription from its first offset, and the producer spreads records over every topic."""
        topic = f"{self.run}-t{len(self.topics) + 1}"
        self.admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(30)
        self.topics.append(topic)
        self.env["KAFKA_TOPICS"] = ",".join(self.topics)
        self.produce(committed=True, topic=topic)  # at least one record
        return f"{topic} subscribed: {len(self.topics)} topics"

    def compact(self) -> str:
        """One of the run's topics made compacted (``cleanup.policy`` compact, cleaned within seconds), and a
        transaction that repeats earlier keys of it, so the log cleaner has records to remove. Bronze's next
        start must refuse the topic and write nothing. Then the operator takes one of the two ways out the
        refusal names: the policy set back (what the cleaner removed before bronze read it is gone, and the
        runner stops expecting it), or the topic named in ``kafka.compacted_topics``, a changelog by design
        (from then on, before every judgement, the runner forgets each record the cleaner removed before
        bronze read it: one a later committed record with its key superseded, which is what compaction
        means; any other missing record stays an anomaly)."""
        candidates = [topic for topic in self.topics if topic not in self.compacted]
        if not candidates or self.pending_refusals(self.reader):
            return self.step()
        topic = self.rng.choice(candidates)
        self._alter_topic(topic, COMPACT_AT_ONCE)
        if topic not in self.compacted_once:
            self.compacted_once.append(topic)
        self.produce(committed=True, topic=topic, repeat=True)
        cleaned = self._until_cleaned(topic)
        before = self._stream_state(self.reader)
        code, output = self._run(("run", "--layer", self.reader, "--available-now"), None)
        if code == REFUSED and SOURCE_COMPACTED in refusals_found(output):
            self.report.refusals[SOURCE_COMPACTED] += 1
        else:
            self.report.anomalies["compacted_topics_not_refused"] += 1
            self.report.findings.append(
                f"{topic} compacted: run --layer {self.reader} exited {code}: {_last_lines(output)}"
            )
        if self._stream_state(self.reader) != before:
            self.report.anomalies["refused_starts_that_wrote"] += 1
            self.report.findings.append(f"{topic} compacted: the refused {self.reader} moved its table or checkpoint")
        what = f"{topic} compacted ({'cleaned' if cleaned else 'not cleaned yet'}): refused"
        if self.rng.random() < 0.5:
            self._alter_topic(topic, {"cleanup.policy": "delete"})
            removed = self._forget_compacted([topic])
            return f"{what}; policy set back ({removed} records removed before bronze read them)"
        self.compacted.append(topic)
        self.env["KAFKA_COMPACTED_TOPICS"] = ",".join(self.compacted)
        return f"{what}; named in kafka.compacted_topics"

    def _until_cleaned(self, topic: str, timeout_s: float = 60.0) -> bool:
        """Whether Kafka's log cleaner removed a committed record of ``topic`` within ``timeout_s``. A record
        with a new key every two seconds rolls the segment, which the cleaner then takes (as the audit's test
        of compacted topics does)."""

        def held() -> set[str]:
            return {record_id(value) for _, _, _, value, _ in read_topic(self.client, topic, "read_committed")}

        there = held()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            time.sleep(2)
            self.produce(committed=True, topic=topic, repeat=False, count=1)
            if there - held():
                return True
        return False

    def _alter_topic(self, topic: str, settings: dict[str, str]) -> None:
        entries = [
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET) for name, value in settings.items()
        ]
        resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
        for future in self.admin.incremental_alter_configs([resource]).values():
            future.result(30)

    def _forget_compacted(self, topics: list[str]) -> int:
        """Forget (as lost) each committed record of ``topics`` that Kafka's log cleaner removed before bronze
        read it: in neither Kafka nor bronze, with a later committed record of the same key in its topic.
        Returns how many."""
        if not topics:
            return 0
        bronze = self._bronze_ids()
        forgotten = 0
        for topic in topics:
            held = {record_id(value) for _, _, _, value, _ in read_topic(self.client, topic, "read_committed")}
            placed = [(name, key) for name, (where, key) in self.placed.items() if where == topic]
            last_of = {}
            for name, key in placed:
                last_of[key] = max(last_of.get(key, name), name)
            for name, key in placed:
                if name in self.ledger.committed and name not in held and name not in bronze and last_of[key] > name:
                    del self.ledger.committed[name]
                    self.ledger.lost.add(name)
                    forgotten += 1
        self.report.records_compacted_away += forgotten
        return forgotten

    def reconfigure(self) -> str:
        """A config key changed on a lakehouse that must refuse it: gold's window (gold has rows), or a
        topic dropped from the subscription (bronze has a checkpoint). The refused start must name it and
        write nothing to the stream's table or checkpoint. Then the operator sets the key back, or, for
        the window, half the time keeps the new one and takes the way out the refusal names (gold is
        rebuilt at the new window, and the oracle judges it at that window from then on)."""
        from ..pipeline.config import duration_seconds

        changes = []
        if not self.pending_refusals(self.aggregator) and self._has_rows("gold"):
            changes.append("window")
        if (
            len(self.topics) > 1
            and not self.pending_refusals(self.reader)
            and self.committed_batches(self.checkpoint(self.reader))
        ):
            changes.append("topics")
        if not changes:
            return self.step()
        if self.rng.choice(changes) == "window":
            stream, kind = self.aggregator, WINDOW_CHANGED
            window = (
                "5 minutes" if duration_seconds(self.config.gold_window, "pipeline.gold_window") != 300 else "1 minute"
            )
            changed = {"PIPELINE_GOLD_WINDOW": window}
            what = f"gold_window {self.config.gold_window!r} -> {window!r}"
        else:
            stream, kind = self.reader, TOPIC_DROPPED
            dropped = self.rng.choice(self.topics)
            changed = {
                "KAFKA_TOPICS": ",".join(topic for topic in self.topics if topic != dropped),
                "KAFKA_COMPACTED_TOPICS": ",".join(topic for topic in self.compacted if topic != dropped),
            }
            what = f"{dropped} dropped from kafka.topics"
        before = self._stream_state(stream)
        code, output = self._run(("run", "--layer", stream, "--available-now"), changed)
        if code == REFUSED and kind in refusals_found(output):
            self.report.refusals[kind] += 1
        else:
            self.report.anomalies["config_changes_not_refused"] += 1
            self.report.findings.append(f"{what}: run --layer {stream} exited {code}: {_last_lines(output)}")
        if self._stream_state(stream) != before:
            self.report.anomalies["refused_starts_that_wrote"] += 1
            self.report.findings.append(f"{what}: the refused {stream} moved its table or checkpoint")
        if kind == WINDOW_CHANGED and self.rng.random() < 0.5:
            self.env.update(changed)
            self.config = self.config.model_copy(update={"gold_window": changed["PIPELINE_GOLD_WINDOW"]})
            self.expect(self.aggregator, {WINDOW_CHANGED}, True)
            code, output = self.command("run", "--layer", "all", "--available-now")
            self.expect_ok(f"run --layer all after {what}", code, output)
            return f"{what}: refused, then kept through the way out (exit {code})"
        return f"{what}: refused, then set back"

    def _stream_state(self, stream: str) -> tuple:
        """What a start of ``stream`` may not move when refused: its table's rows (the last version that
        changed them: a refusal may record what it found as a table property) and its checkpoint's logs."""
        table = "bronze" if stream == FUSED_STREAM else stream  # the fused stream's first table
        history = DeltaTable.forPath(self.spark, self._table(table)).history()
        version = history.where(col("operation") != "SET TBLPROPERTIES").agg(max_("version")).first()[0]
        checkpoint = self.checkpoint(stream)
        return version, batch_ids(self.spark, f"{checkpoint}/offsets"), self.committed_batches(checkpoint)

    # --- what the runner knows ----------------------------------------------------------------

    def expect(self, stream: str, kinds: set[str], certain: bool) -> None:
        self.predictions.expect(stream, kinds, certain)

    def pending_refusals(self, stream: str | None = None) -> set[str]:
        """The refusals a start of ``stream`` (None: every stream) may meet."""
        return self.predictions.pending(self.streams if stream is None else (stream,))

    def certain_refusal(self, stream: str | None = None) -> bool:
        return self.predictions.certain(self.streams if stream is None else (stream,))

    def _refusals_cleared(self, stream: str | None = None, downstream: bool = False, reset: bool = False) -> None:
        """A stream ran (or was ``reset``): the refusals predicted for it, and with ``downstream`` for the
        layers a reset of it rebuilds (``reset_cascade``), are behind it."""
        names = self.streams if stream is None else reset_cascade(self.layers, stream) if downstream else (stream,)
        self.predictions.cleared(names, reset=reset)
        if reset and downstream and stream == self.reader:
            self.silver_holds_lost = False

    def _downstream(self, stream: str) -> tuple[str, ...]:
        """``stream`` and every stream that reads what it writes: a layer's are the layers above it and
        every egress; an egress has none."""
        if stream not in self.layers:
            return (stream,)
        return (*self.layers[self.layers.index(stream) :], *self.streams[len(self.layers) :])

    def _owner(self, table: str) -> str:
        """The stream that writes ``table``: its layer's, or the fused stream."""
        if self.layers != STREAMS:
            return FUSED_STREAM
        return "silver" if table == "quarantine" else table

    def _stream_with_work(self) -> tuple[str, int] | None:
        """A stream whose next batch will have records, and that batch's id; None when the stream's
        next start is predicted to refuse (the caller lets a plain run meet the refusal instead)."""
        stream = self.rng.choice(self.streams)
        if self.pending_refusals(stream):
            return None
        self._feed(stream)
        return stream, self.next_batch(stream)

    def _feed(self, stream: str) -> None:
        """Records (``work``), carried up to ``stream``'s input, so that its next batch has work."""
        self.work()
        for upstream in self.layers[: self.layers.index(stream)] if stream in self.layers else self.layers:
            code, output = self.command("run", "--layer", upstream, "--available-now")
            self.expect_ok(f"run --layer {upstream}", code, output)

    def checkpoint(self, stream: str) -> str:
        return Lakehouse(self.config.lakehouse_root).checkpoint(stream)

    def _filesystem(self, path: str):
        return hadoop_filesystem(self.spark, path)

    def committed_batches(self, checkpoint: str) -> list[int]:
        return batch_ids(self.spark, f"{checkpoint}/commits")

    def next_batch(self, stream: str) -> int:
        """The id of ``stream``'s next batch: a logged batch without a commit is replayed under its id."""
        logged = batch_ids(self.spark, f"{self.checkpoint(stream)}/offsets")
        committed = self.committed_batches(self.checkpoint(stream))
        if logged and max(logged) > max(committed, default=-1):
            return max(logged)
        return max(committed, default=-1) + 1

    def _delete(self, path: str) -> None:
        hadoop_path, filesystem = self._filesystem(path)
        filesystem.delete(hadoop_path, True)

    def _table(self, table: str) -> str:
        return Lakehouse(self.config.lakehouse_root).table(TABLES[table])

    def _has_rows(self, table: str) -> bool:
        path = self._table(table)
        if not self._exists(path):
            return False
        return self.spark.read.format("delta").load(path).limit(1).count() > 0

    def _sink_commits(self, table: str) -> Counter:
        """The commits to ``table`` that carry a stream's tag (a ``txn`` action), by operation: ``append``
        for a write that added files (a fence adds none), ``MERGE`` for a MERGE. Read from the Delta log's
        commit files as they stand, with Spark alone."""
        path = self._table(table)
        if not self._exists(path):
            return Counter()
        log = self.spark.read.text(f"{path}/_delta_log/*.json").withColumn("commit", input_file_name())
        commits = log.groupBy("commit").agg(
            max_(get_json_object("value", "$.txn.appId").isNotNull().cast("int")).alias("tagged"),
            max_(get_json_object("value", "$.commitInfo.operation")).alias("operation"),
            max_(get_json_object("value", "$.add.path").isNotNull().cast("int")).alias("adds"),
        )
        appended = (col("operation") == "WRITE") & (col("adds") == 1)
        ways = commits.where((col("tagged") == 1) & (appended | (col("operation") == "MERGE")))
        rows = ways.groupBy("operation").count().collect()
        return Counter({"append" if row.operation == "WRITE" else row.operation: row["count"] for row in rows})

    def _bronze_ends(self) -> dict[tuple[str, int], int]:
        """For each (topic, partition) of the run's topics bronze holds records of: the offset after its last one."""
        path = Lakehouse(self.config.lakehouse_root).table(BRONZE)
        if not self._exists(path):
            return {}
        rows = self.spark.read.format("delta").load(path).where(col("topic").isin(self.topics))
        lasts = rows.groupBy("topic", "partition").agg(max_("offset").alias("last")).collect()
        return {(row.topic, row.partition): row.last + 1 for row in lasts}

    def _unread_committed(self, ends: dict[tuple[str, int], int]) -> list[tuple[str, int, int, str]]:
        """The committed records of the ledger that Kafka holds past bronze's last one, in the topics bronze
        has read from: (topic, partition, offset, key)."""
        unread = []
        for topic in sorted({topic for topic, _ in ends}):
            for partition, offset, _, value, _ in read_topic(self.client, topic, "read_committed"):
                name = record_id(value)
                if name in self.ledger.committed and offset >= ends.get((topic, partition), 0):
                    unread.append((topic, partition, offset, name))
        return unread

    def _in_bronze(self, names: list[str]) -> bool:
        """Whether bronze holds each of the records ``names`` (their ids, ``record_id``)."""
        return set(names) <= self._bronze_ids()

    def _bronze_ids(self) -> set[str]:
        """The ids (``record_id``) of the records bronze holds of the run's topics."""
        path = self._table("bronze")
        if not self._exists(path):
            return set()
        values = self.spark.read.format("delta").load(path).where(col("topic").isin(self.topics)).select("value")
        return {record_id(None if row.value is None else bytes(row.value)) for row in values.collect()}

    def _exists(self, path: str) -> bool:
        hadoop_path, filesystem = self._filesystem(path)
        return bool(filesystem.exists(hadoop_path))

    def _read(self, path: str) -> str:
        hadoop_path, filesystem = self._filesystem(path)
        if not filesystem.exists(hadoop_path):
            return ""
        stream = filesystem.open(hadoop_path)
        try:
            return java_class(self.spark, "org.apache.commons.io.IOUtils").toString(stream, "UTF-8")
        finally:
            stream.close()


def copy_directory(spark, source: str, target: str) -> bool:
    """Copy directory ``source`` to ``target`` (any Hadoop URIs), as a backup tool would; False when there
    is no source.

    File by file, each onto its own path: Hadoop's copy of a directory nests it inside a target
    directory that a store still reports as existing (S3 does, for a directory just deleted), and a
    table copied that way has an empty ``_delta_log``. The target then holds exactly the source's
    files: one a delete left behind is removed.

    Example::

        copy_directory(spark, "s3a://lake/prefix/checkpoints/silver", "/tmp/copies/silver-12")  # True
    """
    source_path, source_fs = hadoop_filesystem(spark, source)
    target_path, target_fs = hadoop_filesystem(spark, target)
    if not source_fs.exists(source_path):
        return False
    hadoop_path = java_class(spark, "org.apache.hadoop.fs.Path")
    directories, files = _walk(source_fs, source_path)
    for relative in ["", *directories]:
        target_fs.mkdirs(hadoop_path(f"{target_path}/{relative}"))
    for relative in files:
        source_file, target_file = hadoop_path(source_path, relative), hadoop_path(target_path, relative)
        _copy_file(spark, source_fs, source_file, target_fs, target_file)
    for relative in set(_walk(target_fs, target_path)[1]) - set(files):
        target_fs.delete(hadoop_path(target_path, relative), False)
    if sorted(_walk(target_fs, target_path)[1]) != sorted(files):
        raise RuntimeError(f"copying {source} to {target} left other files than the source's")
    if batch_ids(spark, f"{source}/commits") != batch_ids(spark, f"{target}/commits"):
        raise RuntimeError(f"copying {source} to {target} did not copy its commit log")
    return True


def _walk(filesystem, root, relative: str = "") -> tuple[list[str], list[str]]:
    """The directories and the files under the Hadoop path ``root``, relative to it."""
    directories, files = [], []
    for status in filesystem.listStatus(root):
        name = f"{relative}{status.getPath().getName()}"
        if status.isDirectory():
            below = _walk(filesystem, status.getPath(), f"{name}/")
            directories += [name, *below[0]]
            files += below[1]
        else:
            files.append(name)
    return directories, files


def _copy_file(spark, source_fs, source, target_fs, target) -> None:
    util = java_class(spark, "org.apache.hadoop.fs.FileUtil")
    for attempt in range(COPY_ATTEMPTS):
        try:
            util.copy(source_fs, source, target_fs, target, False, True, spark._jsc.hadoopConfiguration())
            return
        except Py4JJavaError as error:
            # S3's 412 to a read whose If-Match names an ETag the file no longer has: seen on
            # checkpoint files a reset deleted and wrote again after this process last copied
            # them (S3A's reader keeps what it learnt of a file). Taken again, as an operator's
            # backup tool would; the next read finds the file as it is.
            if attempt + 1 == COPY_ATTEMPTS or not CHANGED_WHILE_READ.search(str(error.java_exception)):
                raise
            time.sleep(1)


def way_out_of(output: str) -> str | None:
    """The `checkpoints ...` command the last refusal in ``output`` names as its way out, if any.

    Example::

        way_out_of(output_of_a_refused_start)  # "checkpoints reset gold"
    """
    commands = WAY_OUT.findall(output)
    return commands[-1] if commands else None


def reset_cascade(layers: tuple[str, ...], stream: str) -> tuple[str, ...]:
    """The streams `checkpoints reset <stream>` (without ``--only``) starts anew: ``stream`` and the layers
    above it. Never an egress below them: its checkpoint stays, and so does what it was bound to meet.

    Example::

        reset_cascade(("bronze", "silver", "gold"), "silver")  # ("silver", "gold")
        reset_cascade(("bronze", "silver", "gold"), "kafka_egress")  # ("kafka_egress",)
    """
    if stream not in layers:
        return (stream,)
    return tuple(layers[layers.index(stream) :])


def reset_by(command: list[str]) -> tuple[str, bool] | None:
    """The stream a way out resets and whether the streams below it are reset too (no ``--only``);
    None for a way out that is no reset.

    Example::

        reset_by(["checkpoints", "reset", "silver"])  # ("silver", True): gold is rebuilt with it
    """
    if isinstance(command, str):
        raise TypeError("command must be the way out's words, not one string")
    if command[:2] != ["checkpoints", "reset"] or len(command) < 3:
        return None
    return command[2], "--only" not in command


def refusals_found(output: str) -> set[str]:
    """The refusals the nemesis predicts that ``output`` shows."""
    return {kind for kind, words in FOUND.items() if words in output}


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


def compiled_java_options(options: str) -> str:
    """``JAVA_TOOL_OPTIONS`` that start a JVM compiling every batch: ``options`` with any other
    ``spark.sql.codegen.factoryMode`` taken out (the test suite's ``NO_CODEGEN``).

    Example::

        compiled_java_options("-Xss4m -Dspark.sql.codegen.factoryMode=NO_CODEGEN")
        # "-Xss4m -Dspark.sql.codegen.factoryMode=CODEGEN_ONLY"
    """
    kept = [option for option in options.split() if FACTORY_MODE not in option]
    return " ".join([*kept, f"-D{FACTORY_MODE}={COMPILED}"])


def _last_lines(output: str, lines: int = 6) -> str:
    return " | ".join(line.strip() for line in output.strip().splitlines()[-lines:])


def run_nemesis(
    config,
    logs: Path,
    actions: int | None = None,
    seed: int = 1,
    replay: Schedule | None = None,
    broker=None,
    schedule_file: Path | None = None,
    compiled: bool = False,
    judged: bool = True,
) -> NemesisReport:
    """Play ``actions`` seeded actions, or the schedule ``replay``, against a private topic and lakehouse,
    then judge the end (unless ``judged`` is false). The schedule taken is saved to ``schedule_file``
    after every step.

    ``config`` points at the broker and at a lakehouse of this run only (resolved, as for chaos);
    ``broker``, when the caller started it for this run, is restarted by the ``broker`` action.
    ``compiled`` starts every stream's JVM compiling each batch, however small (``codegen.COMPILED``),
    where production interprets the small batches a schedule makes.

    Example::

        report = run_nemesis(config, workdir / "logs", actions=100, seed=1, schedule_file=workdir / "schedule.json")
        report.clean
    """
    if (actions is None) == (replay is None):
        raise ValueError("run_nemesis takes either a number of actions or a schedule to replay")
    if actions is not None and actions < 1:
        raise ValueError(f"actions must be at least 1, not {actions}")
    logs.mkdir(parents=True, exist_ok=True)
    if replay is not None:
        seed = replay.seed
        # Played in the mode the schedule was taken in: its actions (a fused stream's crash points)
        # and their draws mean nothing in the other.
        config = config.model_copy(update={"mode": replay.mode})
        compiled = replay.compiled
    nemesis = Nemesis(config, seed, logs, broker=broker, schedule_file=schedule_file, compiled=compiled)
    try:
        return nemesis.play(actions, replay=replay, judged=judged)
    finally:
        nemesis.producer.flush(10)
        del nemesis.producer  # its client closes now, before the caller stops the broker


def shortest_failing(actions: list, fails: Callable[[list], bool]) -> list:
    """The shortest sublist of ``actions`` found that still ``fails``: Zeller's delta debugging (ddmin),
    which takes out ever smaller chunks while the rest still fails. ``actions`` must fail.

    Each call of ``fails`` is a whole replay (fresh servers and lakehouse, minutes), so this takes
    about ``n log n`` replays for ``n`` actions, fewer when most actions do not matter.

    Example::

        shortest_failing(list("abcdef"), lambda kept: "b" in kept and "e" in kept)  # ["b", "e"]
    """
    chunks = 2
    while len(actions) >= 2:
        size = -(-len(actions) // chunks)
        starts = range(0, len(actions), size)
        for start in starts:
            rest = actions[:start] + actions[start + size :]
            if rest and fails(rest):
                actions, chunks = rest, max(chunks - 1, 2)
                break
        else:
            if chunks >= len(actions):
                break
            chunks = min(chunks * 2, len(actions))
    return actions


def shrink(schedule: Schedule, workdir: Path) -> Schedule | None:
    """The shortest schedule found that still meets one of ``schedule``'s anomalies, each candidate played
    by ``nemesis --replay`` in a process and a work directory of its own (saved under ``workdir``).

    None when ``schedule`` itself, played again, meets none: what failed depended on timing the
    replay did not repeat (a kill's moment, a busy machine), and its logs are what is left to read."""
    trials = workdir / "shrink"
    trials.mkdir(parents=True, exist_ok=True)
    tried = 0

    def fails(actions: list) -> bool:
        nonlocal tried
        tried += 1
        candidate = schedule.without(actions)
        path = trials / f"trial-{tried:03d}.json"
        candidate.save(path)
        run_dir = trials / f"trial-{tried:03d}"
        with (trials / f"trial-{tried:03d}.log").open("w") as log:
            subprocess.run(
                pipeline_command("nemesis", "--replay", str(path), "--workdir", str(run_dir)),
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
            )
        found: set[str] = set()
        for played in run_dir.glob("*/schedule.json"):
            found |= set(Schedule.load(played).anomalies)
        still = bool(found & set(schedule.anomalies))
        print(f"shrink: trial {tried}, {len(actions)} actions: {'fails' if still else 'passes'}", flush=True)
        return still

    if not fails(schedule.actions):
        return None
    return schedule.without(shortest_failing(schedule.actions, fails))


def _renamed(value, old: str, new: str):
    """``value`` (a draw: a name, a number, a tuple of them) with the run name ``old`` written as ``new``."""
    if isinstance(value, str) and old:
        return value.replace(old, new)
    if isinstance(value, tuple):
        return tuple(_renamed(item, old, new) for item in value)
    return value


def _tuples(value):
    """JSON's lists back into the tuples they were drawn as (a topic and partition, say)."""
    return tuple(_tuples(item) for item in value) if isinstance(value, list) else value
