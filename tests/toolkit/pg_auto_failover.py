"""A pg_auto_failover formation of a script's own: a monitor and two nodes with synchronous
replication, each on its own port and folder, run as the postgres user (Debian's
postgresql-15-auto-failover and pg-auto-failover-cli); and the watch for which node takes
writes after a fault."""

import glob
import json
import os
import signal
import subprocess
import threading
import time

from .common import fail, free_port, wait_until


class Cluster:
    """A pg_auto_failover monitor and two nodes in `work`, run as the postgres user; `what`
    names the script in its failures."""

    def __init__(self, work, what):
        self.work, self.what = work, what
        self.pg_ctl = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))[-1]
        self.env = {
            "PATH": f"{os.path.dirname(self.pg_ctl)}:/usr/sbin:/usr/bin:/sbin:/bin",
            "XDG_CONFIG_HOME": f"{work}/config",
            "XDG_DATA_HOME": f"{work}/data",
            "HOME": work,
        }
        self.ports = {name: free_port() for name in ("monitor", "node1", "node2")}
        self.processes = []

    def autoctl(self, *args, background=None):
        command = ["runuser", "-u", "postgres", "--", "pg_autoctl", *args]
        if background:
            log = open(os.path.join(self.work, f"{background}.log"), "w")
            self.processes.append(subprocess.Popen(command, env=self.env, stdout=log,
                                                   stderr=subprocess.STDOUT, cwd=self.work))
            return ""
        return subprocess.run(command, env=self.env, check=True, capture_output=True,
                              text=True, cwd=self.work).stdout

    def node_url(self, node, database="shop"):
        return f"postgres://postgres@127.0.0.1:{self.ports[node]}/{database}"

    def start(self):
        monitor_port = self.ports["monitor"]
        self.autoctl("create", "monitor", "--pgdata", f"{self.work}/monitor",
                     "--pgport", str(monitor_port), "--hostname", "127.0.0.1", "--auth",
                     "trust", "--no-ssl", "--pgctl", self.pg_ctl, "--run",
                     background="monitor")
        monitor = f"postgres://autoctl_node@127.0.0.1:{monitor_port}/pg_auto_failover?sslmode=disable"
        # Not `pg_autoctl show state` yet: run while `create monitor` makes its state
        # folder, it makes the same folder, and one of the two fails ("File exists").
        ready = lambda: subprocess.run(["psql", monitor, "-qAtc", "SELECT 1"],
                                       capture_output=True).returncode == 0
        if not wait_until(ready, 60) or not wait_until(lambda: self.states() is not None, 60):
            fail(self.what, "the monitor never answered")
        for node in ("node1", "node2"):
            self.autoctl("create", "postgres", "--pgdata", f"{self.work}/{node}", "--pgport",
                         str(self.ports[node]), "--hostname", "127.0.0.1", "--auth", "trust",
                         "--no-ssl", "--dbname", "shop", "--monitor", monitor, "--pgctl",
                         self.pg_ctl, "--run", background=node)
            want = ["single"] if node == "node1" else ["primary", "secondary"]
            # The standby's base backup waits for a checkpoint; ask for one at once.
            if not wait_until(lambda: self.settled(want, nudge=node == "node2"), 180):
                fail(self.what, f"{node} never reached {want}: {self.states()}")

    def states(self):
        try:
            out = self.autoctl("show", "state", "--pgdata", f"{self.work}/monitor", "--json")
        except subprocess.CalledProcessError:
            return None
        try:
            return {n["nodename"]: (n["current_group_state"], n["assigned_group_state"])
                    for n in json.loads(out)}
        except (ValueError, KeyError, TypeError):
            return None

    def settled(self, want, nudge=False):
        if nudge:
            subprocess.run(["psql", self.node_url("node1", "postgres"), "-qAtc", "CHECKPOINT"],
                           capture_output=True)
        states = self.states() or {}
        reported = sorted(r for r, a in states.values() if r == a)
        return len(states) == len(want) and reported == sorted(want)

    def uri(self):
        uri = self.autoctl("show", "uri", "--pgdata", f"{self.work}/monitor", "--formation",
                           "default").strip()
        # It names no user; the nodes were made by and for `postgres`.
        return uri.replace("://", "://postgres@", 1)

    def writable(self):
        """The node that commits a write now, if one does. The write is a WAL message, so
        its commit waits for the synchronous standby as a delete's does (a transaction
        that only takes an xid writes no WAL before its commit and does not wait). A node
        whose sessions start read-only does not count, though the message would pass
        there: pg_auto_failover keeps a standby it promotes so (`stop_replication`) until
        the old primary is demoted, and target_session_attrs=read-write passes it over."""
        for node in ("node1", "node2"):
            try:
                out = subprocess.run(
                    ["psql", self.node_url(node), "-qAtc",
                     "SELECT current_setting('transaction_read_only') = 'off' AND "
                     "pg_logical_emit_message(true, 'plantstore-probe', '') IS NOT NULL"],
                    capture_output=True, text=True, timeout=2)
            except subprocess.TimeoutExpired:
                continue
            if out.stdout.strip() == "t":
                return node
        return None

    def postmaster_pid(self, node):
        with open(f"{self.work}/{node}/postmaster.pid") as f:
            return int(f.readline())

    def stop(self):
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        subprocess.run(["pkill", "-KILL", "-f", f"{self.work}/"], capture_output=True)


class Writability(threading.Thread):
    """Polls, from its start, which node commits a write, so a fault's recovery is timed
    from when a primary took writes, not from when a command returned."""

    def __init__(self, cluster, exclude=None):
        super().__init__(daemon=True)
        self.cluster, self.exclude = cluster, exclude
        self.found = None  # (node, time.monotonic())
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            node = self.cluster.writable()
            if node and node != self.exclude:
                self.found = (node, time.monotonic())
                return
            time.sleep(0.05)

    def wait(self, seconds=120):
        self.join(seconds)
        self.done.set()
        if self.found is None:
            fail(self.cluster.what,
                 f"no node took writes within {seconds} s: {self.cluster.states()}")
        return self.found
