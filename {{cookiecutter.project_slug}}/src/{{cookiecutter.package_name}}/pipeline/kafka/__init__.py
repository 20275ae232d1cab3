"""Kafka: the options of Spark's source and the confluent-kafka clients, TLS and SASL alike
(``clients.py``), and which topics and cluster bronze read, recorded and checked (``identity.py``)."""
