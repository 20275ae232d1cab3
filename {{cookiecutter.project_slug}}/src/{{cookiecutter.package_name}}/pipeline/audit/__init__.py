"""The audit: Kafka, bronze, silver + quarantine, gold and each egress reconciled
(``reconcile.py``), over the cut a running pipeline had consumed (``cut.py``)."""
