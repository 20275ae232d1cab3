"""Small files beside the tables (checkpoint metadata, leases, sink versions), read and written
through Hadoop's filesystem, so a lakehouse on an object store works the same as on a local disk.

A reader sees a file whole or not at all, even when its writer is killed or stopped mid-write: on
S3 nothing is visible before the upload completes; on a local disk the text is written beside the
file and then linked (a new file) or renamed (a replacement) into place, one atomic step each.
Elsewhere (HDFS) Hadoop writes in place, and a reader that cannot parse what it finds must retry
and then judge the file by its age (recovery/lease.py does).
"""

from __future__ import annotations

import os
import uuid

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from ..session.spark import java_class

# S3A's createFile option (HADOOP-19256, Hadoop 3.4.2+) that makes an upload a put-if-absent.
CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite"
# What Hadoop raises when the file was there: from create on a filesystem, from close on S3 (412).
_EXISTS = ("FileAlreadyExistsException", "RemoteFileChangedException")
# What it raises when a file or directory that was there a moment ago is gone: another process deleted
# it between our look and our read (a lease released), or the store dropped it (SeaweedFS does: a
# lease directory whose last file is deleted can answer that it exists, then raise this when listed).
_GONE = ("FileNotFoundException",)
# A local directory removed while Hadoop lists it reads as denied access or an invalid directory
# (Java's File.list() answers null, which Hadoop cannot tell from a directory it may not read), and
# it may be there again at once: list_names looks this many times before the error stands.
_LIST_ATTEMPTS = 5


def filesystem(spark: SparkSession, path: str):
    """(Hadoop FileSystem, Hadoop Path) of ``path``, with the session's credentials and settings."""
    jvm_path = java_class(spark, "org.apache.hadoop.fs.Path")(path)
    return jvm_path.getFileSystem(spark._jsc.hadoopConfiguration()), jvm_path


def read_text(spark: SparkSession, path: str) -> str | None:
    """The file's text, or None when there is no file."""
    fs, jvm_path = filesystem(spark, path)
    if not fs.exists(jvm_path):
        return None
    try:
        stream = fs.open(jvm_path)
    except Py4JJavaError as error:
        if _caused_by(error, _GONE):
            return None
        raise
    try:
        return java_class(spark, "org.apache.commons.io.IOUtils").toString(stream, "UTF-8")
    finally:
        stream.close()


def write_text(spark: SparkSession, path: str, text: str, overwrite: bool = False) -> None:
    """Write the file whole; without ``overwrite`` an existing file raises (FileAlreadyExistsException,
    or FileExistsError on a local disk).

    Example::

        write_text(spark, "/data/lake/checkpoints/gold/sink_versions/41", '{"gold": 7}', overwrite=True)
    """
    fs, jvm_path = filesystem(spark, path)
    local = _local_path(fs, jvm_path)
    if local is not None:
        if overwrite:
            _replace_local(local, text)
        elif not _link_local(local, text):
            raise FileExistsError(f"{path} exists")
        return
    stream = fs.create(jvm_path, overwrite)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


def create_new(spark: SparkSession, path: str, text: str) -> bool:
    """Create the file holding ``text`` only if there is none: True when this call created it.

    Of two processes creating one path at once, exactly one gets True, on a local disk, HDFS and S3.
    On S3 the upload itself is conditional (``If-None-Match: *``, S3A's conditional create, checked when
    the stream closes): a check before an upload would let both through. An upload whose answer is
    lost and retried reads as False, the safe side: the caller then finds the file and its owner.

    Example::

        if not create_new(spark, f"{directory}/0000000004", record):
            ...  # another process took generation 4 first
    """
    fs, jvm_path = filesystem(spark, path)
    local = _local_path(fs, jvm_path)
    if local is not None:
        return _link_local(local, text)
    on_s3 = fs.getScheme() == "s3a"
    try:
        if on_s3:
            builder = fs.createFile(jvm_path).create().overwrite(False).must(CONDITIONAL_CREATE, True)
            stream = builder.build()
        else:
            stream = fs.create(jvm_path, False)
    except Py4JJavaError as error:
        if _already_exists(error):
            return False
        raise
    try:
        stream.write(bytearray(text.encode("utf-8")))
    except BaseException:
        # Nothing reaches S3 before close: abort, never upload half a file. A stream elsewhere (HDFS)
        # cannot abort; it is closed, and a reader refuses what it cannot parse.
        if on_s3:
            stream.abort()
        else:
            stream.close()
        raise
    try:
        stream.close()
    except Py4JJavaError as error:
        if _already_exists(error):
            return False
        raise
    return True


def list_names(spark: SparkSession, path: str) -> list[str]:
    """Names in the directory ``path`` ([] when there is none).

    A directory removed while it is listed (another process released a lease and deleted its
    directory) reads as absent. On a local disk Hadoop reports that as denied access, and the
    directory may be there again at once (a third process took the lease): such a listing is taken
    again, up to ``_LIST_ATTEMPTS`` times, and the error stands only if it keeps failing (a
    directory this process may not read).

    Example::

        list_names(spark, "s3a://lake/prefix/checkpoints/silver.leases")  # ["0000000003"]
    """
    fs, jvm_path = filesystem(spark, path)
    for attempt in range(1, _LIST_ATTEMPTS + 1):
        if not fs.exists(jvm_path):
            return []
        try:
            return [status.getPath().getName() for status in fs.listStatus(jvm_path)]
        except Py4JJavaError as error:
            if _caused_by(error, _GONE):
                return []
            if attempt == _LIST_ATTEMPTS or not _vanished_while_listed(error):
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


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


def _local_path(fs, jvm_path) -> str | None:
    """The path on this machine's disk when ``fs`` is the local filesystem, else None."""
    if fs.getScheme() != "file":
        return None
    return str(fs.makeQualified(jvm_path).toUri().getPath())


def _aside(path: str, text: str) -> str:
    """Write ``text`` durably to a new hidden file beside ``path``; its name."""
    directory, name = os.path.split(path)
    os.makedirs(directory, exist_ok=True)
    aside = os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
    with open(aside, "xb") as out:
        out.write(text.encode("utf-8"))
        out.flush()
        os.fsync(out.fileno())
    return aside


def _link_local(path: str, text: str) -> bool:
    # link(2) fails when the name exists: an exclusive create of a file that is already whole.
    aside = _aside(path, text)
    try:
        os.link(aside, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(aside)


def _replace_local(path: str, text: str) -> None:
    aside = _aside(path, text)
    directory, name = os.path.split(path)
    # Hadoop's local filesystem checks a file against a checksum beside it when there is one: an
    # earlier write through Hadoop left one that the new text would fail.
    try:
        os.unlink(os.path.join(directory, f".{name}.crc"))
    except FileNotFoundError:
        pass
    try:
        os.replace(aside, path)
    except BaseException:
        os.unlink(aside)
        raise


def _already_exists(error: Py4JJavaError) -> bool:
    return _caused_by(error, _EXISTS)


def _vanished_while_listed(error: Py4JJavaError) -> bool:
    """Whether a listing failed the way one does when its directory is removed under it."""
    return _caused_by(error, ("AccessDeniedException",)) or "Invalid directory" in str(error.java_exception)


def _caused_by(error: Py4JJavaError, names: tuple[str, ...]) -> bool:
    cause = error.java_exception
    while cause is not None:
        if cause.getClass().getSimpleName() in names:
            return True
        cause = cause.getCause()
    return False
