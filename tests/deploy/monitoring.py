#!/usr/bin/env python3
"""The alert rules and the dashboard in deploy/, against a real Prometheus and Alertmanager.

A real Prometheus (Debian's 2.42) scrapes one `plantstore serve` on its own PostgreSQL
server, evaluating deploy/prometheus/plantstore-rules.yml, and a real Alertmanager (Debian's
0.25) routes the alerts to a webhook receiver here. deploy/grafana/plantstore-dashboard.json
must leave file provisioning nothing to fill in (no `${DS_...}` input) and filter every series
of every query by its `job` and `instance` variables; after a short load, every query of
every panel, the variables filled in as Grafana would, is run and must return data, and
before the load the queries of panels whose series appear only at a first event (a 401, a
prune) must each return a 0 of their own. Then the
database is stopped, a webhook endpoint fails, and the instance is stopped, one after
another: the receiver must get PlantStoreDatabaseUnreachable, PlantStoreDestinationFailing
and PlantStoreInstanceDown firing, no sooner than the rule's `for:` and within it plus
SLACK, and each resolved within SLACK of the fault's end, its runbook_url the address of
docs/operations.md set as prometheus.yml's external label plus an anchor that page has.
Prints each query and each alert's times; exits 1 on any failure.

Run from the repository root, as root, after `cargo test` (it uses target/debug/plantstore);
it needs Debian's prometheus, prometheus-alertmanager and PostgreSQL 15:
    python3 tests/deploy/monitoring.py
"""

import glob
import http.client
import http.server
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from toolkit.common import fail, free_port, get, psql, wait_until  # noqa: E402
from toolkit.service import Service, cli, prepare_database  # noqa: E402

WHAT = "monitoring"
BINARY = "target/debug/plantstore"
RULES = os.path.abspath("deploy/prometheus/plantstore-rules.yml")
DASHBOARD = "deploy/grafana/plantstore-dashboard.json"
RUNBOOK_PAGE = "docs/operations.md"
# Where an operator's copy of the repository shows RUNBOOK_PAGE, set once as an external
# label (docs/operations.md, "Alerts"); each alert's runbook_url adds its heading's anchor.
RUNBOOKS = "https://git.example.com/ops/plantstore/blob/main/docs/operations.md"
# From a rule's `for:` ending to the receiver's notice, and from a fault's end to the
# resolved notice: a scrape and an evaluation (1 s each here), the readiness check (5 s),
# Alertmanager's group wait (1 s), and the endpoint's next try (at most 5 s here).
SLACK = 30
# A panel whose series appear only at a first event (a 401, a prune) ends its query with
# this, so that before it the panel shows 0 rather than no data.
ZERO = " or on() vector(0)"
# What Grafana would put for `$__rate_interval` at a 1 s scrape is 4 s; a minute is what
# an operator's 15 s scrape gives, and every query must have data at that too.
RATE_INTERVAL = "1m"


class PostgresServer:
    """A PostgreSQL server of its own in `work`, run as the postgres user, to stop and start
    without touching the machine's."""

    def __init__(self, work):
        bindir = os.path.dirname(sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))[-1])
        self.pg_ctl, self.initdb = f"{bindir}/pg_ctl", f"{bindir}/initdb"
        self.data = os.path.join(work, "pg")
        self.port = free_port()
        os.makedirs(self.data)
        shutil.chown(self.data, "postgres", "postgres")
        self.as_postgres(self.initdb, "-D", self.data, "--auth=trust", "-U", "postgres")
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def as_postgres(self, *args):
        subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True,
                       capture_output=True, cwd="/")

    def start(self):
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories="
        self.as_postgres(self.pg_ctl, "-D", self.data, "-o", options, "-l",
                         f"{self.data}/log", "-w", "start")

    def stop(self):
        self.as_postgres(self.pg_ctl, "-D", self.data, "-m", "fast", "-w", "stop")


class Receivers(http.server.ThreadingHTTPServer):
    """Both receivers on one port: deletion events at /events (204, or 500 while `failing`),
    and Alertmanager's notifications at /alerts, each alert kept with when it came."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self):
        super().__init__(("127.0.0.1", 0), ReceiverHandler)
        self.failing = False
        self.notices = []  # (arrived, status, alertname, alert as Alertmanager sent it)
        self.lock = threading.Lock()

    def notice(self, alertname, status, since):
        """When the first notice of `alertname` with `status` came after `since`."""
        first = self.first(alertname, status, since)
        return first and first[0]

    def first(self, alertname, status, since):
        """(arrived, alert) of the first notice of `alertname` with `status` after `since`."""
        with self.lock:
            return next(((at, alert) for at, got, name, alert in self.notices
                         if name == alertname and got == status and at >= since), None)


class ReceiverHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        status = 204
        if self.path == "/alerts":
            arrived = time.monotonic()
            with self.server.lock:
                for alert in json.loads(body)["alerts"]:
                    self.server.notices.append((arrived, alert["status"],
                                                alert["labels"]["alertname"], alert))
        elif self.server.failing:
            status = 500
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *_):
        pass


def start(work, name, command):
    log = open(os.path.join(work, f"{name}.log"), "w")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def prometheus(work, instance_port, alertmanager_port):
    port = free_port()
    config = os.path.join(work, "prometheus.yml")
    with open(config, "w") as out:
        # JSON is YAML, as both read it.
        out.write(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                       "external_labels": {"plantstore_runbooks": RUNBOOKS}},
            "rule_files": [RULES],
            "alerting": {"alertmanagers": [
                {"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]},
            "scrape_configs": [{"job_name": "plantstore", "static_configs": [
                {"targets": [f"127.0.0.1:{instance_port}"]}]}],
        }))
    process = start(work, "prometheus", [
        "prometheus", f"--config.file={config}", f"--storage.tsdb.path={work}/tsdb",
        f"--web.listen-address=127.0.0.1:{port}"])
    if not wait_until(lambda: get(f"http://127.0.0.1:{port}/-/ready")[0] == 200, 60):
        fail(WHAT, "Prometheus never got ready (its log is in the work folder)")
    return process, port


def alertmanager(work, receiver_port):
    port = free_port()
    config = os.path.join(work, "alertmanager.yml")
    with open(config, "w") as out:
        out.write(json.dumps({
            "route": {"receiver": "test", "group_by": ["alertname", "instance", "endpoint"],
                      "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "test", "webhook_configs": [
                {"url": f"http://127.0.0.1:{receiver_port}/alerts", "send_resolved": True}]}],
        }))
    process = start(work, "alertmanager", [
        "prometheus-alertmanager", f"--config.file={config}", f"--storage.path={work}/am",
        f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="])
    if not wait_until(lambda: get(f"http://127.0.0.1:{port}/-/ready")[0] == 200, 60):
        fail(WHAT, "Alertmanager never got ready (its log is in the work folder)")
    return process, port


def api(prometheus_port, path):
    """Prometheus's HTTP API answer at `path` (after `/api/v1/`), an error's body too."""
    url = f"http://127.0.0.1:{prometheus_port}/api/v1/{path}"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return json.loads(err.read() or b"{}")


def query(prometheus_port, expr):
    """Prometheus's answer to an instant query: (status, result)."""
    body = api(prometheus_port, "query?" + urllib.parse.urlencode({"query": expr}))
    return body.get("status"), body.get("data", {}).get("result", []) or body.get("error")


def selectors(expr):
    """(metric, its `{...}` or "") for each series the PromQL `expr` names."""
    out = []
    for name in re.finditer(r"\b(?:plantstore|process)_\w+", expr):
        rest = expr[name.end():]
        end, quoted = 0, False
        if rest.startswith("{"):
            # To the brace that closes it: a label's value may hold one ("/plants/{id}").
            for end, char in enumerate(rest):
                if char == '"' and rest[end - 1] != "\\":
                    quoted = not quoted
                elif char == "}" and not quoted:
                    end += 1
                    break
        out.append((name.group(), rest[:end]))
    return out


def check_dashboard_file():
    """The dashboard, after failing unless it provisions from a file as docs/operations.md
    says: no `${DS_...}` input left to fill at import, every panel and query on the
    `$datasource` variable, `job` and `instance` query variables offering All, and every
    series of every query filtered by both."""
    with open(DASHBOARD) as file:
        text = file.read()
    dashboard = json.loads(text)
    if "${DS_" in text or "__inputs" in dashboard:
        fail(WHAT, f"{DASHBOARD} has an import input (${{DS_...}}), which file provisioning "
                   "never fills in")
    variables = {each["name"]: each for each in dashboard["templating"]["list"]}
    source = variables.get("datasource", {})
    if source.get("type") != "datasource" or source.get("query") != "prometheus":
        fail(WHAT, f"{DASHBOARD} has no Prometheus data source variable `datasource`")
    for name in ("job", "instance"):
        variable = variables.get(name, {})
        if variable.get("type") != "query" or not (variable.get("includeAll")
                                                   and variable.get("multi")):
            fail(WHAT, f"{DASHBOARD} has no query variable `{name}` offering All")
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            for where in (panel, target):
                if where.get("datasource", {}).get("uid") != "${datasource}":
                    fail(WHAT, f"panel {panel['title']!r} reads another data source than "
                               "${datasource}")
            for metric, selector in selectors(target["expr"]):
                if 'job=~"$job"' not in selector or 'instance=~"$instance"' not in selector:
                    fail(WHAT, f"panel {panel['title']!r}: {metric} is not filtered by "
                               f"$job and $instance in {target['expr']}")
    return dashboard


def grafana_regex_escape(value):
    """One value of a multi-value variable as Grafana's Prometheus data source writes it
    into a query (its prometheusSpecialRegexEscape): regex metacharacters escaped, the
    backslashes doubled for the PromQL string around it."""
    value = value.replace("\\", "\\" * 4)
    return re.sub(r"[$^*{}\[\]+?.()|]", lambda char: "\\\\" + char.group(), value)


def interpolate(text, values):
    """`text` with each `$name` or `${name}` replaced by values[name]."""
    def value(variable):
        name = variable.group(1) or variable.group(2)
        if name not in values:
            fail(WHAT, f"{DASHBOARD}: nothing for ${name} in {text}")
        return values[name]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, text)


def variable_values(prometheus_port, dashboard):
    """Each variable as Grafana fills it in with All picked, or None while one finds
    nothing: `$job`, then `$instance` (whose query names `$job`), each every label value
    Prometheus has for its `label_values(selector, label)`, escaped and joined as a regex.
    `$datasource` is this Prometheus; `$__rate_interval` is RATE_INTERVAL."""
    values = {"__rate_interval": RATE_INTERVAL}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "datasource":
            continue
        query = variable["query"]
        query = query if isinstance(query, str) else query["query"]
        parsed = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
        if not parsed:
            fail(WHAT, f"variable {variable['name']}: {query!r} is not label_values(...)")
        selector, label = interpolate(parsed.group(1), values), parsed.group(2)
        answer = api(prometheus_port, f"label/{label}/values?"
                     + urllib.parse.urlencode({"match[]": selector}))
        options = [grafana_regex_escape(each) for each in sorted(answer.get("data") or [])]
        if not options:
            return None
        values[variable["name"]] = (options[0] if len(options) == 1
                                    else "(" + "|".join(options) + ")")
    return values


def panel_queries(prometheus_port, dashboard):
    """(panel title, expression) for each query of each panel, as Grafana would send it."""
    found = []
    if not wait_until(lambda: found.append(variable_values(prometheus_port, dashboard))
                      or found[-1], 30):
        fail(WHAT, "the dashboard's variables found no job or instance in Prometheus")
    values = found[-1]
    print("dashboard variables: " + ", ".join(
        f"${name} = {value}" for name, value in values.items()))
    return [(panel["title"], interpolate(target["expr"], values))
            for panel in dashboard["panels"] for target in panel.get("targets", [])]


class Load:
    """Deletes (with the token, some without, some of plants already gone) until stopped."""

    def __init__(self, port, token, plants):
        self.port, self.token, self.plants = port, token, plants
        self.stop = threading.Event()
        self.statuses = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        plant = 0
        while not self.stop.is_set() and plant < self.plants:
            plant += 1
            for target, headers in ((plant, {"Authorization": f"Bearer {self.token}"}),
                                    (plant, {}), (max(plant - 1, 1), {
                                        "Authorization": f"Bearer {self.token}"})):
                conn.request("DELETE", f"/plants/{target}", headers=headers)
                answer = conn.getresponse()
                answer.read()
                self.statuses.append(answer.status)
            time.sleep(0.02)
        conn.close()


def check_dashboard(prometheus_port, dashboard):
    queries = panel_queries(prometheus_port, dashboard)
    if not queries:
        fail(WHAT, f"no panel queries in {DASHBOARD}")
    with_data = {}

    def all_have_data():
        for title, expr in queries:
            if (title, expr) in with_data:
                continue
            status, result = query(prometheus_port, expr)
            if status != "success":
                fail(WHAT, f"panel {title!r}: Prometheus refused {expr}: {result}")
            if result:
                with_data[(title, expr)] = len(result)
        return len(with_data) == len(queries)

    wait_until(all_have_data, 90)
    print(f"dashboard: {len(queries)} queries of {len({t for t, _ in queries})} panels run, "
          f"{len(with_data)} with data")
    for title, expr in queries:
        series = with_data.get((title, expr))
        print(f"  {'ok' if series else 'NO DATA'}: {title}: {expr} "
              f"({series or 0} series)")
    missing = [title for title, expr in queries if (title, expr) not in with_data]
    if missing:
        fail(WHAT, f"panels with a query that returned no data: {sorted(set(missing))}")


def check_zero_before_first_event(prometheus_port, dashboard):
    """Before any request but the probes: each query ending in ZERO answers one 0, and
    without ZERO it answers nothing (its series do not exist yet), so the 0 is ZERO's."""
    queries = [(title, expr) for title, expr in panel_queries(prometheus_port, dashboard)
               if expr.endswith(ZERO)]
    if not queries:
        fail(WHAT, f"no query of {DASHBOARD} ends with{ZERO}")
    print(f"dashboard before the load: {len(queries)} queries that show 0 before a first event")
    for title, expr in queries:
        without = expr[:-len(ZERO)]
        status, result = query(prometheus_port, without)
        if status != "success" or result:
            fail(WHAT, f"panel {title!r}: {without} answered {result} before the load, "
                       "not nothing: the 0 would not be ZERO's")
        status, result = query(prometheus_port, expr)
        if status != "success" or [each["value"][1] for each in result] != ["0"]:
            fail(WHAT, f"panel {title!r}: {expr} answered {result} before the load, not 0")
        print(f"  ok: {title}: 0: {expr}")


def rule_for(prometheus_port, alertname):
    """The `for:` of `alertname` as the running Prometheus loaded it, in seconds."""
    groups = api(prometheus_port, "rules?type=alert").get("data", {}).get("groups", [])
    durations = [rule["duration"] for group in groups for rule in group["rules"]
                 if rule["name"] == alertname]
    if len(durations) != 1:
        fail(WHAT, f"Prometheus has {len(durations)} rules named {alertname}, not one")
    return durations[0]


def check_runbook(alert):
    """Fails unless the notice's runbook_url opens: an absolute http(s) address, the page
    set in RUNBOOKS, at the anchor GitHub and GitLab give the alert's heading there."""
    name, url = alert["labels"]["alertname"], alert["annotations"].get("runbook_url", "")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        fail(WHAT, f"{name}'s runbook_url {url!r} is not an absolute http(s) address")
    if url != f"{RUNBOOKS}#{name.lower()}":
        fail(WHAT, f"{name}'s runbook_url is {url!r}, not {RUNBOOKS}#{name.lower()}")
    with open(RUNBOOK_PAGE) as page:
        if not re.search(rf"^#+ {name}$", page.read(), re.MULTILINE):
            fail(WHAT, f"{RUNBOOK_PAGE} has no heading {name} for its runbook_url")
    return url


def fires_and_resolves(receivers, prometheus_port, alertname, cause, cure):
    """Causes the fault, waits for `alertname` firing, cures it, waits for it resolved;
    fails unless each came in time. Returns (fired after, resolved after) in seconds."""
    window = rule_for(prometheus_port, alertname)
    began = time.monotonic()
    cause()
    if not wait_until(lambda: receivers.notice(alertname, "firing", began), window + SLACK):
        fail(WHAT, f"{alertname} did not fire within {window + SLACK} s of the fault")
    arrived, alert = receivers.first(alertname, "firing", began)
    fired = arrived - began
    if fired < window:
        fail(WHAT, f"{alertname} fired {fired:.1f} s after the fault, before its for: {window} s")
    runbook = check_runbook(alert)
    cured = time.monotonic()
    cure()
    if not wait_until(lambda: receivers.notice(alertname, "resolved", cured), SLACK):
        fail(WHAT, f"{alertname} was not resolved within {SLACK} s of the fault's end")
    resolved = receivers.notice(alertname, "resolved", cured) - cured
    print(f"ok: {alertname} (for: {window} s): fired {fired:.1f} s after the fault, "
          f"resolved {resolved:.1f} s after its end; runbook {runbook}")
    return fired, resolved


def main():
    if not os.path.exists(BINARY):
        fail(WHAT, f"{BINARY} is missing; run `cargo build` first")
    dashboard = check_dashboard_file()
    work = tempfile.mkdtemp(prefix="plantstore-monitoring-")
    os.chmod(work, 0o755)
    processes = []
    database = PostgresServer(work)
    try:
        database.start()
        psql(database.url, "CREATE DATABASE shop")
        url = database.url.rsplit("/", 1)[0] + "/shop"
        token = prepare_database(BINARY, url, 100_000)
        receivers = Receivers()
        threading.Thread(target=receivers.serve_forever, daemon=True).start()
        cli(BINARY, url, "webhooks", "add",
            f"http://127.0.0.1:{receivers.server_address[1]}/events")
        port = free_port()
        instance = Service("monitored", BINARY, url, port, work,
                           PLANTSTORE_DELETION_RETENTION="2d",
                           PLANTSTORE_WEBHOOK_RETRY_MAX="5s", PLANTSTORE_SHUTDOWN_DELAY="0s")
        if not instance.start():
            fail(WHAT, "the service did not get ready")
        am, am_port = alertmanager(work, receivers.server_address[1])
        processes.append(am)
        prom, prom_port = prometheus(work, port, am_port)
        processes.append(prom)

        check_zero_before_first_event(prom_port, dashboard)
        load = Load(port, token, 100_000)
        load.thread.start()
        time.sleep(5)  # a few seconds of load before the first query: Prometheus needs samples
        check_dashboard(prom_port, dashboard)
        load.stop.set()
        load.thread.join()

        def fail_endpoint():
            receivers.failing = True
            # A delete to make an event; as a client would, again after a 503.
            def deleted():
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                conn.request("DELETE", "/plants/99999",
                             headers={"Authorization": f"Bearer {token}"})
                return conn.getresponse().status == 204
            if not wait_until(deleted, 30):
                fail(WHAT, "the delete that makes an event for the failing endpoint never got 204")

        def cure_endpoint():
            receivers.failing = False

        fires_and_resolves(receivers, prom_port, "PlantStoreDatabaseUnreachable",
                           database.stop, database.start)
        fires_and_resolves(receivers, prom_port, "PlantStoreDestinationFailing",
                           fail_endpoint, cure_endpoint)
        fires_and_resolves(receivers, prom_port, "PlantStoreInstanceDown", instance.stop,
                           lambda: instance.start() or fail(WHAT, "the restart failed"))
        others = sorted({name for _, status, name, _ in receivers.notices} - {
            "PlantStoreDatabaseUnreachable", "PlantStoreDestinationFailing",
            "PlantStoreInstanceDown"})
        print(f"other alerts the receiver got: {others or 'none'}")
        instance.stop()
    finally:
        for process in processes:
            process.terminate()
            process.wait()
        try:
            database.stop()
        except subprocess.CalledProcessError:
            pass
    shutil.rmtree(work, ignore_errors=True)
    print("ok: monitoring")


if __name__ == "__main__":
    main()
