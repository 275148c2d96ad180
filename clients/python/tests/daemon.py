"""Starts a real compactd on a temp socket and database for the tests (COMPACTD_BIN names the
binary; else the repository's target/ build)."""

import os
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


def binary() -> str:
    if os.environ.get("COMPACTD_BIN"):
        return os.environ["COMPACTD_BIN"]
    for profile in ("release", "debug"):
        path = os.path.join(REPO, "target", profile, "compactd")
        if os.path.exists(path):
            return path
    raise RuntimeError("build compactd first (cargo build) or set COMPACTD_BIN")


class Daemon:
    def __init__(self, config: str = ""):
        self.dir = tempfile.TemporaryDirectory()
        self.socket = os.path.join(self.dir.name, "compactd.sock")
        config_path = os.path.join(self.dir.name, "config.toml")
        with open(config_path, "w") as f:
            f.write(config)
        self.args = [binary(), "--socket", self.socket, "serve",
                     "--db", os.path.join(self.dir.name, "compactd.db"), "--config", config_path]
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(self.args, stderr=subprocess.DEVNULL)
        # Ready when the socket answers (bounded: a daemon that does not come up fails the test).
        deadline = time.monotonic() + 30
        import compactd
        client = compactd.Client(self.socket)
        while True:
            try:
                client.health()
                return
            except compactd.NotRunning:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("compactd did not start")
                time.sleep(0.02)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)

    def close(self) -> None:
        if self.process.poll() is None:
            self.stop()
        self.dir.cleanup()
