#!/usr/bin/env python3
"""Deletion events reach the receivers users run, each event exactly once.

On SQLite and on PostgreSQL, 16 clients delete 400 plants while `plantstore serve` delivers
to one receiver, a Python ThreadingHTTPServer, in each of these set-ups:
- slow: it takes 0.3 s per request and serves one request at a time per connection, as a
  synchronous app server does;
- closing: it closes its keep-alive connection after every 50th answer (with
  `Connection: close`, as servers with a request limit per connection do);
- haproxy: Debian's HAProxy in front of it, as a reverse proxy;
- forward-proxy: the service's HTTP_PROXY is HAProxy, and the endpoint's URL names a host
  that does not resolve (receiver.invalid): every event that arrives came through it;
- h2c: Debian's nginx in front of it speaking HTTP/2 on plain http, the endpoint added with
  `--http2`; nginx's log must show every request came in HTTP/2;
- https: nginx in front of it on https with HTTP/2 offered by ALPN, its certificate from a
  test CA the service trusts through SSL_CERT_FILE; every request must come in HTTP/2;
- rotation: `webhooks rotate-secret` while events flow; every request is verified by the
  reference library under the old secret, and every one sent after the service took up
  the new secret under the new one too.
Each event must arrive exactly once and the service's /metrics must count no failed
attempt; each request's signature is verified with the `standardwebhooks` package. Exits 1
on any failure.

Run from the repository root after `cargo test` (it uses target/debug/plantstore), with a
Python that has standardwebhooks, and haproxy, nginx and openssl on the PATH:
    PLANTSTORE_CI_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        target/webhook-venv/bin/python tests/deploy/receivers.py
"""

import argparse
import collections
import http.client
import http.server
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from standardwebhooks import Webhook, WebhookVerificationError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from toolkit.common import fail, free_port, get, wait_until  # noqa: E402
from toolkit.service import Service, cli, prepare_database  # noqa: E402
from fixtures import on_both_backends, psql_or_sqlite  # noqa: E402

WHAT = "receivers"
PLANTS = 400
CLIENTS = 16
# The service takes up a rotated secret within a second (it claims its leases each second).
FOLLOWS_WITHIN = 2.0


class Receiver(http.server.ThreadingHTTPServer):
    """Answers 204 after `delay` seconds, one request at a time per connection, and closes
    a connection after its `close_every`th answer; keeps each request's webhook-id, body,
    arrival time and the secrets (by index) the reference library verified it with."""

    daemon_threads = True
    # socketserver's default listen backlog is 5: a burst of new connections overflows it
    # and waits for SYN retransmits (1 s, then 3 s). App servers listen with 128 or more.
    request_queue_size = 128

    def __init__(self, delay=0.0, close_every=None):
        super().__init__(("127.0.0.1", 0), Handler)
        self.delay, self.close_every = delay, close_every
        self.secrets = []
        self.got = []  # (webhook-id, body, arrived, verified-by)
        self.connections = 0
        self.lock = threading.Lock()

    def handle_error(self, request, client_address):
        pass  # HAProxy resets the connections it is done with: expected here

    @property
    def port(self):
        return self.server_address[1]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.answered = 0
        with self.server.lock:
            self.server.connections += 1

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        server = self.server
        verified_by = []
        for index, secret in enumerate(list(server.secrets)):
            try:
                Webhook(secret).verify(body, dict(self.headers))
                verified_by.append(index)
            except WebhookVerificationError:
                pass
        with server.lock:
            server.got.append((self.headers.get("webhook-id"), body, time.monotonic(),
                               verified_by))
        time.sleep(server.delay)
        self.answered += 1
        self.send_response(204)
        if server.close_every and self.answered % server.close_every == 0:
            self.send_header("connection", "close")
            self.close_connection = True
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *_):
        pass


class HAProxy:
    """Debian's HAProxy on a free port, in HTTP mode with keep-alive, passing every request
    to one server."""

    def __init__(self, work, name, server_port):
        self.port = free_port()
        config = os.path.join(work, f"{name}-haproxy.cfg")
        with open(config, "w") as f:
            f.write(f"""global
    maxconn 1000
defaults
    mode http
    option http-keep-alive
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend in
    bind 127.0.0.1:{self.port}
    default_backend receiver
backend receiver
    server receiver 127.0.0.1:{server_port}
""")
        self.process = subprocess.Popen(["haproxy", "-db", "-f", config],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def stop(self):
        self.process.terminate()
        self.process.wait()


class Nginx:
    """Debian's nginx on a free port in front of one server: HTTP/2 on plain http (prior
    knowledge), or https with HTTP/2 and HTTP/1.1 offered by ALPN. Logs each request's
    protocol."""

    def __init__(self, work, name, server_port, tls):
        self.port = free_port()
        self.log = os.path.join(work, f"{name}-nginx-access.log")
        listen = f"127.0.0.1:{self.port} http2"
        certificates = ""
        if tls:
            listen = f"127.0.0.1:{self.port} ssl http2"
            self.ca = test_certificates(work, name)
            certificates = (f"ssl_certificate {work}/{name}-leaf.pem; "
                            f"ssl_certificate_key {work}/{name}-leaf.key;")
        temp = os.path.join(work, f"{name}-nginx-temp")
        os.makedirs(temp, exist_ok=True)
        config = os.path.join(work, f"{name}-nginx.conf")
        with open(config, "w") as f:
            f.write(f"""worker_processes 1;
pid {work}/{name}-nginx.pid;
error_log {work}/{name}-nginx-error.log;
events {{}}
http {{
    log_format protocol '$server_protocol $status';
    access_log {self.log} protocol;
    client_body_temp_path {temp}/body;
    proxy_temp_path {temp}/proxy;
    upstream receiver {{
        server 127.0.0.1:{server_port};
        keepalive 16;
    }}
    server {{
        listen {listen};
        {certificates}
        location / {{
            proxy_pass http://receiver;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
""")
        self.process = subprocess.Popen(["nginx", "-c", config, "-g", "daemon off;"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if not wait_until(lambda: port_open(self.port), 10):
            fail(WHAT, f"{name}: nginx did not start: {self.process.stderr.read()[:500]}")

    def protocols(self):
        with open(self.log) as f:
            return collections.Counter(line.split()[0] for line in f if line.strip())

    def stop(self):
        self.process.terminate()
        self.process.wait()


def test_certificates(work, name):
    """A test CA and a certificate it signs for localhost; the CA's file."""
    run = lambda *args: subprocess.run(args, check=True, capture_output=True)
    ca, leaf = os.path.join(work, f"{name}-ca"), os.path.join(work, f"{name}-leaf")
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-subj", "/CN=Plant Store test CA", "-keyout", f"{ca}.key", "-out", f"{ca}.pem")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
        "-keyout", f"{leaf}.key", "-out", f"{leaf}.csr")
    with open(f"{leaf}.ext", "w") as f:
        f.write("subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n"
                "extendedKeyUsage=serverAuth\n")
    run("openssl", "x509", "-req", "-in", f"{leaf}.csr", "-CA", f"{ca}.pem",
        "-CAkey", f"{ca}.key", "-CAcreateserial", "-days", "1", "-extfile", f"{leaf}.ext",
        "-out", f"{leaf}.pem")
    return f"{ca}.pem"


def port_open(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def delete_all(port, token, plants):
    """Deletes `plants` (a range) from 16 clients, each on one kept-alive connection; the
    statuses answered."""
    statuses = collections.Counter()
    lock = threading.Lock()

    def client(first):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for plant in plants[first::CLIENTS]:
            conn.request("DELETE", f"/plants/{plant}",
                         headers={"Authorization": f"Bearer {token}"})
            answer = conn.getresponse()
            answer.read()
            with lock:
                statuses[answer.status] += 1
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses


def failed_attempts(port):
    status, text = get(f"http://127.0.0.1:{port}/metrics")
    if status != 200:
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("plantstore_webhook_deliveries_total{")
               and 'result="failed"' in line)


def scenario(binary, url, work, label, setup):
    """One receiver set-up against a fresh database at `url`."""
    receiver = Receiver(delay=0.3 if setup == "slow" else 0.0,
                        close_every=50 if setup == "closing" else None)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    proxy, endpoint, add, settings = None, f"http://127.0.0.1:{receiver.port}/hooks", [], {}
    if setup in ("haproxy", "forward-proxy"):
        proxy = HAProxy(work, f"{label}-{setup}", receiver.port)
        endpoint = f"http://127.0.0.1:{proxy.port}/hooks"
    if setup == "forward-proxy":
        endpoint = "http://receiver.invalid/hooks"
        settings = {"HTTP_PROXY": f"http://127.0.0.1:{proxy.port}", "NO_PROXY": ""}
    if setup == "h2c":
        proxy = Nginx(work, f"{label}-{setup}", receiver.port, tls=False)
        endpoint, add = f"http://127.0.0.1:{proxy.port}/hooks", ["--http2"]
    if setup == "https":
        proxy = Nginx(work, f"{label}-{setup}", receiver.port, tls=True)
        endpoint = f"https://localhost:{proxy.port}/hooks"
        settings = {"SSL_CERT_FILE": proxy.ca}
    name = f"{label}-{setup}"
    token = prepare_database(binary, url, PLANTS)
    added = cli(binary, url, "webhooks", "add", endpoint, *add)
    endpoint_id = added.split()[3]
    receiver.secrets.append(added.split()[-1])
    port = free_port()
    instance = Service(name, binary, url, port, work, RUST_LOG="info",
                       PLANTSTORE_WEBHOOK_TIMEOUT="5s", **settings)
    if not instance.start():
        fail(WHAT, f"{name}: the service did not get ready")
    rotated_at = None
    try:
        if setup == "rotation":
            # Half the deletes, the rotation, then the other half once it is taken up.
            statuses = delete_all(port, token, range(1, PLANTS // 2 + 1))
            rotated = cli(binary, url, "webhooks", "rotate-secret", endpoint_id, "--overlap", "1h")
            receiver.secrets.append(rotated.split()[-1])
            rotated_at = time.monotonic()
            time.sleep(FOLLOWS_WITHIN)
            statuses += delete_all(port, token, range(PLANTS // 2 + 1, PLANTS + 1))
        else:
            statuses = delete_all(port, token, range(1, PLANTS + 1))
        if statuses != {204: PLANTS}:
            fail(WHAT, f"{name}: the deletes were answered {dict(statuses)}")
        logged = {int(x) for x in psql_or_sqlite(url, "SELECT id FROM plantstore_deletions")}
        wanted = {f"deletion_{i}" for i in logged}
        ids = lambda: {got[0] for got in list(receiver.got)}
        if not wait_until(lambda: wanted <= ids(), 60):
            missing = sorted(wanted - ids())
            fail(WHAT, f"{name}: {len(missing)} of {len(wanted)} events never arrived, "
                       f"such as {missing[:5]}")
        time.sleep(1)  # anything sent twice would be on its way by now
        failed = failed_attempts(port)
        protocols = proxy.protocols() if isinstance(proxy, Nginx) else None
    finally:
        instance.kill()
        receiver.shutdown()
        if proxy:
            proxy.stop()
    got = list(receiver.got)
    counts = collections.Counter(g[0] for g in got)
    repeats = sorted(i for i, n in counts.items() if n > 1)
    unverified = [g[0] for g in got if 0 not in g[3]]
    print(f"{name}: {PLANTS} deletes answered 204; {len(got)} requests for {len(wanted)} "
          f"events on {receiver.connections} connections; {len(repeats)} repeated; "
          f"{failed:.0f} failed attempts in /metrics")
    if len(wanted) != PLANTS:
        fail(WHAT, f"{name}: the log holds {len(wanted)} entries, not {PLANTS}")
    if set(counts) != wanted:
        fail(WHAT, f"{name}: events for no deletion log entry: {sorted(set(counts) - wanted)[:5]}")
    if repeats:
        fail(WHAT, f"{name}: {len(repeats)} events arrived more than once: {repeats[:5]}")
    if failed != 0:
        fail(WHAT, f"{name}: /metrics counts {failed} failed attempts")
    if protocols is not None:
        print(f"{name}: nginx logged {dict(protocols)}")
        if set(protocols) != {"HTTP/2.0"}:
            fail(WHAT, f"{name}: not every request came in HTTP/2: {dict(protocols)}")
    if unverified:
        fail(WHAT, f"{name}: {len(unverified)} requests the reference library refused "
                   f"under the first secret: {unverified[:5]}")
    if rotated_at is not None:
        after = [g for g in got if g[2] > rotated_at + FOLLOWS_WITHIN]
        not_new = [g[0] for g in after if 1 not in g[3]]
        print(f"{name}: {len(after)} requests after the rotation verified under the old and "
              f"the new secret")
        if not after:
            fail(WHAT, f"{name}: no request came after the rotation was taken up")
        if not_new:
            fail(WHAT, f"{name}: {len(not_new)} requests after the rotation did not verify "
                       f"under the new secret: {not_new[:5]}")


SETUPS = ["slow", "closing", "haproxy", "forward-proxy", "h2c", "https", "rotation"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", default="target/debug/plantstore")
    parser.add_argument("--only", choices=SETUPS)
    parser.add_argument("--work", help="keep the logs in this folder")
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    setups = [args.only] if args.only else SETUPS
    with tempfile.TemporaryDirectory() as temporary:
        work = args.work or temporary
        for setup in setups:
            on_both_backends(lambda url, label: scenario(binary, url, work, label, setup),
                             work, setup)
    print(f"ok: {len(setups) * 2} runs, every event exactly once, no failed attempt")


if __name__ == "__main__":
    main()
