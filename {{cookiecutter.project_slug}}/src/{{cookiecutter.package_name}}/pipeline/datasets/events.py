"""The events dataset: the clickstream the project was made for.

Its topics are the Kafka section's (``kafka.topics`` in conf/<env>.toml). Each record has the key
user_id (UTF-8) and a JSON object for its value:
{"event_id", "event_time" (ISO-8601 with offset), "user_id", "event_type", "amount"}.

Gold ``event_windows`` counts the events and sums their amount per event type and tumbling window of
the pipeline's ``gold_window``. The dataset keeps the table and stream names of a lakehouse of one
dataset (``Naming.SOLE``): ``bronze_events``, ``silver_events``, ``quarantine_events``,
``gold_event_windows``; streams ``bronze``, ``silver``, ``gold`` and ``fused``.
"""

from ..contract import Contract, Field, Kind
from ..dataset import Dataset, Gold, Naming

EVENTS = Contract(
    fields=(
        Field("event_id", Kind.STRING),
        Field("event_time", Kind.TIMESTAMP),
        Field("user_id", Kind.STRING),
        Field("event_type", Kind.STRING),
        # Exact: a value that would need rounding is quarantined, never altered.
        Field("amount", Kind.DECIMAL, precision=18, scale=2),
    ),
    event_time="event_time",
    dimensions=("event_type",),
    measures=("amount",),
)

DATASET = Dataset(
    name="events",
    contract=EVENTS,
    golds=(Gold.of("event_windows", EVENTS),),
    naming=Naming.SOLE,
)
