"""Load: wrk runs against a port, what they got that was not expected, nginx as the HTTP ceiling;
the service under wrk, and its log trimmed after."""

from __future__ import annotations

import collections
import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from toolkit.common import free_port
from toolkit.processes import PROCS, run
from toolkit.service import wait_ready

from . import cpu
from .builds import Build
from .common import BENCH, CONNS, EXPECT, LUA_MODE, NOAUTH_FIRST, fmt, fmt_rate, log

LUA = BENCH / "wrk.lua"


def run_wrk(port: int, mode: str, conns: int, first: int, end: int, seconds: int, token: str,
            out: Path) -> dict:
    threads = 1 if conns == 1 else 2
    cmd = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{seconds}s", "--latency", "--timeout", "10s",
           "-s", LUA, f"http://127.0.0.1:{port}", "--", mode, first, end, threads]
    env = dict(os.environ, BENCH_TOKEN=token)
    res = run(cmd, timeout=seconds + 120, env=env)
    out.write_text(res.stdout + res.stderr)
    line = next((l for l in res.stdout.splitlines() if l.startswith("BENCH_JSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no BENCH_JSON line (see {out})")
    data = json.loads(line[len("BENCH_JSON "):])
    data["threads_n"] = threads
    data["connections"] = conns
    data["generated"] = sum(t["generated"] for t in data["threads"])
    data["exhausted"] = sum(t["exhausted"] for t in data["threads"])
    return data


def service_under_wrk(plantstore: Build, url: str, work: Path, workload: str, conns: int, lo: int,
                      hi: int, seconds: int, token: str, tag: str, keep: bool) -> dict:
    """A fresh service process (so its peak RSS is this run's) under wrk: what wrk measured,
    the service's CPU shares, its peak RSS, how it exited and the answers not expected.
    Its log is `service-TAG.log` in `work` (trimmed unless `keep`), wrk's `wrk-TAG.out`."""
    service = plantstore.start(f"service-{tag}", url, 120)
    cpu_before = cpu.snapshot(service.process.pid)
    d = run_wrk(service.port, LUA_MODE[workload], conns, lo, hi, seconds, token,
                work / f"wrk-{tag}.out")
    d["cpu"] = cpu.shares(cpu_before, cpu.snapshot(service.process.pid))
    d["peak_rss_mib"] = service.peak_rss_mib()
    d["exit_code"], _ = service.stop()
    d["unexpected"] = unexpected(d, EXPECT[workload])
    d["log_lines"] = trim_log(service.log) if not keep else None
    d["service_log"] = service.log.name
    return d


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


def unexpected(data: dict, expect: str) -> dict:
    """Statuses other than the expected one, plus socket errors and timeouts."""
    odd = {code: n for code, n in data["statuses"].items() if code != expect and n}
    for kind in ("connect", "read", "write", "timeout"):
        if data["errors"].get(kind):
            odd[kind] = data["errors"][kind]
    if data.get("exhausted"):
        odd["ids exhausted"] = data["exhausted"]
    return odd


def fmt_unexpected(odd: dict) -> str:
    return "none" if not odd else ", ".join(f"{k}: {v}" for k, v in odd.items())


NGINX_CONF = """# bench/run: nginx answering every request with 204 on loopback.
worker_processes auto;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log;
events {{ worker_connections 4096; }}
http {{
    {access_log}
    # One connection serves the whole run, as the service's keep-alive does (nginx would
    # otherwise close it every 1,000 requests).
    keepalive_requests 100000000;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    server {{
        listen 127.0.0.1:{port}{tls};
        location / {{ return 204; }}
    }}
}}
"""


def nginx_binary() -> str:
    path = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if not path:
        raise RuntimeError("nginx not found")
    return path


def start_nginx(ndir: Path, access_log: str = "access_log off;", tls: bool = False):
    """nginx `return 204` in the foreground on a free port, its files in `ndir`; the process
    and the port. `tls`: https with HTTP/2 offered by ALPN, its certificate signed by a test
    CA whose file is `ndir / "ca.pem"` (a client trusts it through SSL_CERT_FILE)."""
    ndir.mkdir()
    nport = free_port()
    listen = ""
    if tls:
        test_certificates(ndir)
        listen = (f" ssl http2; ssl_certificate {ndir}/leaf.pem; "
                  f"ssl_certificate_key {ndir}/leaf.key")
    (ndir / "nginx.conf").write_text(NGINX_CONF.format(dir=ndir, port=nport, tls=listen,
                                                       access_log=access_log))
    with open(ndir / "stderr.log", "wb") as nerr:
        nginx = PROCS.start([nginx_binary(), "-p", ndir, "-e", ndir / "error.log", "-c",
                             ndir / "nginx.conf"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=nerr)
    if tls:
        wait_listening(nginx, nport, 30)
    else:
        wait_ready(nginx, nport, "/", 204, ndir / "error.log", 30)
    return nginx, nport


def test_certificates(ndir: Path) -> None:
    """A test CA (ca.pem) and a certificate it signs for localhost (leaf.pem, leaf.key)."""
    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=ndir)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=bench CA", "-keyout", "ca.key", "-out", "ca.pem")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
            "-keyout", "leaf.key", "-out", "leaf.csr")
    (ndir / "leaf.ext").write_text("subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n"
                                   "extendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "1", "-extfile", "leaf.ext", "-out", "leaf.pem")


def wait_listening(proc: subprocess.Popen, port: int, timeout: float) -> None:
    end = time.perf_counter() + timeout
    while time.perf_counter() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.01)
    raise RuntimeError(f"{proc.args[0]}: nothing listens on {port} after {timeout:.0f} s")


def nginx_anchor(work: Path, seconds: int) -> dict:
    """nginx's `return 204` under the same wrk requests as the 401s, at each connection count."""
    nginx, nport = start_nginx(work / "nginx")
    runs = {}
    for conns in CONNS:
        d = run_wrk(nport, "noauth", conns, NOAUTH_FIRST, 0, seconds, "",
                    work / f"wrk-nginx-{conns}.out")
        d["unexpected"] = unexpected(d, EXPECT["nginx"])
        runs[str(conns)] = d
        log(f"nginx      c={conns:<3} {fmt_rate(d['rps']):>9} req/s  p50 {fmt(d['p50_ms'], 3)} ms  "
            f"p99 {fmt(d['p99_ms'], 3)} ms  unexpected: {fmt_unexpected(d['unexpected'])}")
    PROCS.stop(nginx)
    return runs
