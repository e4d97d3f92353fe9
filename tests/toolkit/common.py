"""What every script needs: failing with one line, a free port, an HTTP GET, polling, psql."""

import socket
import sys
import time
import urllib.error
import urllib.request

from .processes import run


def fail(what, message):
    print(f"{what} FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=2.0):
    """(status, body) of one GET; (None, "") when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""
    except OSError:
        return None, ""


def wait_until(check, seconds):
    """True once `check()` is, polling every 50 ms; False after `seconds`."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return False


def psql(url, *statements, timeout=600):
    """What `statements` print, unaligned, one row a line. No psqlrc is read, so a
    developer's settings cannot change the output; a failed statement raises RuntimeError."""
    command = ["psql", url, "-v", "ON_ERROR_STOP=1", "-qAtX"]
    for statement in statements:
        command += ["-c", statement]
    return run(command, timeout=timeout).stdout
