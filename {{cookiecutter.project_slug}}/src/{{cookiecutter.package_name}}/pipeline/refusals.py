"""Every way the pipeline refuses to start or reset: what it found, why going on would break
exactly-once, and the command that gets out of it. One catalogue, used by the code that refuses.

Each refusal is a member of ``Refusal``. The code that refuses renders it with the facts it found::

    raise CheckpointError(Refusal.TABLE_AHEAD.message("gold", table=..., path=..., ...))

and the runbook's section "When the pipeline refuses to start" (``docs/runbook.md``) is this
catalogue rendered by ``runbook`` (a test compares the two), so a refusal and its explanation
cannot drift apart. Every refusal exits with code 3 from the command line.

This module imports nothing of the pipeline: every layer can use it.
"""

from __future__ import annotations

import string
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from functools import cache
from importlib.metadata import entry_points

PACKAGE = __package__.partition(".")[0]
# The runbook's section is written between these lines.
RUNBOOK_BEGIN = "<!-- refusals: generated from pipeline/refusals.py; a test compares them -->"
RUNBOOK_END = "<!-- end of refusals -->"

# What a reset rebuilds, by the stream reset: the end of most ways out.
REBUILDS = {
    "bronze": "bronze resumes after the Kafka offsets it already holds; silver and quarantine are rebuilt "
    "from bronze and gold from silver, each beside its table and swapped in",
    "silver": "silver and quarantine are rebuilt from bronze and gold from silver, each beside its table "
    "and swapped in",
    "gold": "gold is rebuilt from silver beside the table and replaces its rows in one commit",
    "fused": "silver and quarantine are rebuilt from bronze and gold from silver, each beside its table "
    "and swapped in; the fused stream resumes Kafka after the offsets bronze holds",
}
OTHER_STREAM_REBUILDS = "the stream and everything downstream start over consistently"
# An Entry's ``egress`` for a refusal every egress stream can meet.
ANY_EGRESS = "any egress"


@cache
def console_command() -> str:
    """The command a user types to run this project: its console script, or ``python -m`` without one.

    Example::

        console_command()  # "clickstream-lakehouse"
    """
    for script in entry_points(group="console_scripts"):
        if script.value.partition(":")[0] == f"{PACKAGE}.cli":
            return script.name
    return f"python -m {PACKAGE}"


def reset_command(stream: str, only: bool = False, command: str | None = None) -> str:
    """The exact command that resets ``stream`` and everything downstream of it (``only``: it alone).

    ``command`` is the console script to show (default: this project's; "" for none).

    Example::

        reset_command("gold")  # "`<slug> checkpoints reset gold` (it asks first; add `--yes` ...)"
    """
    if not stream:
        raise ValueError("stream must be a stream name, e.g. 'gold'")
    command = console_command() if command is None else command
    prefix = f"{command} " if command else ""
    return (
        f"`{prefix}checkpoints reset {stream}{' --only' if only else ''}` "
        "(it asks first; add `--yes` when not on a terminal)"
    )


def accept_loss_command(dataset: str | None = None, command: str | None = None) -> str:
    """The exact command that accepts the records Kafka deleted before the bronze of ``dataset`` (a name)
    read them (``command``: as above); without ``dataset``, the command as the runbook shows it.

    Example::

        accept_loss_command("events")  # "`<slug> checkpoints accept-loss --dataset events` (it asks first; ...)"
    """
    command = console_command() if command is None else command
    prefix = f"{command} " if command else ""
    named = f" --dataset {dataset}" if dataset else ""
    return f"`{prefix}checkpoints accept-loss{named}` (it asks first; add `--yes` when not on a terminal)"


def rebuilds(stream: str) -> str:
    """What a reset of ``stream`` does to the tables, in a sentence."""
    return REBUILDS.get(stream, OTHER_STREAM_REBUILDS)


@dataclass(frozen=True)
class Entry:
    """One refusal: its title in the runbook, what usually causes it, and its two templates.

    ``found`` and ``way_out`` are ``str.format`` templates over the facts the refusing code passes,
    plus ``reset`` (the reset command of the subject), ``reset_only`` (the same with ``--only``),
    ``rebuilds`` (what that reset rebuilds) and ``accept`` (the command that accepts lost records).
    ``egress`` names the egress stream an entry belongs to: a project without that egress never meets
    it (``ANY_EGRESS``: every egress can meet it).
    """

    title: str
    happened: str
    found: str
    way_out: str
    status: str | None = None
    egress: str | None = None
    # False when ``found`` names its subject itself (a table refusal reads "silver_events at ... was made ...").
    prefixed: bool = True

    def applies_to(self, installed_egress: Iterable[str]) -> bool:
        """Whether a project with the egress streams ``installed_egress`` can meet this refusal."""
        installed = set(installed_egress)
        if self.egress is None:
            return True
        return bool(installed) if self.egress == ANY_EGRESS else self.egress in installed

    def fields(self) -> set[str]:
        return {
            name
            for template in (self.found, self.way_out)
            for _, name, _, _ in string.Formatter().parse(template)
            if name
        }


class Refusal(Enum):
    """The catalogue. Each member's value is its ``Entry``; render one with ``message``."""

    CHECKPOINT_LOST = Entry(
        title="Gold's checkpoint lost",
        status="lost (sink has rows)",
        happened="the checkpoint of a stream whose table holds sums (gold) was deleted or lost; "
        "bronze and silver, whose rows are Kafka records, resume without their checkpoint on their own",
        found="checkpoint {checkpoint} is missing while {tables} already holds aggregates; "
        "starting over would count them twice.",
        way_out="{reset}: {rebuilds}.",
    )
    OTHER_MODE = Entry(
        title="A stream of the other mode",
        happened="`pipeline.mode` was changed (or one stream of the other mode was started by name) on a "
        "lakehouse the other mode's streams carry on",
        found="the {other} streams ({streams}) carry this lakehouse on (checkpoints {checkpoints}); a {mode} "
        "stream beside them would read Kafka or its source table again from older positions and count records "
        "twice.",
        way_out="stop them, then {switch}: it lets them finish what they read, ends their "
        'checkpoints and starts the {mode} streams exactly where they stopped; set `pipeline.mode = "{mode}"`.',
    )
    REPLAY_FUSED = Entry(
        title="A quarantine replay of a dataset the fused stream carries",
        happened="`quarantine replay` was run while the dataset runs in the fused mode",
        found="the fused stream carries dataset {dataset} on (checkpoint {checkpoint}): it aggregates gold from "
        "each batch it reads from Kafka, not from silver, so records moved into silver would never reach gold.",
        way_out="stop it, then {layered}, run the replay and the layered streams (gold takes the moved records "
        "from silver), and {fused} to go back.",
    )
    METADATA_UNREADABLE = Entry(
        title="Empty or edited checkpoint metadata",
        happened="the first start died while writing the checkpoint's metadata file, or it was edited",
        found="the checkpoint metadata file {path} is {what} (a write cut short, or edited): the stream's id, "
        "which binds the checkpoint to its tables, is unknown.",
        way_out="{reset}: {rebuilds}.",
    )
    MISMATCH = Entry(
        title="A checkpoint that does not match its tables",
        status="mismatch",
        happened="a checkpoint of another stream or lakehouse was put in place, or a table was replaced",
        found="checkpoint {checkpoint} (stream id {stream_id}, last batch {last_batch}) does not match the "
        "tables it writes (recorded ids {recorded}): the checkpoint was swapped or a table replaced, and "
        "resuming would skip or repeat records.",
        way_out="{reset}.",
    )
    TABLE_AHEAD = Entry(
        title="A table ahead of its checkpoint",
        status="table ahead",
        happened="an older copy of the checkpoint was put back, or its `offsets/` and `commits/` deleted",
        found="sink table {table} at {path} has committed batch {batch} of stream {stream_id}, but checkpoint "
        "{checkpoint} is behind it ({progress}): the checkpoint is older than the table (restored from an "
        "older copy, or offsets/ and commits/ deleted). Spark would re-plan those batch ids with other "
        "boundaries and Delta would skip them as already written.",
        way_out="{reset}: {rebuilds}.",
    )
    BATCHES_MISSING = Entry(
        title="Bronze behind its checkpoint",
        status="table behind",
        happened="bronze was replaced by an older copy of its directory",
        found="sink table {table} at {path} has committed only batch {batch} of stream {stream_id}, but "
        "checkpoint {checkpoint} has more ({progress}): the table is older than the checkpoint (replaced by "
        "an older copy), and resuming would never write the missing batches.",
        way_out="{reset}: {rebuilds}.",
    )
    VERSION_BEHIND = Entry(
        title="Silver, quarantine or gold put back from an older copy",
        status="table behind",
        happened="silver, quarantine or gold was replaced by an older copy of its directory",
        found="sink table {table} at {path} is at version {version}, but it was at version {recorded} after "
        "batch {batch}, the last checkpoint {checkpoint} has committed: the table is older than the "
        "checkpoint (replaced by an older copy), and resuming would never write what it lost.",
        way_out="{reset}: {rebuilds}.",
    )
    TABLE_RESTORED = Entry(
        title="A sink restored",
        status="table restored",
        happened="a sink table was `RESTORE`d to a version before some of the stream's commits",
        found="sink table {table} at {path} was restored (RESTORE at table version {at_version} to version "
        "{to_version}), undoing its commits of batches {first}..{last} of stream {stream_id}, while checkpoint "
        "{checkpoint} has them committed ({progress}): resuming would never write them again.",
        way_out="{reset}: {rebuilds}.",
    )
    TXN_RETENTION_SET = Entry(
        title="Transaction retention set on a sink table",
        status="txn retention set",
        happened="`delta.setTransactionRetentionDuration` was set on a sink table",
        found="sink table {table} at {path} sets {property} = {value}: Delta then forgets the (stream id, "
        "batch id) records that make a replayed batch a no-op, and a replay older than that is written twice.",
        way_out="run ALTER TABLE delta.`{path}` UNSET TBLPROPERTIES ('{property}') (spark-sql or spark.sql), "
        "then start again.",
    )
    REBUILD_CUT_SHORT = Entry(
        title="A reset cut short",
        status="rebuild cut short",
        happened="a reset died while it rebuilt the stream's tables",
        found="a reset that rebuilds {tables} was cut short ({table} at {path} still carries the mark of "
        "rebuild {rebuild}): its tables may hold rows of the rebuild and of before it.",
        way_out="{reset}: {rebuilds}.",
    )
    SOURCE_BEHIND = Entry(
        title="A source table put back behind the stream reading it",
        status="source behind",
        happened="the table a stream reads (bronze for silver, silver for gold) was replaced by an older copy of "
        "its directory (perhaps written again since), or by another table",
        found="the stream has read {source} at {path} up to version {read}, but {found}: the table was put back "
        "from an older copy or replaced, and the stream would go on in another history than the one its tables "
        "hold.",
        way_out="{reset}, the reset of the stream that writes {source}: {rebuilds}.",
    )
    SOURCE_REWRITTEN = Entry(
        title="A source table restored or rewritten under the stream reading it",
        status="source rewritten",
        happened="the table a stream reads (bronze for silver, silver for gold) was `RESTORE`d, or rows were "
        "deleted, updated or overwritten in it, after the stream last read it",
        found="{source} at {path} has a commit that removes rows (version {version}, {operation}) after version "
        "{read}, up to which the stream has read it: the stream follows the table's appends only (Spark would "
        "stop there), and what it took from the removed rows would stay in its tables.",
        way_out="{reset}, the reset of the stream that writes {source}: {rebuilds}.",
    )
    CONTRACT_CHANGED = Entry(
        title="Tables made for another event contract",
        happened="the event contract (`pipeline/datasets/events.py`) changed on an existing lakehouse",
        found="{table} at {path} was made for another event contract: {differences}.",
        way_out="to apply the contract, {reset}: {rebuilds} under it.",
        prefixed=False,
    )
    FOREIGN_BRONZE = Entry(
        title="A bronze table of another layout",
        happened="`lakehouse.root` points at another pipeline's lakehouse, or bronze was replaced by a table "
        "this pipeline did not make",
        found="{table} at {path} has another layout than this pipeline's: {differences}.",
        way_out="point lakehouse.root (or LAKEHOUSE_ROOT) at this pipeline's lakehouse, or move that table "
        "away; bronze holds the only copy of the raw records, so nothing resets it.",
        prefixed=False,
    )
    GOLD_WINDOW_CHANGED = Entry(
        title="Gold's window changed",
        happened="`pipeline.gold_window` was changed on an existing lakehouse",
        found="the table {path} holds windows of '{recorded}', but pipeline.gold_window is '{configured}': "
        "going on would add windows of a second size to the same table.",
        way_out="{reset}: gold is rebuilt from silver at '{configured}' beside the table and replaces its rows "
        "in one commit; bronze and silver are left as they are. Or set pipeline.gold_window back to "
        "'{recorded}'.",
    )
    SOURCE_CHANGED = Entry(
        title="A topic created again, or another cluster",
        happened="a topic was deleted and created under the same name, or `kafka.bootstrap_servers` now reaches "
        "another cluster: offsets start again at 0 there. Bronze checks at every start and before every batch",
        found="{changes}, at {bootstrap}. Offsets start again at 0 in a new topic: resuming from the checkpoint "
        "{checkpoint} would skip the new records or take them for others, and starting without it would read "
        "another cluster without a word.",
        way_out="{reset_only}: bronze starts a new checkpoint that reads each new topic from its first offset "
        "and resumes the others after the offsets it holds; every record already in bronze, silver and gold "
        "stays, and silver keeps old and new records apart by topic id. If kafka.bootstrap_servers points at "
        "the wrong cluster, set it back instead.",
    )
    SUBSCRIPTION_CHANGED = Entry(
        title="The subscription changed",
        happened="a topic was dropped from `kafka.topics` (or from a dataset's `topics`), or one was added whose "
        "first records retention already deleted (an added topic that starts at offset 0 is read by Spark itself)",
        found="checkpoint {checkpoint} reads topics {read}, but {topics_key} is {wanted} ({changes}): Spark "
        "would stop on this as lost data at every start.",
        way_out="{reset_only}: bronze alone starts a new checkpoint that resumes each topic after the offsets "
        "bronze holds and reads an added topic from its first offset; a removed topic's records stay in "
        "bronze, silver and gold go on as they are.",
    )
    SOURCE_COMPACTED = Entry(
        title="A compacted topic bronze was not told of",
        happened="a topic bronze reads was created with `cleanup.policy` `compact`, or changed to it. Kafka then "
        "removes a record once a later one has its key, and Spark's source skips the gap without a word, even "
        "with `kafka.fail_on_data_loss`. Bronze checks at every start and before every batch",
        found="{topics}: cleanup.policy compacts, and kafka.compacted_topics {declared} does not name it: Kafka "
        "may remove a record before bronze reads it whenever a later one has its key, and nothing could tell "
        "which records were removed.",
        way_out="if the topic must keep every record, set its policy back (kafka-configs.sh --bootstrap-server "
        "{bootstrap} --alter --entity-type topics --entity-name {topic} --add-config cleanup.policy=delete; "
        "records the log cleaner removed meanwhile are gone: Kafka keeps no trace of them). If it is a changelog "
        "by design, whose newest record of each key is what counts, add it to `kafka.compacted_topics` "
        "(`KAFKA_COMPACTED_TOPICS`): bronze then holds at least the newest record of each key, and the audit "
        "reports that it cannot count the superseded records bronze never saw.",
    )
    SOURCE_RECORDS_LOST = Entry(
        title="Records Kafka deleted before bronze read them",
        happened="bronze fell further behind than the topic's retention, or stopped for longer, or records "
        'were deleted on request; Spark stops a running bronze on it with "Some data may have been lost '
        'because they are not available in Kafka any more". Bronze checks at every start',
        found="Kafka no longer holds the records bronze needs next: {gaps}. They were deleted before bronze "
        "read them, and nothing can read them again: resuming would stop on them, and skipping them would "
        "lose them without a word.",
        way_out="bring them back into the topic if any system still holds them (they then get new offsets, "
        "above the gap, and bronze reads them as new records), then accept the gap: {accept} records these "
        "offsets on bronze, where the audit reports them as lost, and starts bronze's checkpoint anew after "
        "them; silver, gold and every record already in bronze stay as they are. Keep it from happening "
        "again: give the topic a retention longer than bronze's longest stop.",
    )
    LEASE_HELD = Entry(
        title="Another process runs this stream",
        happened="the stream runs elsewhere (a deploy overlap), or its holder on another host died less than "
        "a lease's time to live ago",
        found="another process runs this stream: lease {path} is held by {holder}, renewed {age} s ago.",
        way_out="stop it first: `kill -TERM {pid}` on host {host} (it stops after its current batch). If it is "
        "gone, the lease expires at {expires} (ttl {ttl} s); a process on this host that died frees it at once.",
    )
    LEASE_RACE = Entry(
        title="Two processes took a lease at the same moment",
        happened="two processes started the same stream at once; one of them won",
        found="another process took the lease {path} at the same moment.",
        way_out="try again.",
    )
    LEASE_OWN = Entry(
        title="This process already runs the stream",
        happened="one process asked to start a stream it already runs",
        found="this process already runs the stream (lease {path}).",
        way_out="stop that query first.",
    )
    LEASE_LOST = Entry(
        title="A stream that lost its lease while it ran",
        happened="the process stood still (a long GC pause, SIGSTOP, a frozen VM, a storage stall) or could not "
        "renew its lease for longer than the lease's time to live less its margin; meanwhile another process may "
        "have taken the stream over or reset it",
        found="this process lost lease {path}: it last renewed it {age} s ago, and may write only for {limit} s "
        "after a renewal (pipeline.lease_ttl {ttl} s less a quarter) while no other process took it. It stops the "
        "stream and writes nothing more to its tables, checkpoint or sink.",
        way_out="nothing to undo: the batch it was writing is replayed by whichever process holds the stream "
        "now. If none does, start it again (`run --layer {stream_name}`); if pauses this long are expected, raise "
        "`pipeline.lease_ttl`.",
    )
    LEASE_RELEASED = Entry(
        title="A write after the stream's lease was let go",
        happened="a batch of this process went on after the process released the stream's lease (its query "
        "had ended and the lease was let go; another process or a reset may hold the stream since)",
        found="this process released lease {path} {ago} s ago: it writes nothing more to the stream's tables, "
        "checkpoint or sink.",
        way_out="nothing to undo: the batch is replayed by whichever process holds the stream now. If none does, "
        "start it again (`run --layer {stream_name}`).",
    )
    RESET_UNCONFIRMED = Entry(
        title="A reset nobody confirmed",
        happened="`checkpoints reset` ran where nothing can ask (not on a terminal) without `--yes`",
        found="refusing to reset {names} without confirmation: this would {what}. Not on a terminal, so nothing "
        "can ask.",
        way_out="run `checkpoints reset {target} --yes` to do it.",
        prefixed=False,
    )
    SWITCH_UNCONFIRMED = Entry(
        title="A switch of modes nobody confirmed",
        happened="`checkpoints switch` ran where nothing can ask (not on a terminal) without `--yes`",
        found="refusing to switch to the {mode} mode without confirmation: this would {what}. Not on a terminal, "
        "so nothing can ask.",
        way_out="run {again} to do it.",
        prefixed=False,
    )
    LOSS_UNCONFIRMED = Entry(
        title="Lost records nobody confirmed accepting",
        happened="`checkpoints accept-loss` ran where nothing can ask (not on a terminal) without `--yes`",
        found="refusing to accept lost records without confirmation: this would {what}. Not on a terminal, so "
        "nothing can ask.",
        way_out="run {again} to do it.",
        prefixed=False,
    )
    COPIES_UNCONFIRMED = Entry(
        title="Dropping bronze's copies nobody confirmed",
        happened="`checkpoints drop-bronze-copies` ran where nothing can ask (not on a terminal) without `--yes`",
        found="refusing to drop copies from bronze without confirmation: this would {what}. Not on a terminal, so "
        "nothing can ask.",
        way_out="run {again} to do it.",
        prefixed=False,
    )
    KAFKA_MARKER_AHEAD = Entry(
        title="The Kafka egress's checkpoint behind its topic",
        egress="kafka_egress",
        happened="the egress's checkpoint is older than the batch marker it committed with the topic's "
        "records (an older copy of the checkpoint put back)",
        found="topic {topic} has batch {batch} of stream {stream_id} committed (consumer group {group}), but "
        "checkpoint {checkpoint} is behind it (last planned batch {planned}): the checkpoint is older than "
        "the topic.",
        way_out="{reset}: a new stream id publishes gold's current rows as a new changelog, with tombstones for "
        "rows gold no longer has, so consumers folding by key end at gold.",
    )
    KAFKA_MARKER_LOST = Entry(
        title="The Kafka egress's marker lost",
        egress="kafka_egress",
        happened="the marker, a consumer group's committed offset, is gone or behind: the group was deleted, its "
        "offsets expired (the broker's offsets.retention.minutes, 7 days by default, without a batch), or the "
        "output topic was deleted or recreated",
        found="topic {topic} has {found} for stream {stream_id} (consumer group {group}), where {needed}: the "
        "topic may lack batches the stream published, so going on could leave consumers folding to a state gold "
        "never had.",
        way_out="{reset}: a new stream id publishes gold's current rows as a new changelog, with tombstones for "
        "rows gold no longer has, so consumers folding by key end at gold.",
    )
    KAFKA_OUTPUT_TOPIC_RECREATED = Entry(
        title="The Kafka egress's output topic created again",
        egress="kafka_egress",
        happened="the output topic was deleted and created again under the same name while the stream "
        "published to it, and the stream's marker outlived it",
        found="topic {topic} has id {now}, but stream {stream_id} published to the topic of id {recorded}: the "
        "topic now lacks the batches published before, and publishing only the next changes would leave "
        "consumers folding it to a state gold never had.",
        way_out="{reset}: a new stream id publishes gold's current rows to the topic whole, so consumers "
        "folding by key end at gold.",
    )
    KAFKA_OUTPUT_PARTITIONS_CHANGED = Entry(
        title="The Kafka egress's output topic has another partition count",
        egress="kafka_egress",
        happened="partitions were added to the output topic (or it was made again with another count) while "
        "the stream published to it",
        found="topic {topic} has {now} partitions, stream {stream_id} published to it with {recorded}: a key's "
        "next change would land in another partition than its earlier ones, and consumers folding the topic "
        "by key could not tell which value is the newest.",
        way_out="publish to a new topic with the partitions you want: create it, set {key} to it, then {reset}: "
        "gold's current rows are published to it whole. Point the consumers at the new topic.",
    )
    POSTGRES_MARKER_MISMATCH = Entry(
        title="The PostgreSQL egress's checkpoint and marker row disagree",
        egress="postgres_egress",
        happened="the marker row or the checkpoint was restored, dropped or emptied (another stream id's batch "
        "0 replaced the table's rows)",
        found="{marker} records batch {batch} of stream {stream_id}, checkpoint {checkpoint} planned batch "
        "{planned} and committed {committed}: the {older} is older than the {newer} (restored, dropped or "
        "emptied by another stream id's batch 0).",
        way_out="{reset}: a new stream id mirrors gold again from its current rows.",
    )
    POSTGRES_MARKER_MOVED = Entry(
        title="The PostgreSQL egress's marker row changed under a running stream",
        egress="postgres_egress",
        happened="while the stream ran, its marker row was deleted, restored from a backup or rolled back, or "
        "another stream id's batch 0 replaced the table's rows",
        found="{marker} holds {found} for stream {stream_id} where batch {batch} needs {expected}: the table "
        "does not hold the batches before this one, so applying it (or making the marker again) would mirror "
        "gold wrongly.",
        way_out="{reset}: a new stream id mirrors gold again from its current rows.",
    )
    POSTGRES_TABLE_LAYOUT = Entry(
        title="A PostgreSQL egress table of another layout",
        egress="postgres_egress",
        happened="the egress's table or its staging table exists with columns another contract (or someone "
        "else) gave it",
        found="{table} has columns {found}, gold's contract gives it {expected}.",
        way_out="drop {tables}, then {reset}: they are made again.",
    )
    EGRESS_CHANGES_REMOVED = Entry(
        title="An egress behind gold changes that VACUUM removed",
        egress=ANY_EGRESS,
        happened="the egress was stopped, or fell behind, for longer than gold's VACUUM retention (or its "
        "log retention), and VACUUM or the log's cleanup removed files of gold versions it had not published",
        found="it publishes gold's changes from version {version} on, but {missing} of version {missing_version} "
        "is gone from {gold}: VACUUM or the log's cleanup removed it before this egress read it.",
        way_out="{reset}: a new stream id publishes gold's current rows whole and removes from the sink what gold "
        "no longer holds. So that it does not happen again, keep gold's VACUUM retention (and "
        "`delta.logRetentionDuration`) longer than an egress can be stopped.",
    )
    EGRESS_SOURCE_BEHIND = Entry(
        title="Gold put back behind an egress",
        egress=ANY_EGRESS,
        happened="gold was replaced by an older copy of its directory (perhaps written again since), or by "
        "another table, after the egress published its changes",
        found="the stream has read {source} at {path} up to version {read}, but {found}: gold was put back from an "
        "older copy or replaced, and publishing on would skip or repeat changes.",
        way_out="{reset}: a new stream id publishes gold's current rows whole and removes from the sink what gold "
        "no longer holds. When gold's own start refuses too, take its way out as well, in either order: the "
        "egress publishes what gold's rebuild changes.",
    )

    @property
    def entry(self) -> Entry:
        return self.value

    def message(self, subject: str, then: str = "", **facts: object) -> str:
        """The refusal as the user reads it: ``subject`` (a stream or table), what was found, the way out.

        ``then`` is added after the way out (what the caller adds, e.g. to run a reset again).

        Example::

            Refusal.MISMATCH.message("gold", checkpoint="/lake/checkpoints/gold", stream_id="6f1c...",
                                     last_batch=7, recorded={"gold_event_windows": "0b2e..."})
        """
        if not subject:
            raise ValueError("subject must name the stream or table refused")
        stream = str(facts.pop("stream", subject))
        given = {
            "reset": reset_command(stream),
            "reset_only": reset_command(stream, only=True),
            "rebuilds": rebuilds(stream),
            "accept": accept_loss_command(),
            **facts,
        }
        missing = self.entry.fields() - set(given)
        if missing:
            raise ValueError(f"{self.name} needs the facts {sorted(missing)}")
        found = self.entry.found.format(**given)
        way_out = self.entry.way_out.format(**given)
        prefix = f"{subject}: " if self.entry.prefixed else ""
        return f"{prefix}{found} Way out: {way_out} {then}".strip()


class _Placeholders(dict):
    """Facts as the runbook shows them: ``<name>`` (``quoted``: as a code span, outside one)."""

    def __init__(self, quoted: bool, **known: str) -> None:
        super().__init__(**known)
        self.quoted = quoted

    def __missing__(self, key: str) -> str:
        return f"`<{key}>`" if self.quoted else f"<{key}>"


def runbook(installed_egress: Iterable[str] = ()) -> str:
    """The runbook's section of refusals, in Markdown: one entry per refusal this project can meet.

    Example::

        print(runbook(egress.installed_names()))
    """
    installed = set(installed_egress)
    # The reset commands without the console script, as the rest of the runbook writes them.
    commands = {
        "reset": reset_command("<stream>", command=""),
        "reset_only": reset_command("<stream>", only=True, command=""),
        "accept": accept_loss_command(command=""),
        "rebuilds": "the stream's tables are rebuilt as [Resetting a stream](#resetting-a-stream) says",
    }
    in_code: Mapping[str, str] = _Placeholders(quoted=False, **commands)
    in_text: Mapping[str, str] = _Placeholders(quoted=True, **commands)
    blocks = [RUNBOOK_BEGIN]
    for refusal in Refusal:
        entry = refusal.entry
        if not entry.applies_to(installed):
            continue
        # Backquotes of the message (a statement to run) would end the code span early.
        says = string.Formatter().vformat(entry.found, (), in_code).replace("`", "'")
        says = f"<subject>: {says}" if entry.prefixed else says
        way_out = string.Formatter().vformat(entry.way_out, (), in_text)
        bullets = [
            _bullet("It says", f"`{says}`"),
            _bullet("What happened", f"{entry.happened}."),
            _bullet("Way out", way_out),
        ]
        if entry.status:
            bullets.insert(1, _bullet("Status in `checkpoints list`", f"`{entry.status}`."))
        blocks.append(f"### {entry.title}\n\n" + "\n".join(bullets))
    blocks.append(RUNBOOK_END)
    return "\n\n".join(blocks) + "\n"


def _bullet(label: str, text: str) -> str:
    return textwrap.fill(
        f"- **{label}:** {text}", width=100, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
    )
