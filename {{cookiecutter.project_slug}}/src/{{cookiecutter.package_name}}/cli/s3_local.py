"""`s3-local start|stop|status`: a local S3-compatible server (SeaweedFS) for development and tests.

`start` prints the endpoint and the path of the credentials file (AWS shared-credentials format,
profile `default`), never the secret:

    <console script> s3-local start    # http://127.0.0.1:38333, then "credentials file: ..."
    <console script> s3-local status   # exit code 1 when not running
    <console script> s3-local stop
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..pipeline.config import Config


def register(commands) -> None:
    """`s3-local start|stop|status`."""
    local = commands.add_parser("s3-local", help="a local S3-compatible server (SeaweedFS) for development")
    local.add_argument("action", choices=["start", "stop", "status"])
    local.set_defaults(handler=s3_local)


def s3_local(config: Config, args: argparse.Namespace) -> int:
    from ..devtools.s3_local import LocalS3
    from .local_servers import start_stop_or_status

    server = LocalS3(s3_local_home(config))
    return start_stop_or_status(server, "s3-local", args.action, ("credentials file", server.credentials_file))


def s3_local_home(config: Config) -> Path:
    """The development server's home: ``s3_local.home`` (S3_LOCAL_HOME), `.s3-local` by default."""
    return config.s3_local_home
