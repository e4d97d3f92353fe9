"""The service: `plantstore serve` started, waited for, stopped and measured; its CLI; and a
database prepared as a user prepares one."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from .common import get
from .processes import PROCS, run

# Often enough to time a start to its first 200 from /readyz within a few milliseconds
# (bench/run reports that time).
READY_POLL_S = 0.002
# dotenvy reads a .env from the working directory or any folder above it: the service and
# its CLI run in /, so that no checkout's .env adds to what they are given.
WORKING_DIRECTORY = "/"


class NotReady(RuntimeError):
    pass


def environment(database_url: str, **settings) -> dict:
    """The service's whole environment: PATH, the database and `settings`. Nothing else of
    the caller's is passed on, such as a PLANTSTORE_*, RUST_LOG or proxy variable."""
    return {"PATH": os.environ.get("PATH", ""), "DATABASE_URL": database_url, **settings}


def cli(binary, database_url: str, *args: str, timeout=3600, **settings) -> str:
    """What `plantstore ARGS` prints on `database_url`, with `settings` in its environment;
    RuntimeError when it fails."""
    return run([os.path.abspath(binary), *args], timeout=timeout,
               env=environment(database_url, **settings), cwd=WORKING_DIRECTORY).stdout


def prepare_database(binary, database_url: str, plants: int) -> str:
    """Migrates, seeds plants 1..`plants` and returns a new token, as a user would."""
    cli(binary, database_url, "migrate")
    cli(binary, database_url, "seed", "--count", str(plants))
    return cli(binary, database_url, "token", "create", "--name", "toolkit").split()[-1]


class Service:
    """One `plantstore serve` of `binary` on `database_url` at 127.0.0.1:`port`, started and
    stopped as often as asked; all it prints goes to `work/NAME.log`.

    It is set up as a deploy beside a database prepared beforehand (`prepare_database`): no
    migration at start, logs at warn; `settings` add to that or change it. Everything else
    is the product's default (see `environment`)."""

    def __init__(self, name: str, binary, database_url: str, port: int, work, **settings):
        self.name, self.port = name, port
        self.binary = os.path.abspath(binary)
        self.log = Path(work) / f"{name}.log"
        self.env = environment(database_url, **{
            "PLANTSTORE_LISTEN": f"127.0.0.1:{port}", "PLANTSTORE_MIGRATE": "false",
            "RUST_LOG": "warn", **settings})
        self.process: subprocess.Popen | None = None
        self.not_ready = ""

    def start(self, within: float = 30.0) -> bool:
        """Starts it and waits until /readyz answers 200. False, with the process stopped,
        when it exited first or was not ready within `within` seconds; `not_ready` then says
        which, with the log's last lines."""
        with open(self.log, "ab") as out:
            self.process = PROCS.start([self.binary, "serve"], stdin=subprocess.DEVNULL,
                                       stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                       cwd=WORKING_DIRECTORY)
        try:
            wait_ready(self.process, self.port, "/readyz", 200, self.log, within)
        except NotReady as err:
            self.not_ready = str(err)
            self.kill()
            return False
        return True

    def stop(self, timeout: float = 30.0) -> tuple[int | None, float]:
        """SIGTERM, as a deploy sends it: the exit code (None if it had not exited within
        `timeout` seconds, and was killed) and the seconds it took."""
        signalled = time.monotonic()
        code = PROCS.stop(self.process, signal.SIGTERM, timeout)
        return code, time.monotonic() - signalled

    def kill(self) -> None:
        """SIGKILL, as a crash; nothing when it is not running."""
        if self.process is not None:
            PROCS.stop(self.process, signal.SIGKILL)

    def rss_mib(self) -> float | None:
        return self._status_mib("VmRSS")

    def peak_rss_mib(self) -> float | None:
        return self._status_mib("VmHWM")

    def descriptors(self) -> int | None:
        """Its open file descriptors; None when it is not running."""
        if self.process is None or self.process.poll() is not None:
            return None
        try:
            return len(os.listdir(f"/proc/{self.process.pid}/fd"))
        except OSError:
            return None

    def _status_mib(self, field: str) -> float | None:
        """A memory figure of /proc/PID/status in MiB; None when it is not running."""
        if self.process is None or self.process.poll() is not None:
            return None
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return None


def wait_ready(proc: subprocess.Popen, port: int, path: str, ok: int, log: Path | None,
               within: float) -> None:
    """Polls until `path` answers `ok`; NotReady, with the end of `log`, when `proc` exits
    first or `within` seconds pass."""
    started = time.perf_counter()
    while True:
        if get(f"http://127.0.0.1:{port}{path}", timeout=1.0)[0] == ok:
            return
        if proc.poll() is not None:
            tail = ""
            if log and log.exists():
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise NotReady(f"{proc.args[0]} exited with {proc.returncode} before {path} "
                           f"answered {ok}:\n{tail}")
        if time.perf_counter() - started > within:
            raise NotReady(f"{proc.args[0]}: {path} did not answer {ok} in {within:.0f} s")
        time.sleep(READY_POLL_S)
