"""The client's own rules, without a cluster: a fake node for the unknown-outcome rule, frames,
names, errors and the file cursor."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator, List, Tuple

import certifi
import pytest

import runnev
from runnev import Client, FileCursor, RetryPolicy
from runnev._core import encode_frames, segment
from runnev.errors import error_from_body

QUICK = RetryPolicy(request_timeout=2.0, backoff_min=0.01, backoff_max=0.05, give_up_after=2.0, unreachable_after=0.5)


class FakeNode:
    """Answers every request with ``503 no_leader``, with ``Runnev-Outcome: unknown`` when
    ``unknown``; counts the requests (path and query) it saw."""

    def __init__(self, unknown: bool) -> None:
        seen: List[str] = []
        self.seen = seen

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                seen.append(self.path)
                body = json.dumps({"error": {"code": "no_leader", "message": "no leader within 5 s"}}).encode()
                self.send_response(503)
                self.send_header("Retry-After", "1")
                if unknown:
                    self.send_header("Runnev-Outcome", "unknown")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_nodes() -> Iterator[Tuple[FakeNode, FakeNode]]:
    unknown, plain = FakeNode(unknown=True), FakeNode(unknown=False)
    yield unknown, plain
    unknown.close()
    plain.close()


def test_a_publish_without_seq_whose_outcome_is_unknown_is_not_retried(fake_nodes: Tuple[FakeNode, FakeNode]) -> None:
    unknown, plain = fake_nodes
    with Client([unknown.url, plain.url], policy=QUICK) as c:
        with pytest.raises(runnev.UnknownOutcome) as e:
            c.publish("s", b"x")
        assert "no leader" in str(e.value)
    assert unknown.seen == ["/v1/streams/s/batches"] and plain.seen == []


def test_the_async_client_keeps_the_same_rule(fake_nodes: Tuple[FakeNode, FakeNode]) -> None:
    unknown, plain = fake_nodes

    async def run() -> None:
        async with runnev.AsyncClient([unknown.url, plain.url], policy=QUICK) as c:
            with pytest.raises(runnev.UnknownOutcome):
                await c.publish("s", b"x")
            with pytest.raises(runnev.Unavailable):
                await c.publish("s", b"x", seq=3)

    asyncio.run(run())
    assert unknown.seen[0] == "/v1/streams/s/batches" and "/v1/streams/s/batches" not in plain.seen
    assert set(unknown.seen[1:] + plain.seen) == {"/v1/streams/s/batches?seq=3"} and len(plain.seen) >= 2


def test_a_publish_with_seq_whose_outcome_is_unknown_is_retried_with_the_same_seq(
    fake_nodes: Tuple[FakeNode, FakeNode],
) -> None:
    unknown, plain = fake_nodes
    with Client([unknown.url, plain.url], policy=QUICK) as c:
        with pytest.raises(runnev.Unavailable):
            c.publish("s", b"x", seq=7)
    assert len(unknown.seen) >= 2 and len(plain.seen) >= 2
    assert set(unknown.seen + plain.seen) == {"/v1/streams/s/batches?seq=7"}


def test_a_503_before_any_proposal_is_retried_even_without_seq(fake_nodes: Tuple[FakeNode, FakeNode]) -> None:
    _, plain = fake_nodes
    with Client([plain.url], policy=QUICK) as c:
        with pytest.raises(runnev.Unavailable) as e:
            c.publish("s", b"x")
    assert len(plain.seen) >= 2
    assert "no leader: a majority of nodes is down or partitioned" in str(e.value) and "{" not in str(e.value)


def test_no_node_listening_is_unreachable_fast() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client([f"127.0.0.1:{port}"], policy=QUICK) as c:
        with pytest.raises(runnev.Unreachable):
            c.publish("s", b"x")


def test_frames_are_length_prefixed_big_endian() -> None:
    assert encode_frames([b"hello", b"", b"abc"]) == b"\x00\x00\x00\x05hello\x00\x00\x00\x00\x00\x00\x00\x03abc"
    with pytest.raises(runnev.ConfigError):
        encode_frames([])
    with pytest.raises(runnev.ConfigError):
        encode_frames([b""] * 10_001)


def test_names_seqs_and_node_lists_are_checked_before_sending() -> None:
    assert segment("a.b_c-1") == "a.b_c-1"
    for bad in ["", ".", "..", "a b", "a/b", "x" * 129, "é"]:
        with pytest.raises(runnev.InvalidStreamName):
            segment(bad)
    c = Client("127.0.0.1:7001, http://h:2/")
    assert c.nodes == ["http://127.0.0.1:7001", "http://h:2"]
    for bad_seq in [0, -1, 2**64 - 1]:
        with pytest.raises(runnev.ConfigError):
            c.publish("s", b"x", seq=bad_seq)
    c.close()
    for bad_node in ["h", "http://h:1/x", "", "ftp://h:1"]:
        with pytest.raises(runnev.ConfigError):
            Client([bad_node])


def test_error_bodies_map_to_typed_errors() -> None:
    e = error_from_body("n", 409, b'{"error": {"code": "partial_duplicate", "message": "m", "frame": 2}}')
    assert isinstance(e, runnev.PartialDuplicate) and e.frame == 2 and e.status == 409
    e = error_from_body("n", 418, b'{"error": {"code": "something_new", "message": "m"}}')
    assert type(e) is runnev.ApiError and e.code == "something_new"
    assert isinstance(error_from_body("n", 400, b"bare"), runnev.ProtocolError)


def test_file_cursor_saves_atomically_and_loads_back(tmp_path: Path) -> None:
    c = FileCursor(tmp_path / "cursor")
    assert c.load() == 0
    c.save(42)
    assert c.load() == 42
    c.save(43)
    assert c.load() == 43
    assert (tmp_path / "cursor").read_text() == "43\n"
    assert not (tmp_path / "cursor.tmp").exists()
    (tmp_path / "cursor").write_text("-1\n")
    assert c.load() == 0
    (tmp_path / "cursor").write_text("garbage")
    with pytest.raises(ValueError):
        c.load()


def test_payloads_must_be_bytes_and_cursors_whole_numbers() -> None:
    """A payload of another type is refused before anything is sent (``bytes(5)`` was stored
    as five zero bytes), and so is a subscription cursor below -1 (it started from 0)."""
    with Client("127.0.0.1:1", policy=QUICK) as c:
        for bad in [5, True, [104, 105], "hello", None, {"a": 1}]:
            with pytest.raises(runnev.ConfigError):
                c.publish("s", bad)  # type: ignore[arg-type]
        with pytest.raises(runnev.ConfigError, match="encode it first"):
            c.publish("s", "hello")  # type: ignore[arg-type]
        with pytest.raises(runnev.ConfigError, match="list of payloads"):
            c.publish_many("s", b"abc")  # type: ignore[arg-type]
        with pytest.raises(runnev.ConfigError, match="batch 1"):
            c.publish_many("s", [b"a", 5])  # type: ignore[list-item]
        for bad_cursor in [-5, 2**64, 1.0, "3"]:
            with pytest.raises(runnev.ConfigError):
                c.subscribe("s", after=bad_cursor)  # type: ignore[arg-type]
        assert c.subscribe("s", after=-1).cursor == 0
    assert encode_frames([bytearray(b"ab"), memoryview(b"c")]) == b"\x00\x00\x00\x02ab\x00\x00\x00\x01c"


def test_a_token_needs_tls_and_a_plain_node_spoken_tls_to_is_a_tls_error() -> None:
    """A token is refused with a plain-HTTP node (it would travel in clear); a client with a CA
    file against a node that serves plain HTTP raises ``TlsError`` after one try of each node."""
    with pytest.raises(runnev.ConfigError, match="only over TLS"):
        Client("127.0.0.1:1", token="rnv_admin_" + "0" * 64)
    node = FakeNode(unknown=False)
    try:
        with Client(node.url.removeprefix("http://"), ca_file=certifi.where(), policy=QUICK) as c:
            assert c.nodes == [node.url.replace("http://", "https://")]
            with pytest.raises(runnev.TlsError, match="plain HTTP"):
                c.publish("s", b"x", seq=1)
    finally:
        node.close()
