"""Exactly-once medallion streaming pipeline: Kafka -> bronze -> silver -> gold on Delta Lake."""

__version__ = "0.1.0"
