"""How a dataset's Kafka values are written, and how silver reads them into the contract's fields.

* ``Format.JSON``: a JSON object per value (silver.py parses it).
* ``Format.AVRO``: Avro in the Confluent wire format (``wire.py``): a magic byte 0, the 4-byte id of
  the writer schema in a schema registry (``registry.py``), then the Avro body. ``avro.py`` reads each
  body with its writer schema, resolved into the contract's reader schema; ``avro_rows.py`` writes
  rows of a Spark schema the same way, as the Kafka egress publishes them, and reads them back.
* ``Format.PROTOBUF``: Protobuf in the Confluent wire format, message indexes after the header;
  ``protobuf.py`` reads each body with its writer's message, field by field into the contract.

Whatever the format, a record silver cannot read goes to quarantine with its reason, never dropped; a
registry that does not answer fails the batch instead (not a record's fault), and the batch replays.
"""

from __future__ import annotations

from enum import StrEnum


class Format(StrEnum):
    """How a dataset's Kafka values are written."""

    JSON = "json"
    AVRO = "avro"
    PROTOBUF = "protobuf"
