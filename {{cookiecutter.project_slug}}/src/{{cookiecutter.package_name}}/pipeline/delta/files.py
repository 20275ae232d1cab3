"""Small files beside the tables (checkpoint metadata, leases, sink versions), read and written
through Hadoop's filesystem, so a lakehouse on an object store works the same as on a local disk.
"""

from __future__ import annotations

from pyspark.sql import SparkSession


def filesystem(spark: SparkSession, path: str):
    """(Hadoop FileSystem, Hadoop Path) of ``path``, with the session's credentials and settings."""
    jvm_path = spark._jvm.org.apache.hadoop.fs.Path(path)
    return jvm_path.getFileSystem(spark._jsc.hadoopConfiguration()), jvm_path


def read_text(spark: SparkSession, path: str) -> str | None:
    """The file's text, or None when there is no file."""
    fs, jvm_path = filesystem(spark, path)
    if not fs.exists(jvm_path):
        return None
    stream = fs.open(jvm_path)
    try:
        return spark._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
    finally:
        stream.close()


def write_text(spark: SparkSession, path: str, text: str, overwrite: bool = False) -> None:
    """Write the file; without ``overwrite`` an existing file raises (FileAlreadyExistsException)."""
    fs, jvm_path = filesystem(spark, path)
    stream = fs.create(jvm_path, overwrite)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


def list_names(spark: SparkSession, path: str) -> list[str]:
    """Names in the directory ``path`` ([] when there is none)."""
    fs, jvm_path = filesystem(spark, path)
    if not fs.exists(jvm_path):
        return []
    return [status.getPath().getName() for status in fs.listStatus(jvm_path)]


def exists(spark: SparkSession, path: str) -> bool:
    """Whether there is a file or directory at ``path``."""
    fs, jvm_path = filesystem(spark, path)
    return bool(fs.exists(jvm_path))


def holds_files(spark: SparkSession, path: str) -> bool:
    """Whether the directory ``path`` or any directory below it holds a file (False when there is none)."""
    fs, jvm_path = filesystem(spark, path)
    return fs.exists(jvm_path) and fs.listFiles(jvm_path, True).hasNext()


def delete(spark: SparkSession, path: str, recursive: bool = False) -> None:
    """Delete the file, or the directory with ``recursive``; nothing there is not an error."""
    fs, jvm_path = filesystem(spark, path)
    fs.delete(jvm_path, recursive)
