"""Processes: those a script starts (all stopped at its end, on Ctrl-C or on an error) and
one-shot commands."""

from __future__ import annotations

import atexit
import signal
import subprocess
from pathlib import Path


class Procs:
    def __init__(self):
        self.live: list[subprocess.Popen] = []

    def start(self, cmd, **kw) -> subprocess.Popen:
        # A session of its own: Ctrl-C reaches the driver, which stops these in order.
        proc = subprocess.Popen(cmd, start_new_session=True, **kw)
        self.live.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, sig=signal.SIGTERM, timeout=30.0) -> int | None:
        """Sends `sig` and waits: the exit code, or None when it had not exited within
        `timeout` and was killed."""
        code = proc.poll()
        if code is None:
            try:
                proc.send_signal(sig)
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc in self.live:
            self.live.remove(proc)
        return code

    def stop_all(self):
        for proc in list(self.live):
            self.stop(proc, timeout=10.0)


PROCS = Procs()
# In sessions of their own, they are out of reach of a Ctrl-C at the terminal: whatever is
# left when the script ends (done, failed, or interrupted by Ctrl-C) is stopped then.
atexit.register(PROCS.stop_all)


def run(cmd, *, timeout=None, env=None, cwd=None, check=True) -> subprocess.CompletedProcess:
    res = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
    )
    if check and res.returncode != 0:
        raise RuntimeError(
            f"{Path(str(cmd[0])).name} exited with {res.returncode}: "
            f"{(res.stderr or res.stdout).strip()[-2000:]}"
        )
    return res
