"""Real ``runnev`` processes for the tests: a three-node cluster of ``runnev serve`` on free
loopback ports, a secure one through ``runnev local --secure``, and a TCP proxy that loses
answers. The binary is ``$RUNNEV_BIN``, else the repository's ``target/debug/runnev``."""

from __future__ import annotations

import os
import random
import signal
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import httpx

REPO = Path(__file__).resolve().parents[3]


def runnev_bin() -> str:
    path = os.environ.get("RUNNEV_BIN") or str(REPO / "target" / "debug" / "runnev")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"no runnev binary at {path}: build it (cargo build) or set RUNNEV_BIN")
    return path


def free_base(n: int) -> int:
    """A port with it and the next ``n - 1`` free on loopback now, below the range the kernel
    gives outgoing connections their ports from (32768-60999 by default), where another
    connection cannot take a node's port between this pick and the node's bind."""
    low = 32_768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    while True:
        base = random.randrange(10_000, max(low - n, 10_001))
        socks = []
        try:
            for i in range(n):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()


def wait_until(what: str, cond, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        try:
            v = cond()
            if v:
                return v
        except (httpx.HTTPError, OSError, ValueError, KeyError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(0.1)


def eventually(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether ``cond`` holds within ``timeout`` seconds (a node's applied view catches up)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class Cluster:
    """Nodes 1..n of ``runnev serve`` under ``root``; ``urls`` are their base URLs."""

    def __init__(self, root: Path, n: int = 3, extra: Optional[List[str]] = None) -> None:
        self.root = root
        base = free_base(n)
        self.ports = {i: base + i - 1 for i in range(1, n + 1)}
        peers = ",".join(f"{i}=127.0.0.1:{p}" for i, p in self.ports.items())
        self.procs: Dict[int, subprocess.Popen[bytes]] = {}
        for i, port in self.ports.items():
            log = open(root / f"node-{i}.log", "wb")
            cmd = [runnev_bin(), "serve", "--id", str(i), "--data-dir", str(root / f"node-{i}"),
                   "--listen", f"127.0.0.1:{port}", "--peers", peers, *(extra or [])]
            self.procs[i] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            log.close()
        try:
            self.wait_ready(list(self.ports))
        except BaseException:
            self.stop()
            raise

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    @property
    def urls(self) -> List[str]:
        return [self.url(i) for i in self.ports]

    def wait_ready(self, ids: List[int]) -> None:
        for i in ids:
            wait_until(f"node {i} ready", lambda: httpx.get(self.url(i) + "/readyz", timeout=2).status_code == 200)

    def leader(self, among: Optional[List[int]] = None) -> int:
        """The leader's id, as every live node in ``among`` agrees."""
        ids = among or [i for i, p in self.procs.items() if p.poll() is None]

        def agreed() -> Optional[int]:
            seen = {httpx.get(self.url(i) + "/v1/cluster", timeout=2).json()["leader_id"] for i in ids}
            return seen.pop() if len(seen) == 1 and None not in seen else None

        return int(wait_until("a leader all nodes agree on", agreed))

    def kill(self, i: int) -> None:
        """SIGKILL: the node stops at once, mid-request."""
        self.procs[i].kill()
        self.procs[i].wait()

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class SecureCluster:
    """``runnev local --secure --dir root``: TLS with ``ca.pem`` and ``--auth`` with the admin
    token in ``admin.token``."""

    def __init__(self, root: Path, n: int = 3) -> None:
        base = free_base(n)
        self.urls = [f"https://127.0.0.1:{base + i}" for i in range(n)]
        self.log = open(root / "local.log", "wb")
        self.proc = subprocess.Popen(
            [runnev_bin(), "local", "--secure", "--dir", str(root), "--base-port", str(base), "--nodes", str(n)],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        self.ca = str(root / "ca.pem")
        self.token_file = root / "admin.token"
        try:
            wait_until("the CA and token files", lambda: self.token_file.exists() and Path(self.ca).exists())
            self.token = self.token_file.read_text().strip()
            ctx = ssl.create_default_context(cafile=self.ca)
            auth = {"Authorization": f"Bearer {self.token}"}
            for u in self.urls:
                wait_until(f"{u} ready", lambda: httpx.get(u + "/readyz", verify=ctx, timeout=2).status_code == 200)
                # The admin token works on a node once it has applied its creation.
                wait_until(
                    f"{u} knows the admin token",
                    lambda: httpx.get(u + "/v1/streams", headers=auth, verify=ctx, timeout=2).status_code == 200,
                )
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class LossyProxy:
    """A loopback TCP proxy to ``upstream`` (``HOST:PORT``) that loses every answer: it reads a
    whole request (headers and ``Content-Length`` body), sends it on, waits for the answer to
    begin (the request was processed), then closes both connections."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._lose, args=(conn,), daemon=True).start()

    def _lose(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, body = data.split(b"\r\n\r\n", 1)
            length = 0
            for line in head.split(b"\r\n")[1:]:
                k, _, v = line.partition(b":")
                if k.strip().lower() == b"content-length":
                    length = int(v.strip())
            while len(body) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                body += chunk
            with socket.create_connection(self.upstream) as up:
                up.sendall(head + b"\r\n\r\n" + body)
                up.recv(1)
            self.requests += 1

    def close(self) -> None:
        self.sock.close()
