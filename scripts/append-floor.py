#!/usr/bin/env python3
"""What one client's append could cost on this machine, beside what compactd's costs.

    cargo build --release && python3 scripts/append-floor.py [./target/release/compactd] [N] [full|normal]

Three ways of committing the same ~450 B message, one transaction each (SQLite WAL,
synchronous = FULL as the daemon and `compactd bench` do by default; `normal` takes the fsync
out of all three, which leaves the software path alone and measures it with a tenth of the
spread), in alternating rounds:

- in-process: the commit alone (what `compactd bench` calls raw SQLite);
- through a second process: a client hands the message over a Unix socket to a server
  process that does nothing but commit it and answer. No HTTP, no JSON, no schema: the floor
  of any daemon on this machine, since a client sleeping while the server fsyncs pays a
  cross-process wake-up that the in-process commit does not;
- compactd: the daemon given as the first argument, on a temp socket and database, the same
  message POSTed to a session over a keep-alive connection from a client with almost no cost
  of its own (a raw socket; `compactd bench`'s own client costs more, see its echo).

Prints p50 and rate for each and the ratios to the in-process commit.
"""
import json
import os
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

BINARY = sys.argv[1] if len(sys.argv) > 1 else "./target/release/compactd"
N = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
SYNCHRONOUS = sys.argv[3] if len(sys.argv) > 3 else "full"
if SYNCHRONOUS not in ("full", "normal"):
    sys.exit("the third argument is `full` or `normal`")
ROUNDS = 3


def message(i):
    return {"role": "user", "content": f"message {i}: " + "the agent reports progress on the task; " * 10}


def open_db(path):
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute(f"PRAGMA synchronous = {SYNCHRONOUS.upper()}")
    db.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, session TEXT, parts TEXT)")
    return db


def commit(db, body):
    db.execute("BEGIN")
    db.execute("INSERT INTO t (session, parts) VALUES ('a', ?)", (body,))
    db.execute("COMMIT")


def timed(step, n):
    """p50 (µs) and rate (per s) of `step(i)` over n calls."""
    each, start = [], time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        step(i)
        each.append(time.perf_counter() - t)
    return statistics.median(each) * 1e6, n / (time.perf_counter() - start)


def commit_server(sock, path):
    """The child: commits every message it receives and answers 200 bytes."""
    db = open_db(path)
    while True:
        body = sock.recv(65536)
        if not body:
            os._exit(0)
        commit(db, body.decode())
        sock.sendall(b"y" * 200)


class Http:
    """HTTP/1.1 over a Unix socket, keep-alive, nothing else."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.buf = b""

    def request(self, method, path, body=b""):
        head = f"{method} {path} HTTP/1.1\r\nHost: compactd\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        self.sock.sendall(head.encode() + body)
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end >= 0:
                lines = self.buf[:end].decode().split("\r\n")
                length = next((int(l.split(":", 1)[1]) for l in lines if l.lower().startswith("content-length:")), 0)
                if len(self.buf) >= end + 4 + length:
                    answer, self.buf = self.buf[end + 4:end + 4 + length], self.buf[end + 4 + length:]
                    status = int(lines[0].split(" ")[1])
                    if status >= 300:
                        sys.exit(f"compactd answered {status}: {answer.decode()}")
                    return answer
            self.buf += self.sock.recv(65536)


def main():
    work = tempfile.mkdtemp(prefix="append-floor-")
    daemon = None
    try:
        os.makedirs(f"{work}/config")
        with open(f"{work}/config/config.toml", "w") as config:
            config.write(f'[store]\nsynchronous = "{SYNCHRONOUS}"\n')
        daemon = subprocess.Popen(
            [BINARY, "--socket", f"{work}/compactd.sock", "serve", "--db", f"{work}/compactd.db",
             "--config", f"{work}/config/config.toml"],
            env=dict(os.environ, COMPACTD_LOG="error"))
        deadline = time.time() + 30
        while True:
            try:
                http = Http(f"{work}/compactd.sock")
                http.request("GET", "/health")
                break
            except OSError:
                if time.time() > deadline or daemon.poll() is not None:
                    sys.exit("compactd did not start")
                time.sleep(0.05)
        session = {"id": "floor", "context_limit": 100_000_000, "config": {"max_messages": 100_000_000}}
        http.request("POST", "/session", json.dumps(session).encode())

        client, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        child = os.fork()
        if child == 0:
            client.close()
            commit_server(server, f"{work}/server.db")
        server.close()
        db = open_db(f"{work}/in-process.db")

        def through_process(i):
            client.sendall(json.dumps([message(i)]).encode())
            client.recv(65536)

        def via_compactd(i):
            http.request("POST", "/session/floor/message", json.dumps(message(i)).encode())

        kinds = {
            "in-process": lambda i: commit(db, json.dumps([message(i)])),
            "through a second process": through_process,
            "compactd": via_compactd,
        }
        figures = {kind: [] for kind in kinds}
        for _ in range(ROUNDS):
            for kind, step in kinds.items():
                figures[kind].append(timed(step, N // ROUNDS))
        client.close()
        os.waitpid(child, 0)
        base = statistics.median(rate for _, rate in figures["in-process"])
        for kind, runs in figures.items():
            p50 = statistics.median(p for p, _ in runs)
            rate = statistics.median(r for _, r in runs)
            print(f"{kind:26} p50 {p50:6.0f} µs  {rate:6.0f}/s  {rate / base:.2f}x the in-process commit")
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
