"""What exactly-once costs: the pipeline against itself with the idempotence tags switched off.

The baseline runs the pipeline's own streams and sinks with ``Delivery.AT_LEAST_ONCE``: the same
transforms, MERGEs and checkpoint checks, only the Delta commits are untagged. So the ratio is the
price of the (stream id, batch id) tags and nothing else.
"""

from __future__ import annotations

from pathlib import Path

from ..pipeline.delta.writes import Delivery
from .harness import Bench, rows_and_ms, say, summary


def run_at_least_once(bench: Bench, root: Path, topic: str) -> dict[str, dict]:
    """The pipeline over ``topic`` with untagged commits, into the lakehouse at ``root``.

    ``root`` must not be an exactly-once run's lakehouse: untagged commits would mix into its tables.
    """
    if not str(root):
        raise ValueError("run_at_least_once needs a lakehouse root")
    return bench.run_layers(bench.phase_config(root, topic), delivery=Delivery.AT_LEAST_ONCE)


def measure(bench: Bench, topic: str, eo: dict[str, dict]) -> None:
    """Compare ``eo`` (the exactly-once runs of the throughput phase) with an at-least-once run of the backlog."""
    if set(eo) != {"bronze", "silver", "gold"}:
        raise ValueError(f"eo must hold the bronze, silver and gold runs, got {sorted(eo)}")
    say("exactly-once: the pipeline with untagged commits over the same backlog")
    alo = run_at_least_once(bench, bench.work / "alo", topic)
    eo_ms = sum(rows_and_ms(run["progress"])[1] for run in eo.values())
    alo_ms = sum(rows_and_ms(run["progress"])[1] for run in alo.values())
    eo_wall = sum(run["wall_s"] for run in eo.values())
    alo_wall = sum(run["wall_s"] for run in alo.values())
    bench.add("exactly_once_s", "exactly-once pipeline, batch time", eo_ms / 1000, "s")
    bench.add("at_least_once_s", "at-least-once variant, batch time", alo_ms / 1000, "s")
    bench.add("exactly_once_cost", "exactly-once / at-least-once (batch time)", eo_ms / alo_ms, "ratio")
    bench.add("exactly_once_cost_wall", "exactly-once / at-least-once (wall, with starts)", eo_wall / alo_wall, "ratio")
    bench.details["exactly_once"] = {
        "exactly_once": {layer: summary(run) for layer, run in eo.items()},
        "at_least_once": {layer: summary(run) for layer, run in alo.items()},
        "exactly_once_wall_s": eo_wall,
        "at_least_once_wall_s": alo_wall,
    }
