"""The command line's exit codes, one table for every command."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What a command's exit status means; scripts and tests compare against these."""

    OK = 0
    # The command ran and found something wrong: an audit that is not clean, a stream that failed,
    # a development server that is not running, a reset not confirmed.
    FAILED = 1
    # Bad input, found before Spark starts: a config key, a flag's value. The message names it.
    BAD_INPUT = 2
    # A start or reset refused because going on would break exactly-once: the message names what was
    # found and the command that gets out of it.
    REFUSED = 3
