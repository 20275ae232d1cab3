"""Delta tables and idempotent writes: where every table lives, its schema and properties
(``tables.py``), writes tagged with (stream id, batch id) (``writes.py``), and the small files
kept beside the tables through Hadoop's filesystem (``files.py``)."""
