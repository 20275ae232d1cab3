"""How big each measurement is: the default run, the quick (CI smoke) run, or sizes of your own."""

from __future__ import annotations

from dataclasses import dataclass

from ..pipeline.config import duration_seconds

# The numbers of datasets whose streams may run in one driver (bench/datasets_cost.py), fewest first: the
# report has keys for each.
DATASET_COUNTS = (1, 2, 4)


@dataclass(frozen=True)
class Sizes:
    """``None`` takes the value from the pipeline config."""

    records: int  # backlog behind the throughput, exactly-once and recovery phases
    partitions: int  # of the benchmark topic
    max_offsets_per_trigger: int | None  # bronze batch size
    warmup_records: int  # one small pass through everything first, so the JIT is warm
    silver_batch: int  # rows of the silver MERGE batch
    silver_small_table: int
    silver_big_table: int
    silver_table_commits: int  # appends used to build the big table
    gold_small_windows: int  # gold MERGE scaling: windows in the small and in the big gold table
    gold_big_windows: int
    gold_batch_windows: int  # windows one gold MERGE batch touches (half already in the table, half new)
    gold_table_commits: int  # appends used to build the big gold table
    merge_repeats: int
    steady_batch: int | None  # fixed-overhead steady-state batch (default: the bronze batch size)
    overhead_repeats: int
    overhead_trigger: str
    storage_records: int  # backlog the storage phase drains into a local-disk and into an S3 lakehouse
    storage_turns: int  # drains into each storage, taking turns; as many one-record batches through each
    latency_rate: int  # records/s produced while latency is measured
    latency_seconds: float
    latency_trigger: str | None  # default: pipeline.trigger_interval
    latency_fast_trigger: str  # the second latency run, at the fastest setting
    marker_every_s: float
    kill_fraction: float  # recovery kills the drain this far into the undisturbed drain time
    # Recovery in new processes (SIGKILL, cold JVM on restart) or in this one (query.stop(), warm JVM).
    recovery_in_process: bool = False
    timeout_s: float = 1800.0  # any single wait
    egress_rows: int = 200_000  # gold rows each egress and its baseline publish in one batch
    # The peer (SDP, bench/peer.py): the catch-up both drain from empty storage, then an increment on that history.
    peer_records: int = 1_000_000
    peer_increment: int = 10_000
    # Pairs of the fair setup (SDP uncapped, without the dedup), each from fresh storage; of each other setup.
    peer_pairs: int = 5
    peer_variant_pairs: int = 1
    # Distinct scaling (bench/distinct_scaling.py): values each window's key holds in the distinct count's table.
    distinct_values_per_key: int = 4
    # Datasets cost (bench/datasets_cost.py): the backlog of each dataset's topic, and how many datasets run in
    # one driver, in turn (fewest first, from 1, among DATASET_COUNTS).
    datasets_records: int = 50_000
    dataset_counts: tuple[int, ...] = DATASET_COUNTS
    # Formats (bench/formats.py): records parsed from JSON, from Avro through the registry and with plain
    # from_avro, each way this many times.
    format_records: int = 500_000
    format_repeats: int = 3

    def __post_init__(self) -> None:
        positive = (
            "records",
            "partitions",
            "silver_batch",
            "silver_small_table",
            "silver_big_table",
            "silver_table_commits",
            "gold_small_windows",
            "gold_big_windows",
            "gold_batch_windows",
            "gold_table_commits",
            "merge_repeats",
            "overhead_repeats",
            "storage_records",
            "storage_turns",
            "latency_rate",
            "latency_seconds",
            "marker_every_s",
            "timeout_s",
            "egress_rows",
            "peer_records",
            "peer_increment",
            "peer_pairs",
            "distinct_values_per_key",
            "datasets_records",
            "format_records",
            "format_repeats",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"Sizes.{name} must be positive, got {getattr(self, name)!r}")
        for name in ("max_offsets_per_trigger", "steady_batch"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"Sizes.{name} must be positive or None, got {value!r}")
        if self.peer_variant_pairs < 0:
            raise ValueError(f"Sizes.peer_variant_pairs must not be negative, got {self.peer_variant_pairs!r}")
        if self.warmup_records < 0:
            raise ValueError(f"Sizes.warmup_records must not be negative, got {self.warmup_records!r}")
        if not 0.0 < self.kill_fraction < 1.0:
            raise ValueError(f"Sizes.kill_fraction must be between 0 and 1, got {self.kill_fraction!r}")
        if self.distinct_values_per_key < 2:
            raise ValueError(f"Sizes.distinct_values_per_key must be at least 2, got {self.distinct_values_per_key!r}")
        counts = self.dataset_counts
        rising = list(counts) == sorted(set(counts))
        if not counts or counts[0] != 1 or not rising or not set(counts) <= set(DATASET_COUNTS):
            raise ValueError(f"Sizes.dataset_counts must rise from 1 among {DATASET_COUNTS}, got {counts!r}")
        if self.gold_batch_windows < 2:
            raise ValueError(f"Sizes.gold_batch_windows must be at least 2, got {self.gold_batch_windows!r}")
        for name in ("overhead_trigger", "latency_trigger", "latency_fast_trigger"):
            value = getattr(self, name)
            if value is not None:
                duration_seconds(value, f"Sizes.{name}")


DEFAULT_SIZES = Sizes(
    records=1_000_000,
    partitions=2,
    max_offsets_per_trigger=None,
    warmup_records=200_000,
    silver_batch=100_000,
    silver_small_table=100_000,
    silver_big_table=10_000_000,
    silver_table_commits=10,
    gold_small_windows=1_000,
    gold_big_windows=1_000_000,
    gold_batch_windows=10,
    gold_table_commits=10,
    merge_repeats=3,
    steady_batch=None,
    overhead_repeats=3,
    overhead_trigger="1 second",
    storage_records=200_000,
    storage_turns=2,
    latency_rate=2_000,
    latency_seconds=60.0,
    latency_trigger=None,
    latency_fast_trigger="1 second",
    marker_every_s=1.0,
    kill_fraction=0.5,
)
QUICK_SIZES = Sizes(
    records=60_000,
    partitions=2,
    max_offsets_per_trigger=20_000,
    warmup_records=20_000,
    silver_batch=10_000,
    silver_small_table=100_000,
    silver_big_table=1_000_000,
    silver_table_commits=2,
    gold_small_windows=200,
    gold_big_windows=20_000,
    gold_batch_windows=10,
    gold_table_commits=2,
    merge_repeats=2,
    steady_batch=None,
    overhead_repeats=2,
    overhead_trigger="1 second",
    storage_records=2_000,
    storage_turns=1,
    latency_rate=500,
    latency_seconds=15.0,
    latency_trigger="2 seconds",
    latency_fast_trigger="1 second",
    marker_every_s=0.5,
    kill_fraction=0.5,
    recovery_in_process=True,
    egress_rows=20_000,
    peer_records=20_000,
    peer_increment=2_000,
    peer_pairs=2,
    peer_variant_pairs=1,
    distinct_values_per_key=4,
    datasets_records=5_000,
    format_records=20_000,
    format_repeats=2,
)
