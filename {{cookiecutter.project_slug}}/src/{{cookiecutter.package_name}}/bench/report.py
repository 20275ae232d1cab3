"""What a run reports: metrics and their targets, the machine, the printed table, bench.json and bench.png."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import textwrap
from dataclasses import dataclass
from pathlib import Path

from ..pipeline.config import duration_seconds
from ..pipeline.egress import installed_names
from ..pipeline.session.spark import java_class
from . import sdp
from .sizes import DATASET_COUNTS

RESULTS_FILE = "bench.json"
PLOT_FILE = "bench.png"
# The run's figures as docs/benchmarks.md shows them (figures_markdown).
FIGURES_FILE = "bench.md"
# The text chunk of bench.png that names the results it draws (results_digest).
PLOT_SOURCE_KEY = "Source"

# The peer's figures (bench/peer.py), when its extra is installed: this project against SDP on the same topic.
PEER_METRIC_KEYS = (
    "peer_project_startup_s",
    "peer_sdp_startup_s",
    "peer_startup_ratio",
    *(
        f"peer_{system}_{layer}_s" if system else f"peer_{layer}_ratio"
        for layer in ("bronze", "silver", "gold", "total")
        for system in ("project", "sdp", "")
    ),
    "peer_project_increment_s",
    "peer_sdp_increment_s",
    "peer_increment_ratio",
    "peer_project_increment_gold_s",
    "peer_sdp_increment_gold_s",
    "peer_increment_gold_ratio",
    "peer_project_one_record_s",
    "peer_sdp_one_record_s",
    "peer_one_record_ratio",
    "peer_sdp_gold_empty_s",
    "peer_sdp_catch_up_runs",
    "peer_sdp_increment_runs",
    "peer_sdp_one_record_runs",
    "peer_pairs",
    *(
        f"peer_{setup}_{layer}_ratio"
        for setup in ("rocksdb", "capped")
        for layer in ("bronze", "silver", "gold", "total")
    ),
)

DATASETS_METRIC_KEYS = (
    *(
        key
        for count in DATASET_COUNTS
        for key in (
            *(f"datasets_{count}_{position}_rps" for position in range(1, count + 1)),
            *((f"datasets_{count}_total_rps",) if count > 1 else ()),
            f"datasets_{count}_one_record_s",
            f"datasets_{count}_heap_mb",
        )
    ),
    "datasets_first_rps_most_vs_one",
    "datasets_one_record_most_vs_one",
    "datasets_heap_most_vs_one",
)

# Every metric key bench.json holds, in table order (each egress's when this project has it, the peer's
# when its extra is installed).
METRIC_KEYS = (
    "kafka_consumer_rps",
    "spark_source_rps",
    "bronze_rps",
    "bronze_vs_source",
    "delta_sink_rps",
    "bronze_vs_delta_sink",
    "silver_rps",
    "gold_rps",
    "silver_append_small_s",
    "silver_append_big_s",
    "silver_append_scaling",
    "silver_merge_small_s",
    "silver_merge_big_s",
    "silver_merge_scaling",
    "silver_append_vs_merge",
    "silver_skewed_merge_small_s",
    "silver_skewed_merge_big_s",
    "silver_skewed_merge_scaling",
    "silver_skewed_append_scaling",
    "gold_merge_small_s",
    "gold_merge_big_s",
    "gold_merge_scaling",
    "distinct_merge_small_s",
    "distinct_merge_big_s",
    "distinct_merge_scaling",
    "format_json_rps",
    "format_avro_rps",
    "format_plain_avro_rps",
    "format_avro_vs_json",
    "format_avro_vs_plain",
    "expectations_ten_vs_none",
    "bronze_one_record_batch_ms",
    "bronze_steady_batch_ms",
    "bronze_fixed_overhead",
    "silver_one_record_batch_ms",
    "silver_steady_batch_ms",
    "silver_fixed_overhead",
    "gold_one_record_batch_ms",
    "gold_steady_batch_ms",
    "gold_fixed_overhead",
    "floor_kafka_ms",
    "floor_bronze_table_ms",
    "floor_silver_table_ms",
    "bronze_vs_floor",
    "silver_vs_floor",
    "gold_vs_floor",
    "storage_bronze_local_rps",
    "storage_bronze_s3_rps",
    "storage_bronze_s3_vs_local",
    "storage_silver_local_rps",
    "storage_silver_s3_rps",
    "storage_silver_s3_vs_local",
    "storage_gold_local_rps",
    "storage_gold_s3_rps",
    "storage_gold_s3_vs_local",
    "storage_bronze_local_one_record_ms",
    "storage_bronze_s3_one_record_ms",
    "storage_bronze_one_record_s3_vs_local",
    "storage_silver_local_one_record_ms",
    "storage_silver_s3_one_record_ms",
    "storage_silver_one_record_s3_vs_local",
    "storage_gold_local_one_record_ms",
    "storage_gold_s3_one_record_ms",
    "storage_gold_one_record_s3_vs_local",
    "latency_silver_p50_s",
    "latency_gold_p50_s",
    "latency_gold_p95_s",
    "latency_gold_p50_triggers",
    "latency_gold_p95_triggers",
    "latency_gold_trend",
    "latency_fast_gold_p50_s",
    "latency_fast_gold_p95_s",
    "latency_fast_gold_p95_triggers",
    "latency_fast_gold_trend",
    "fused_one_record_batch_ms",
    "fused_steady_batch_ms",
    "fused_vs_floor",
    "latency_fused_gold_p50_s",
    "latency_fused_gold_p95_s",
    "latency_fused_gold_trend",
    *DATASETS_METRIC_KEYS,
    "exactly_once_s",
    "at_least_once_s",
    "exactly_once_cost",
    "exactly_once_cost_wall",
    "jvm_start_s",
    "drain_undisturbed_s",
    "drain_killed_s",
    "recovery_cost",
    *(
        f"{egress}_{figure}"
        for egress in installed_names()
        for figure in (
            "rows_per_s",
            "baseline_rows_per_s",
            "bulk_cost",
            "one_row_batch_ms",
            "baseline_one_row_batch_ms",
            "batch_cost",
        )
    ),
    *(PEER_METRIC_KEYS if sdp.installed() else ()),
)

# The targets table, in the order of the targets; a targeted key not listed comes after them.
TARGET_ORDER = (
    "bronze_vs_source",
    "bronze_vs_delta_sink",
    "bronze_vs_floor",
    "silver_vs_floor",
    "gold_vs_floor",
    "latency_gold_p95_triggers",
    "exactly_once_cost",
    "recovery_cost",
    "silver_skewed_merge_scaling",
    "gold_merge_scaling",
    "distinct_merge_scaling",
    "format_avro_vs_json",
    "format_avro_vs_plain",
    "silver_merge_scaling",
    "silver_append_scaling",
    "peer_bronze_ratio",
    "peer_silver_ratio",
    "peer_gold_ratio",
    "peer_total_ratio",
    "peer_increment_gold_ratio",
    "peer_startup_ratio",
)


@dataclass(frozen=True)
class Target:
    op: str  # ">=" or "<="
    value: float

    def __post_init__(self) -> None:
        if self.op not in (">=", "<="):
            raise ValueError(f"Target.op must be '>=' or '<=', not {self.op!r}")

    def met(self, value: float) -> bool:
        return value >= self.value if self.op == ">=" else value <= self.value

    def __str__(self) -> str:
        return f"{self.op} {self.value:g}"


# The latency trend at which a run counts as keeping up with its offered rate: its last third of
# markers took at most half as long again as its first third (medians). A pipeline processing a
# fraction f of the offered rate falls (1 - f) behind per second, about 40 s x (1 - f) between
# the thirds of a 60 s run: 1.5 flags a pipeline short by about a tenth at a latency of 8 s.
KEPT_UP = Target("<=", 1.5)
# One target per metric, kept here alone: the table, the goals and the docs all read them from here.
TARGETS: dict[str, Target] = {
    "bronze_vs_source": Target(">=", 0.5),
    "bronze_vs_delta_sink": Target(">=", 1.0),
    "bronze_vs_floor": Target("<=", 2),
    "silver_vs_floor": Target("<=", 3),
    "gold_vs_floor": Target("<=", 3),
    "fused_vs_floor": Target("<=", 3),
    "latency_gold_p95_triggers": Target("<=", 1.5),
    "latency_fast_gold_p95_s": Target("<=", 3),
    "latency_fused_gold_p95_s": Target("<=", 3),
    "latency_gold_trend": KEPT_UP,
    "latency_fast_gold_trend": KEPT_UP,
    "latency_fused_gold_trend": KEPT_UP,
    "exactly_once_cost": Target("<=", 1.1),
    "recovery_cost": Target("<=", 1.25),
    "silver_append_scaling": Target("<=", 1.5),
    "silver_merge_scaling": Target("<=", 1.5),
    "silver_skewed_merge_scaling": Target("<=", 1.5),
    "gold_merge_scaling": Target("<=", 1.2),
    "distinct_merge_scaling": Target("<=", 1.2),
    # Avro through the registry at least as fast as JSON, and at least half as fast as a plain from_avro
    # that checks and resolves nothing.
    "format_avro_vs_json": Target(">=", 1.0),
    "format_avro_vs_plain": Target(">=", 0.5),
    "peer_startup_ratio": Target(">=", 1.0),
    "peer_bronze_ratio": Target(">=", 1.0),
    "peer_silver_ratio": Target(">=", 1.0),
    "peer_gold_ratio": Target(">=", 1.0),
    "peer_total_ratio": Target(">=", 1.2),
    "peer_increment_gold_ratio": Target(">=", 1.0),
}


@dataclass
class Metric:
    key: str
    name: str
    value: float
    unit: str

    def __post_init__(self) -> None:
        if self.key not in METRIC_KEYS:
            raise ValueError(f"unknown metric key {self.key!r}: add it to METRIC_KEYS")

    @property
    def target(self) -> Target | None:
        return TARGETS.get(self.key)

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.target.met(self.value)

    def as_dict(self) -> dict:
        return {
            "key": self.key,
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "target": None if self.target is None else str(self.target),
            "met": self.met,
        }


@dataclass(frozen=True)
class Goal:
    """A row of the latency work's table: its figures (one, or one per layer), each held to its metric's
    target (``TARGETS``)."""

    keys: tuple[str, ...]
    name: str

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("a Goal needs at least one metric key")
        unknown = [key for key in self.keys if key not in METRIC_KEYS]
        if unknown:
            raise ValueError(f"unknown metric keys {unknown}: add them to METRIC_KEYS")
        untargeted = [key for key in self.keys if key not in TARGETS]
        if untargeted:
            raise ValueError(f"metric keys {untargeted} have no target: add them to TARGETS")

    def outcome(self, metrics: list[Metric], previous: dict[str, float] | None = None) -> dict | None:
        """This run's figures against their targets, beside ``previous`` (a run's figures by key, the one
        before this on this machine) where it has them; None when this run measured not all of them."""
        by_key = {metric.key: metric.value for metric in metrics}
        if any(key not in by_key for key in self.keys):
            return None
        now = [by_key[key] for key in self.keys]
        return {
            "name": self.name,
            "keys": list(self.keys),
            "previous": [(previous or {}).get(key) for key in self.keys],
            "now": now,
            "target": " / ".join(dict.fromkeys(str(TARGETS[key]) for key in self.keys)),
            "met": all(TARGETS[key].met(value) for key, value in zip(self.keys, now, strict=True)),
        }


# Seconds of latency and the per-batch cost of silver and gold: the work's table.
LATENCY_GOALS = (
    Goal(("silver_vs_floor", "gold_vs_floor"), "one-record batch / its source into noop: silver, gold"),
    Goal(("fused_vs_floor",), "fused mode: one-record batch, four tables / Kafka into noop"),
    Goal(("latency_fast_gold_p95_s",), "Kafka -> gold p95 at the fastest trigger (s)"),
    Goal(("latency_fused_gold_p95_s",), "fused mode: Kafka -> gold p95 at the fastest trigger (s)"),
    Goal(("bronze_vs_source",), "bronze / Spark Kafka -> noop ceiling"),
    Goal(("gold_merge_scaling",), "gold MERGE at ~1M windows / at ~1k"),
    Goal(("exactly_once_cost",), "exactly-once / at-least-once"),
)


def previous_figures(output_dir: Path) -> dict[str, float]:
    """The figures of the run ``output_dir`` holds (its bench.json) by metric key; {} when it holds none.

    A run is compared with the one before it on the same machine, never with figures shipped in the code.

    Example::

        previous_figures(Path("bench-results"))  # {"exactly_once_cost": 1.09, ...}
    """
    if not isinstance(output_dir, Path):
        raise TypeError(f"output_dir must be a Path, not {type(output_dir).__name__}")
    path = output_dir / "bench.json"
    try:
        written = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {metric["key"]: metric["value"] for metric in written.get("metrics", []) if "key" in metric}


def goal_outcomes(
    metrics: list[Metric], previous: dict[str, float] | None = None, goals: tuple[Goal, ...] = LATENCY_GOALS
) -> list[dict]:
    """Each goal's outcome in this run, beside ``previous`` figures, in the goals' order; a goal the run did
    not measure is left out.

    Example::

        goal_outcomes([Metric("exactly_once_cost", "exactly-once / at-least-once", 1.01, "ratio")])
        # [{"name": "exactly-once / at-least-once", "previous": [None], "now": [1.01], "met": True, ...}]
    """
    if not all(isinstance(metric, Metric) for metric in metrics):
        raise TypeError("metrics must be Metric objects")
    return [outcome for goal in goals if (outcome := goal.outcome(metrics, previous)) is not None]


def format_goals(outcomes: list[dict]) -> str:
    """The latency work's table: figure, the previous run's, this run's, target, met.

    Example::

        print(format_goals(goal_outcomes(metrics, previous_figures(output_dir))))
    """

    def figures(values: list[float | None]) -> str:
        return ", ".join("-" if value is None else f"{value:.2f}" for value in values)

    lines = [f"{'latency work':<56} {'previous':>12} {'now':>12} {'target':<8} met", "-" * 96]
    for outcome in outcomes:
        lines.append(
            f"{outcome['name']:<56} {figures(outcome['previous']):>12} {figures(outcome['now']):>12} "
            f"{outcome['target']:<8} {'yes' if outcome['met'] else 'no'}"
        )
    return "\n".join(lines)


def load_average() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def machine_info(spark) -> dict:
    import importlib.metadata

    import confluent_kafka

    from ..devtools.kafka_local import KAFKA_VERSION

    cpu_model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    try:
        memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        memory_gb = float("nan")
    try:
        usable_cores = len(os.sched_getaffinity(0))
    except AttributeError:
        usable_cores = os.cpu_count()

    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    try:
        java = java_class(spark, "java.lang.System").getProperty("java.version")
    except Exception:  # noqa: BLE001 - informational only
        java = None
    return {
        "cores": os.cpu_count(),
        "usable_cores": usable_cores,
        "memory_gb": round(memory_gb, 1),
        "cpu_model": cpu_model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "java": java,
        "spark": spark.version,
        "delta": version("delta-spark"),
        "confluent_kafka": confluent_kafka.version()[0],
        "librdkafka": confluent_kafka.libversion()[0],
        "kafka_local_broker": KAFKA_VERSION,
        "spark_master": spark.sparkContext.master,
        "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
        "load_average_start": load_average(),
    }


def format_table(metrics: list[Metric]) -> str:
    lines = [f"{'metric':<52} {'value':>14} {'unit':<10} {'target':<8} met", "-" * 92]
    for metric in metrics:
        if metric.unit in ("records/s", "ms"):
            value = f"{metric.value:,.0f}"
        else:
            value = f"{metric.value:,.3f}" if metric.value < 10 else f"{metric.value:,.1f}"
        met = "" if metric.met is None else ("yes" if metric.met else "NO")
        target = "" if metric.target is None else str(metric.target)
        lines.append(f"{metric.name:<52} {value:>14} {metric.unit:<10} {target:<8} {met}")
    return "\n".join(lines)


def format_targets(metrics: list[Metric]) -> str:
    """Only the figures with a target: figure, value, target, met."""

    def place(metric: Metric) -> int:
        return TARGET_ORDER.index(metric.key) if metric.key in TARGET_ORDER else len(TARGET_ORDER)

    targeted = sorted((metric for metric in metrics if metric.target is not None), key=place)
    lines = [f"{'target':<52} {'value':>10} {'target':<8} met", "-" * 78]
    for metric in targeted:
        lines.append(f"{metric.name:<52} {metric.value:>10.2f} {metric.target!s:<8} {'yes' if metric.met else 'no'}")
    return "\n".join(lines)


def header(results: dict) -> str:
    machine = results["machine"]
    sizes = results["sizes"]
    return (
        f"\nbenchmark ({results['mode']}, {results['duration_s']:.0f} s): {machine['cores']} cores "
        f"({machine['usable_cores']} usable), {machine['memory_gb']} GB, {machine['cpu_model']}\n"
        f"Spark {machine['spark']}, Delta {machine['delta']}, Java {machine['java']}, Python {machine['python']}, "
        f"master {machine['spark_master']}, load average {_load(machine.get('load_average_start'))} -> "
        f"{_load(machine.get('load_average_end'))}\n"
        f"backlog {sizes['records']:,} records on {sizes['partitions']} partitions, bronze batch "
        f"{results['bronze_batch']:,}; silver MERGE {sizes['silver_batch']:,} rows into "
        f"{sizes['silver_small_table']:,} vs {sizes['silver_big_table']:,} rows; gold MERGE of "
        f"{sizes['gold_batch_windows']} windows into {sizes['gold_small_windows']:,} vs "
        f"{sizes['gold_big_windows']:,} windows\n"
    )


def _figure(metric: dict) -> str:
    value, unit = metric["value"], metric["unit"]
    if unit in ("records/s", "rows/s", "ms"):
        return f"{value:,.0f} {unit}"
    if unit in ("ratio", "x"):
        return f"{value:,.2f}"
    return f"{value:,.2f} {unit}" if value < 100 else f"{value:,.0f} {unit}"


def figures_markdown(results: dict) -> str:
    """A run (a ``bench.json``) as docs/benchmarks.md shows it: what ran where, then every figure with its
    target, in the order the run took them.

    Example::

        figures_markdown(json.loads(Path("bench-results/bench.json").read_text()))  # "`make bench` ..."
    """
    if not isinstance(results, dict) or not {"machine", "metrics", "mode", "duration_s"} <= results.keys():
        raise ValueError("results must be a bench run's results (bench.json): mode, duration_s, machine, metrics")
    machine = results["machine"]
    run = (
        f"A {results['mode']} run ({results['duration_s']:,.0f} s), started {results.get('started_at', '?')}: "
        f"{machine['cores']} cores, {machine['memory_gb']} GB, {machine['cpu_model']}; Java {machine['java']}, "
        f"Python {machine['python']}, Spark {machine['spark']}, Delta {machine['delta']}, Kafka "
        f"{machine.get('kafka_local_broker', '?')}; master `{machine['spark_master']}`; load average "
        f"{_load(machine.get('load_average_start'))} at the start, {_load(machine.get('load_average_end'))} at the end."
    )
    lines = [
        *textwrap.wrap(run, 100, break_on_hyphens=False),
        "",
        "| measure | figure | target | met |",
        "|---|---|---|---|",
    ]
    for metric in results["metrics"]:
        met = {True: "yes", False: "no", None: ""}[metric["met"]]
        lines.append(f"| {metric['name']} | {_figure(metric)} | {metric['target'] or ''} | {met} |")
    return "\n".join(lines) + "\n"


def _load(values) -> str:
    return "?" if not values else "/".join(f"{v:.1f}" for v in values)


def publish(results: dict, metrics: list[Metric], output_dir: Path) -> None:
    """Print the header and table, write bench.json and (with matplotlib) bench.png into ``output_dir``."""
    if not isinstance(output_dir, Path):
        raise TypeError(f"output_dir must be a Path, not {type(output_dir).__name__}")
    print(header(results))
    print(format_table(metrics))
    print()
    print(format_targets(metrics))
    if results.get("goals"):
        print()
        print(format_goals(results["goals"]))
    missed = [m.name for m in metrics if m.met is False]
    print(
        f"targets met: {sum(1 for m in metrics if m.met)} of {sum(1 for m in metrics if m.target)}"
        + (f"; missed: {'; '.join(missed)}" if missed else "")
    )
    output_dir.mkdir(parents=True, exist_ok=True)
    written = json.dumps(results, indent=2, default=str) + "\n"
    (output_dir / RESULTS_FILE).write_text(written)
    (output_dir / FIGURES_FILE).write_text(figures_markdown(json.loads(written)))
    plot = write_plot(json.loads(written), output_dir / PLOT_FILE)
    print(f"wrote {output_dir / RESULTS_FILE}, {output_dir / FIGURES_FILE}" + (f" and {plot}" if plot else ""))


def results_digest(results: dict) -> str:
    """The sha256 of a run's results (a ``bench.json`` read back), its keys sorted: bench.png names the run
    it draws with it.

    Example::

        results_digest(json.loads(Path("docs/bench.json").read_text()))  # "9f2c..."
    """
    if not isinstance(results, dict):
        raise TypeError(f"results must be a dict (a bench.json read back), not {type(results).__name__}")
    return hashlib.sha256(json.dumps(results, sort_keys=True).encode()).hexdigest()


def write_plot(results: dict, path: Path) -> Path | None:
    """bench.png: throughput, ratios against their targets, latency per marker; its ``PLOT_SOURCE_KEY`` text
    names the results it draws (``results_digest``). None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: skipping {path.name} (pip install matplotlib)")
        return None
    metrics = {m["key"]: m for m in results["metrics"]}
    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(18, 5.5))

    throughput = [
        ("plain consumer", "kafka_consumer_rps"),
        ("Spark source\n-> noop", "spark_source_rps"),
        ("built-in\nDelta sink", "delta_sink_rps"),
        ("bronze", "bronze_rps"),
        ("silver", "silver_rps"),
        ("gold", "gold_rps"),
    ]
    throughput = [(label, key) for label, key in throughput if key in metrics]  # a BENCH_ONLY run has few
    left.bar([label for label, _ in throughput], [metrics[key]["value"] for _, key in throughput], color="#4c72b0")
    left.set_title("throughput (records/s)")
    left.tick_params(axis="x", labelsize=8)

    ratios = [m for m in results["metrics"] if m["target"] is not None]
    colors = ["#55a868" if m["met"] else "#c44e52" for m in ratios]
    labels = [m["key"].replace("_", "\n", 1) for m in ratios]
    middle.bar(labels, [m["value"] for m in ratios], color=colors)
    for index, metric in enumerate(ratios):
        target = float(metric["target"].split()[1])
        middle.plot([index - 0.4, index + 0.4], [target, target], color="black", linewidth=2)
    middle.set_title("ratios (bar) against targets (black line); green = met")
    middle.tick_params(axis="x", labelsize=7, rotation=30)

    latency = results["details"].get("latency", {})
    for layer, values in latency.get("latencies_s", {}).items():
        right.plot(range(len(values)), values, marker=".", linestyle="", label=layer)
    fast = results["details"].get("latency_fast", {})
    if fast.get("latencies_s", {}).get("gold"):
        values = fast["latencies_s"]["gold"]
        right.plot(range(len(values)), values, marker="x", linestyle="", label=f"gold, trigger {fast['trigger']}")
    trigger = latency.get("trigger")
    if trigger:
        seconds = duration_seconds(trigger, "latency trigger")
        for multiple in (1, 2, 3):
            right.axhline(multiple * seconds, color="grey", linewidth=0.5, linestyle="--")
    right.set_title(f"Kafka -> visible latency per marker, sorted (trigger {trigger})")
    right.set_ylabel("s")
    right.legend()

    machine = results["machine"]
    figure.suptitle(
        f"{results['mode']} run on {machine['cores']} cores, {machine['memory_gb']} GB, {machine['cpu_model']}; "
        f"Spark {machine['spark']}, Delta {machine['delta']}"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110, metadata={PLOT_SOURCE_KEY: f"bench.json sha256 {results_digest(results)}"})
    plt.close(figure)
    return path
