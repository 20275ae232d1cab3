"""Recovery: what lets a stream stop anywhere and resume exactly. One checkpoint per stream bound
to its tables (``checkpoints.py``, ``sink_progress.py``), one process per stream (``lease.py``),
layers rebuilt aside from the one above (``rebuild.py``), and the crash points the fault tests
stop a stream at (``crash_points.py``)."""
