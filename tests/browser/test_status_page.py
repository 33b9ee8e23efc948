"""The status page (`GET /` of every node, src/api/status.html) in a real headless browser.

Debian's chromium (/usr/bin/chromium), driven by Playwright for Python, opens the page of a real
three-node cluster of the debug binary (target/debug/runnev, or RUNNEV_BIN) on free loopback
ports, and checks what a person would see: the leader and the members, a stream's last seq once
batches are published, after the leader is killed with SIGKILL, a new leader and the dead node
marked unreachable within FAILOVER_BOUND_S, and, once its own node is killed too, that it says
so. With `--auth` (`runnev local --secure`) the page asks for a token, says why on 401 and 403,
and shows the cluster with a read token kept in sessionStorage only. Every request the page makes must go to the node that served it.

Screenshots (PNG) and the nodes' logs go to RUNNEV_BROWSER_LOGS (else a new temporary
directory); the path is printed. Run with scripts/test, or by hand:
    python -m venv V && V/bin/pip install -r tests/browser/requirements.txt
    cargo build && V/bin/pytest -s tests/browser
"""

import json
import os
import re
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("RUNNEV_BIN", REPO / "target" / "debug" / "runnev"))
CHROMIUM = os.environ.get("RUNNEV_CHROMIUM", "/usr/bin/chromium")
# How long the page may take to show a new leader after the old one is killed, in s: an election
# takes well under a second here; the page polls every second and asks each member within 0.8 s.
FAILOVER_BOUND_S = 15
FORM_TIMEOUT_S = 60
VIEWPORT = {"width": 1440, "height": 640}


# ---- helpers ----------------------------------------------------------------------------------

def free_ports(n):
    """n distinct free TCP ports on 127.0.0.1 (held until all are picked)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_base(n):
    """A port p with p..p+n-1 free on 127.0.0.1 (for `runnev local --base-port`)."""
    for _ in range(200):
        base = free_ports(1)[0]
        if base + n > 65535:
            continue
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports found")


def request(method, url, token=None, body=None, ctx=None, timeout=5):
    """(status, parsed JSON or text) of one request; (None, why) when no HTTP answer came."""
    req = urllib.request.Request(url, method=method, data=body)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if body is not None:
        req.add_header("Content-Type", "application/json" if body[:1] == b"{" else "application/octet-stream")
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    except (OSError, urllib.error.URLError) as e:
        return None, str(e)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def wait_until(what, timeout_s, f, every_s=0.2):
    """f() until it returns something truthy; fails naming `what` and f's last value."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = f()
        if last:
            return last
        time.sleep(every_s)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}; last: {last!r}")


def agreed_leader(urls, token=None, ctx=None):
    """The leader every node in `urls` names at one term, or None."""
    seen = set()
    for u in urls:
        status, v = request("GET", f"{u}/v1/cluster", token=token, ctx=ctx)
        if status != 200 or v.get("leader_id") is None:
            return None
        seen.add((v["leader_id"], v["term"]))
    return next(iter(seen))[0] if len(seen) == 1 else None


def stop(proc, timeout_s=15):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def open_page(browser, url, **context_args):
    """A page on `url` that records every request not sent to `url`'s own origin (and aborts it)
    and every script error."""
    context = browser.new_context(viewport=VIEWPORT, **context_args)
    page = context.new_page()
    page.foreign_requests = []
    page.script_errors = []
    origin = url.rstrip("/")

    def route(r):
        if r.request.url.startswith(origin + "/"):
            r.continue_()
        else:
            page.foreign_requests.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    page.on("pageerror", lambda e: page.script_errors.append(str(e)))
    page.goto(url + "/")
    return page


def shot(page, logs, name):
    path = logs / name
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


# ---- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def logs():
    d = Path(os.environ.get("RUNNEV_BROWSER_LOGS") or tempfile.mkdtemp(prefix="runnev-browser-logs-"))
    d.mkdir(parents=True, exist_ok=True)
    print(f"\nbrowser test logs (screenshots, node logs): {d}")
    return d


@pytest.fixture(scope="session")
def browser():
    assert BIN.exists(), f"{BIN} is missing: build it first (cargo build)"
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install chromium"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        yield b
        b.close()


@pytest.fixture
def workdir():
    d = Path(tempfile.mkdtemp(prefix="runnev-browser-"))
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)


class Cluster:
    """Three `runnev serve` processes on free loopback ports, logging into `logs`."""

    def __init__(self, root, logs, n=3):
        self.ports = dict(zip(range(1, n + 1), free_ports(n)))
        peers = ",".join(f"{i}=127.0.0.1:{p}" for i, p in self.ports.items())
        self.procs = {}
        for i, port in self.ports.items():
            log = open(logs / f"failover-node-{i}.log", "wb")
            self.procs[i] = subprocess.Popen(
                [str(BIN), "serve", "--id", str(i), "--data-dir", str(root / f"node-{i}"),
                 "--listen", f"127.0.0.1:{port}", "--peers", peers],
                stdout=log, stderr=subprocess.STDOUT,
            )

    def url(self, i):
        return f"http://127.0.0.1:{self.ports[i]}"

    def urls(self, ids=None):
        return [self.url(i) for i in (ids or self.ports)]

    def kill9(self, i):
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait()

    def stop(self):
        for p in self.procs.values():
            stop(p)


# ---- the tests --------------------------------------------------------------------------------

def test_the_page_follows_publishes_and_a_failover(browser, logs, workdir):
    c = Cluster(workdir, logs)
    try:
        leader = wait_until("the cluster to form with one leader", FORM_TIMEOUT_S, lambda: agreed_leader(c.urls()))
        viewer = next(i for i in c.ports if i != leader)
        page = open_page(browser, c.url(viewer))

        # The leader and the members, each reachable, each with its own term and indexes.
        expect(page.locator("#leader")).to_have_attribute("data-leader", str(leader), timeout=10_000)
        expect(page.locator("#served-by")).to_have_text(str(viewer))
        rows = page.locator("#nodes tbody tr")
        expect(rows).to_have_count(3)
        for i in c.ports:
            row = page.locator(f'#nodes tr[data-node="{i}"]')
            expect(row).to_have_attribute("data-reachable", "true")
            expect(row).to_contain_text(f"127.0.0.1:{c.ports[i]}")
        expect(page.locator(f'#nodes tr[data-node="{leader}"]')).to_have_attribute("data-role", "Leader")

        # Batches published: the stream's last seq, evicted-through and retention appear.
        status, body = request("PUT", f"{c.url(leader)}/v1/streams/orders",
                               body=b'{"retention": {"max_batches": 3}}')
        assert status == 201, body
        for i in range(5):
            status, body = request("POST", f"{c.url(leader)}/v1/streams/orders/batches",
                                   body=f"order {i}".encode())
            assert status == 201, body
        stream = page.locator('#streams tr[data-stream="orders"]')
        expect(stream.locator(".last-seq")).to_have_text("5", timeout=10_000)
        expect(stream.locator(".evicted-through")).to_have_text("2")
        expect(stream.locator(".batches")).to_have_text("3")
        expect(stream.locator(".retention")).to_have_text("max 3 batches")
        # The followers caught up, in the leader's view.
        for i in c.ports:
            expect(page.locator(f'#nodes tr[data-node="{i}"] td.lag')).to_have_text("0", timeout=10_000)
        shot(page, logs, "status-page-before-failover.png")

        # The leader killed: a new leader and the dead node marked unreachable, within the bound.
        c.kill9(leader)
        killed = time.monotonic()
        page.wait_for_function(
            """(old) => {
                 const l = document.getElementById('leader').dataset.leader;
                 const row = document.querySelector(`#nodes tr[data-node="${old}"]`);
                 return l && l !== old && row && row.dataset.reachable === 'false';
               }""",
            arg=str(leader), timeout=FAILOVER_BOUND_S * 1000,
        )
        print(f"the page showed a new leader and node {leader} unreachable "
              f"{time.monotonic() - killed:.1f} s after SIGKILL (bound {FAILOVER_BOUND_S} s)")
        survivors = [i for i in c.ports if i != leader]
        new = wait_until("the survivors to agree on a new leader", FAILOVER_BOUND_S,
                         lambda: agreed_leader(c.urls(survivors)))
        assert new != leader
        expect(page.locator("#leader")).to_have_attribute("data-leader", str(new))
        expect(page.locator(f'#nodes tr[data-node="{leader}"]')).to_contain_text("unreachable")
        expect(page.locator(f'#nodes tr[data-node="{new}"]')).to_have_attribute("data-role", "Leader")
        expect(page.locator("#reachable")).to_have_text("2 of 3")
        shot(page, logs, "status-page-after-failover.png")

        # The page's own node killed: it says so and marks what it shows as stale.
        c.kill9(viewer)
        expect(page.locator("#message")).to_contain_text("This node does not answer", timeout=10_000)
        expect(page.locator("#updated")).to_have_class(re.compile(r"\bstale\b"), timeout=10_000)

        assert page.foreign_requests == [], f"the page asked other places: {page.foreign_requests}"
        assert page.script_errors == [], f"script errors: {page.script_errors}"
        page.context.close()
    finally:
        c.stop()


def test_with_auth_the_page_asks_for_a_read_token(browser, logs, workdir):
    base = free_base(3)
    local_log = open(logs / "auth-runnev-local.log", "wb")
    proc = subprocess.Popen(
        [str(BIN), "local", "--dir", str(workdir), "--base-port", str(base), "--secure"],
        stdout=local_log, stderr=subprocess.STDOUT,
    )
    try:
        ca = workdir / "ca.pem"
        wait_until("runnev local --secure to write its CA", FORM_TIMEOUT_S, ca.exists)
        ctx = ssl.create_default_context(cafile=str(ca))
        urls = [f"https://127.0.0.1:{base + k}" for k in range(3)]
        admin = wait_until("the admin token", FORM_TIMEOUT_S,
                           lambda: (workdir / "admin.token").exists() and (workdir / "admin.token").read_text().strip())
        wait_until("the cluster to form with one leader", FORM_TIMEOUT_S, lambda: agreed_leader(urls, admin, ctx))

        def token(name, grant):
            status, body = request("POST", f"{urls[0]}/v1/auth/tokens", token=admin, ctx=ctx,
                                   body=json.dumps({"name": name, "grants": [grant]}).encode())
            assert status == 201, body
            return body["token"]

        reader = token("viewer", {"permission": "read", "streams": "*"})
        writer = token("writer", {"permission": "publish", "streams": "orders.*"})
        page_url = urls[1]
        for t in (reader, writer):
            wait_until("the page's node to apply the tokens", FORM_TIMEOUT_S,
                       lambda t=t: request("GET", f"{page_url}/v1/streams", token=t, ctx=ctx)[0] in (200, 403))

        # The node's certificate is from the throwaway CA, which the browser does not know.
        page = open_page(browser, page_url, ignore_https_errors=True)
        message = page.locator("#message")
        expect(message).to_contain_text("requires a token", timeout=10_000)
        expect(page.locator("#token-form")).to_be_visible()
        expect(page.locator("#nodes tbody tr")).to_have_count(0)
        shot(page, logs, "status-page-auth-asks-for-a-token.png")

        page.fill("#token-input", writer)
        page.click("#token-form button[type=submit]")
        expect(message).to_contain_text("403", timeout=10_000)
        expect(message).to_contain_text("read grant")

        page.fill("#token-input", writer[:-1] + ("0" if writer[-1] != "0" else "1"))
        page.click("#token-form button[type=submit]")
        expect(message).to_contain_text("refused (401)", timeout=10_000)

        page.fill("#token-input", reader)
        page.click("#token-form button[type=submit]")
        expect(message).to_be_hidden(timeout=10_000)
        expect(page.locator("#nodes tbody tr")).to_have_count(3)
        for k in range(3):
            expect(page.locator(f'#nodes tr[data-node="{k + 1}"]')).to_have_attribute("data-reachable", "true")
        assert page.locator("#leader").get_attribute("data-leader") in ("1", "2", "3")
        assert page.evaluate("sessionStorage.getItem('runnev.token')") == reader
        assert "rnv_" not in page.url
        shot(page, logs, "status-page-auth-with-a-read-token.png")

        # Forgetting the token asks for one again.
        page.click("#token-forget")
        expect(message).to_contain_text("requires a token", timeout=10_000)
        assert page.evaluate("sessionStorage.getItem('runnev.token')") is None

        assert page.foreign_requests == [], f"the page asked other places: {page.foreign_requests}"
        assert page.script_errors == [], f"script errors: {page.script_errors}"
        page.context.close()
    finally:
        stop(proc, 30)
