"""What the local servers (kafka_local, postgres_local, s3_local) share to keep track of a detached server.

Each runs a server that outlives the command that started it, so each keeps its state in a JSON file,
tells its own server from a process that reuses the pid, and shows the tail of its log when it fails.

    state = StateFile(Path(".s3-local/state.json")).read()
    if state.get("pid") and not cmdline_has(state["pid"], "server", f"-dir={Path('.s3-local/data').resolve()}"):
        print("SeaweedFS is gone:", log_tail_since(Path(".s3-local/weed.log"), 0))
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path


class StateFile:
    """A JSON state file: read as {} when missing or corrupt, written atomically (a .tmp, then os.replace).

    Example::

        state = StateFile(Path(".s3-local/state.json"))
        state.write(pid=1234, endpoint="http://127.0.0.1:38333")
        assert state.read()["pid"] == 1234
    """

    def __init__(self, path: Path):
        self.path = Path(path)

    def read(self) -> dict:
        """The state last written; {} when there is none or it cannot be read.

        Example::

            previous_port = StateFile(Path(".postgres-local/state.json")).read().get("port")
        """
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def write(self, **state: object) -> None:
        """Replace the whole state with ``state``: a reader sees the old file or the new one, never half.

        Example::

            StateFile(Path(".kafka-local/broker.json")).write(pid=1234, port=9092)
        """
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, self.path)


def tail(text: str, lines: int = 40) -> str:
    """The last ``lines`` lines of ``text``, for an error message.

    Example::

        raise RuntimeError(f"initdb failed:\\n{tail(result.stdout)}")
    """
    return "\n".join(text.splitlines()[-lines:])


def log_tail_since(path: Path, offset: int, lines: int = 40) -> str:
    """The last ``lines`` lines the log at ``path`` got after byte ``offset`` (its size before a start).

    Example::

        offset = log_path.stat().st_size if log_path.exists() else 0
        ...  # start the server, appending to log_path
        raise RuntimeError(f"the server exited while starting:\\n{log_tail_since(log_path, offset)}")
    """
    with open(path, "rb") as log:
        log.seek(offset)
        return tail(log.read().decode(errors="replace"), lines)


def check_timeout(timeout: float) -> None:
    """Raise TypeError unless ``timeout`` is a number of seconds (not a bool), ValueError unless positive.

    Example::

        check_timeout(30.0)  # passes; check_timeout(0) raises ValueError
    """
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, not {timeout}")


def wait_until_gone(is_alive: Callable[[int], bool], pid: int, timeout: float) -> bool:
    """Poll ``is_alive(pid)`` every 0.1 s; True once it is False, False if it is still True after ``timeout``.

    Example::

        os.kill(pid, signal.SIGTERM)
        if not wait_until_gone(lambda pid: cmdline_has(pid, "kafka.Kafka"), pid, 30.0):
            os.kill(pid, signal.SIGKILL)
    """
    deadline = time.monotonic() + timeout
    while is_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def terminate(
    is_alive: Callable[[int], bool], pid: int, timeout: float, send: Callable[[int, int], None] = os.kill
) -> None:
    """SIGTERM, then SIGKILL if ``is_alive(pid)`` still holds after ``timeout``; a process already gone is fine.

    ``send`` is ``os.killpg`` for a server started in a process group of its own.

    Example::

        terminate(lambda pid: cmdline_has(pid, "kafka.Kafka"), pid, 30.0)
    """
    # The process may exit on its own between the caller's check and the signal.
    with contextlib.suppress(ProcessLookupError):
        send(pid, signal.SIGTERM)
        if not wait_until_gone(is_alive, pid, timeout):
            send(pid, signal.SIGKILL)
            wait_until_gone(is_alive, pid, 10.0)


def cmdline_has(pid: int, *needles: str | os.PathLike[str], other_user_counts: bool = False) -> bool:
    """Whether ``pid`` runs with each of ``needles`` as a whole argument: still our server, not a reused pid.

    Without /proc (not Linux) the command line is unknown, and a live pid is the best evidence there is.
    There, a live pid of another user counts only with ``other_user_counts``: for a server that runs as
    another user.

    Example::

        if cmdline_has(state["pid"], "kafka.Kafka", Path(".kafka-local/server.properties").resolve()):
            print("the broker still runs")
    """
    if Path("/proc/self/cmdline").exists():
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return all(os.fspath(needle).encode() in args for needle in needles)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, but another user's
        return other_user_counts
    except OSError:
        return False
    return True
