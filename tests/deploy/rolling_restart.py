#!/usr/bin/env python3
"""A rolling restart behind a load balancer loses no request.

Three `plantstore serve` instances on one fresh PostgreSQL database, behind HAProxy
(tests/deploy/haproxy.cfg; `--balancer nginx` for nginx.conf), 32 clients deleting through
the balancer on kept-alive connections. Each instance in turn is sent SIGTERM, must exit 0,
and is started again on its port. Then: every answer was 204 or 404 (no connection closed
without an answer, no 5xx), every 204 names a plant that is gone and audited exactly once,
nothing is gone that nobody asked for, and every instance served deletes again after its
restart. Prints the answer counts and each restart's timings; exits 1 on any failure.

Run from the repository root after `cargo test` (it uses target/debug/plantstore):
    python3 tests/deploy/rolling_restart.py
PLANTSTORE_CI_POSTGRES_URL names the server (default postgres://postgres@127.0.0.1:5432/postgres).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from toolkit.common import fail, free_port, get, psql, wait_until  # noqa: E402
from toolkit.service import Service, prepare_database  # noqa: E402
from fixtures import Clients, check_database, fail_on  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WHAT = "rolling restart"


def start_balancer(kind, front, instances, work):
    if kind == "haproxy":
        env = dict(os.environ, FRONTEND=f"127.0.0.1:{front}")
        for letter, instance in zip("ABC", instances):
            env[f"INSTANCE_{letter}"] = f"127.0.0.1:{instance.port}"
        command = ["haproxy", "-db", "-f", os.path.join(HERE, "haproxy.cfg")]
    else:
        with open(os.path.join(HERE, "nginx.conf")) as f:
            conf = f.read().replace("127.0.0.1:8080", f"127.0.0.1:{front}")
        for default, instance in zip((8081, 8082, 8083), instances):
            conf = conf.replace(f"127.0.0.1:{default}", f"127.0.0.1:{instance.port}")
        conf = conf.replace(
            "http {", f"http {{\n    access_log off;\n    error_log {work}/nginx-error.log;", 1)
        path = os.path.join(work, "nginx.conf")
        with open(path, "w") as f:
            f.write(conf)
        env = os.environ
        command = ["nginx", "-c", path, "-p", work, "-e", f"{work}/nginx-error.log",
                   "-g", f"daemon off; pid {work}/nginx.pid;"]
    balancer = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                                stderr=open(os.path.join(work, f"{kind}.log"), "w"))
    if not wait_until(lambda: get(f"http://127.0.0.1:{front}/readyz")[0] == 200, 15):
        fail(WHAT, f"{kind} did not come up")
    return balancer


def deletes_served(port):
    """DELETE requests the instance on `port` answered since its start, from its /metrics."""
    status, text = get(f"http://127.0.0.1:{port}/metrics")
    if status != 200:
        return 0
    total = 0
    for line in text.splitlines():
        if line.startswith("plantstore_http_requests_total{") and 'method="DELETE"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--balancer", choices=("haproxy", "nginx"), default="haproxy")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--plants", type=int, default=100_000)
    parser.add_argument("--binary", default="target/debug/plantstore")
    # Longer than haproxy.cfg's 2 checks x 300 ms to take an instance out; 0s shows the loss
    # a restart without a drain causes.
    parser.add_argument("--delay", default="2s", help="PLANTSTORE_SHUTDOWN_DELAY")
    args = parser.parse_args()
    if not os.access(args.binary, os.X_OK):
        fail(WHAT, f"{args.binary} is missing; run cargo test first")
    admin = os.environ.get("PLANTSTORE_CI_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    database = f"plantstore_rolling_{os.getpid()}"
    url = f"{admin.rsplit('/', 1)[0]}/{database}"
    psql(admin, f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
    psql(admin, f"CREATE DATABASE {database}")
    work = tempfile.mkdtemp(prefix="plantstore-rolling-")
    instances, balancer = [], None
    try:
        token = prepare_database(args.binary, url, args.plants)
        instances = [Service(n, args.binary, url, free_port(), work,
                             PLANTSTORE_SHUTDOWN_DELAY=args.delay) for n in "abc"]
        for instance in instances:
            if not instance.start():
                fail(WHAT, f"instance {instance.name} never got ready")
        front = free_port()
        balancer = start_balancer(args.balancer, front, instances, work)

        restarts = []
        started = time.monotonic()
        with Clients(args.clients, front, token, args.plants) as clients:
            time.sleep(2)
            for instance in instances:
                code, took = instance.stop()
                if code != 0:
                    fail(WHAT, f"instance {instance.name} exited {code} after SIGTERM")
                if not instance.start():
                    fail(WHAT, f"instance {instance.name} never got ready again")
                restarts.append((instance.name, code, took))
                time.sleep(3)  # back in the balancer after two good checks, then serving
            time.sleep(1)
        elapsed = time.monotonic() - started

        counts = clients.counts()
        print(f"{args.balancer}: {len(clients.answers)} requests from {args.clients} clients "
              f"in {elapsed:.1f} s; answers: "
              + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items(), key=str)))
        for name, code, took in restarts:
            print(f"instance {name}: SIGTERM -> exit {code} after {took:.2f} s, started again")
        served = {i.name: deletes_served(i.port) for i in instances}
        print("deletes each instance served after its restart: "
              + ", ".join(f"{k}: {v}" for k, v in served.items()))

        fail_on(WHAT, [f"plant {a.plant}: {a.status}" for a in clients.answers
                       if a.status not in (204, 404)], "answers were neither 204 nor 404")
        idle = [name for name, count in served.items() if count == 0]
        if idle:
            fail(WHAT, f"instances {idle} served no delete after their restart")
        problems, _ = check_database(url, clients.answers, args.plants)
        fail_on(WHAT, problems, "disagreements between the answers and the database")
        print(f"ok: every 204 is gone and audited once, nothing else is gone; "
              f"the rolling restart through {args.balancer} lost no request")
    finally:
        if balancer:
            balancer.terminate()
            balancer.wait()
        for instance in instances:
            instance.kill()
        psql(admin, f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


if __name__ == "__main__":
    main()
