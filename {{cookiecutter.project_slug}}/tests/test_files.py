"""The small files beside the tables (leases, sink versions, checkpoint metadata) are read whole or
not at all: a reader never sees a record its writer has only begun, on a local disk as on S3."""

import threading
import time

import pytest

from {{ cookiecutter.package_name }}.pipeline.delta import files

OLD, NEW = "o" * 400_000, "n" * 600_000


def reads_while_rewritten(spark, path: str, rewrite, seconds: float, until=lambda seen: False) -> set[int]:
    """The lengths of what ``files.read_text`` saw while ``rewrite(text)`` ran in a loop beside it,
    for ``seconds`` or until ``until(seen)``."""
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            for text in (OLD, NEW):
                rewrite(text)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    seen: set[int] = set()
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and not until(seen):
            seen.add(len(files.read_text(spark, path) or ""))
    finally:
        stop.set()
        thread.join()
    return seen


def test_a_file_rewritten_while_it_is_read_is_read_whole(spark, tmp_path):
    path = str(tmp_path / "lease" / "0000000001")
    files.write_text(spark, path, OLD)
    fs, jvm_path = files.filesystem(spark, path)

    def in_place(text: str) -> None:  # what Hadoop's create(overwrite) does: truncate, then write
        stream = fs.create(jvm_path, True)
        try:
            stream.write(bytearray(text.encode()))
        finally:
            stream.close()

    # The window is real: a plain rewrite lets a reader see a file cut short.
    whole = {len(OLD), len(NEW)}
    torn = reads_while_rewritten(spark, path, in_place, 30, until=lambda seen: bool(seen - whole))
    assert torn - whole, "no read landed mid-write: nothing was tested"

    seen = reads_while_rewritten(spark, path, lambda text: files.write_text(spark, path, text, overwrite=True), 5)
    assert seen == whole, seen


def test_a_replacement_over_a_file_hadoop_wrote_reads_back_new_text(spark, tmp_path):
    # Hadoop's local filesystem writes a checksum beside each file and checks a read against it.
    path = tmp_path / "sink_versions" / "7"
    fs, jvm_path = files.filesystem(spark, str(path))
    stream = fs.create(jvm_path, False)
    stream.write(bytearray(b'{"gold": 3}'))
    stream.close()
    assert (tmp_path / "sink_versions" / ".7.crc").exists()

    files.write_text(spark, str(path), '{"gold": 4}', overwrite=True)

    assert files.read_text(spark, str(path)) == '{"gold": 4}'
    assert sorted(p.name for p in path.parent.iterdir()) == ["7"]


def test_an_exclusive_create_takes_a_name_once_and_leaves_nothing_beside_it(spark, tmp_path):
    path = str(tmp_path / "gold.leases" / "0000000004")

    assert files.create_new(spark, path, "first")
    assert not files.create_new(spark, path, "second")

    assert files.read_text(spark, path) == "first"
    assert [p.name for p in (tmp_path / "gold.leases").iterdir()] == ["0000000004"]
    with pytest.raises(FileExistsError):
        files.write_text(spark, path, "third")
    assert files.read_text(spark, path) == "first"
