"""The plantstore service: its environment, CLI, start, readiness, log trimming and memory (RSS)."""

from __future__ import annotations

import collections
import os
import socket
import subprocess
import time
from pathlib import Path

from .procs import PROCS, run

READYZ_POLL_S = 0.002


def service_env() -> dict:
    # Product defaults only: no DATABASE_URL / PLANTSTORE_* (rate limit, pool size, ...) from the
    # caller's environment; the working directory is the run's work dir, so no .env is read.
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith("PLANTSTORE_") or k == "DATABASE_URL" or k == "RUST_LOG")
    }
    env["RUST_LOG"] = "info"
    return env


class Service:
    def __init__(self, binary: Path, work: Path, env: dict | None = None):
        self.binary = binary
        self.work = work
        # Settings of this build's own, under every start's.
        self.env = env or {}

    def cli(self, url: str, *args: str, timeout=3600) -> str:
        res = run(
            [self.binary, "--database-url", url, *args],
            timeout=timeout,
            env=service_env(),
            cwd=self.work,
        )
        return res.stdout

    def start(self, url: str, port: int, logfile: Path,
              extra_env: dict | None = None) -> subprocess.Popen:
        out = open(logfile, "ab")
        try:
            return PROCS.start(
                [str(self.binary), "--database-url", url, "serve", "--listen", f"127.0.0.1:{port}"],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**service_env(), **self.env, **(extra_env or {})},
                cwd=self.work,
            )
        finally:
            out.close()


def http_status(port: int, path: str, timeout=1.0) -> int | None:
    """Status of one GET on a fresh connection, or None when nothing answers yet."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
            )
            head = b""
            while b"\r\n" not in head:
                chunk = s.recv(256)
                if not chunk:
                    return None
                head += chunk
            parts = head.split(b"\r\n", 1)[0].split()
            return int(parts[1]) if len(parts) >= 2 else None
    except (OSError, ValueError):
        return None


def wait_ready(proc: subprocess.Popen, port: int, path: str, ok: int, logfile: Path | None,
               timeout: float, started: float) -> float:
    """Poll until `path` answers `ok`; returns seconds since `started`."""
    while True:
        if http_status(port, path) == ok:
            return time.perf_counter() - started
        if proc.poll() is not None:
            tail = ""
            if logfile and logfile.exists():
                tail = "\n".join(logfile.read_text(errors="replace").splitlines()[-15:])
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before {path} "
                               f"answered {ok}:\n{tail}")
        if time.perf_counter() - started > timeout:
            raise RuntimeError(f"{proc.args[0]}: {path} did not answer {ok} in {timeout:.0f} s")
        time.sleep(READYZ_POLL_S)


def trim_log(path: Path, keep: int = 40) -> int:
    """Cut a service log (one line per request at RUST_LOG=info) to its first and last `keep`
    lines; returns how many lines it had."""
    head, tail, n = [], collections.deque(maxlen=keep), 0
    with open(path, "rb") as f:
        for line in f:
            n += 1
            if n <= keep:
                head.append(line)
            else:
                tail.append(line)
    if n > 2 * keep:
        cut = n - len(head) - len(tail)
        with open(path, "wb") as f:
            f.writelines(head)
            f.write(f"[... {cut} lines cut by bench/run; BENCH_KEEP=1 keeps them ...]\n".encode())
            f.writelines(tail)
    return n


def proc_status_mib(pid: int, field: str) -> float | None:
    """A memory figure of /proc/PID/status (such as VmHWM or VmRSS), in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def vm_hwm_mib(pid: int) -> float | None:
    return proc_status_mib(pid, "VmHWM")
