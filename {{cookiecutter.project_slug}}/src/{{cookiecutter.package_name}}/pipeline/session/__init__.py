"""The Spark session: how it is built (``spark.py``), the class archive its driver starts from
(``class_archive.py``), how each batch evaluates its expressions (``codegen.py``), and S3 under it
(``s3.py``)."""
