"""What the sync and the asyncio clients share: the node list, the retry rules, request shapes,
and a subscription's resume state. No I/O happens here; each client runs these decisions over
its own transport.

Owns: which answers mean "try another node", when a call gives up, and which failures of a
publish without seq end it with ``UnknownOutcome`` (the rules of the Rust client,
src/client/mod.rs). Must never: retry a publish without seq whose outcome is unknown, change a
publish's seq between attempts, or hand a subscriber a seq at or below its cursor twice.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import ssl
import struct
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Union
from urllib.parse import quote

import httpx

from .errors import (
    ConfigError,
    InvalidStreamName,
    ProtocolError,
    TlsError,
    Unavailable,
    UnknownOutcome,
    Unreachable,
    error_from_body,
    unavailable_text,
)
from .models import Batch, Gap, Retention, decode

log = logging.getLogger("runnev")

#: Content type of a many-batches publish (docs/http-api.md).
FRAMES_CONTENT_TYPE = "application/vnd.runnev.frames"
#: Most frames in one frames publish.
FRAMES_MAX = 10_000
#: The largest seq a publisher may ask for, 2**64 - 2.
SEQ_MAX = 2**64 - 2
#: Header that marks a ``503`` whose write may still commit.
OUTCOME_HEADER = "runnev-outcome"
#: Header naming the leader's ``HOST:PORT``.
LEADER_HEADER = "runnev-leader"
#: A subscription that hears nothing (not even the 10 s ``: ping``) for this long, in seconds,
#: takes its node for lost and resumes on the next one.
SUBSCRIPTION_IDLE = 30.0

_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")


@dataclass(frozen=True)
class RetryPolicy:
    """How a client retries; every field is in seconds.

    ``request_timeout`` bounds one HTTP exchange (a long poll adds its ``wait_ms``); backoff
    starts at ``backoff_min`` and doubles up to ``backoff_max``; a call gives up after
    ``give_up_after`` (``Unavailable``), or after ``unreachable_after`` when every attempt was a
    refused connection (``Unreachable``; at least one round over every node is made). The
    defaults are the Rust client's (src/limits.rs)."""

    request_timeout: float = 10.0
    backoff_min: float = 0.05
    backoff_max: float = 2.0
    give_up_after: float = 30.0
    unreachable_after: float = 1.0


class Backoff:
    """``min``, doubling, capped at ``max``, without jitter; ``reset`` after a success."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._min, self._max = policy.backoff_min, policy.backoff_max
        self._next = self._min

    def next_delay(self) -> float:
        d = self._next
        self._next = min(self._next * 2, self._max)
        return d

    def reset(self) -> None:
        self._next = self._min


def segment(stream: str) -> str:
    """``stream`` checked with the server's rule (1 to 128 of ``A-Z a-z 0-9 . _ -``, not ``.``
    or ``..``) and percent-encoded as a path segment; ``InvalidStreamName`` before anything is
    sent otherwise."""
    if not _NAME.fullmatch(stream) or stream in (".", ".."):
        raise InvalidStreamName(
            400,
            "invalid_stream_name",
            f"{stream!r} is not a stream name: 1 to 128 of A-Z a-z 0-9 . _ -, and not . or ..",
        )
    return quote(stream, safe="")


def check_seq(seq: Optional[int]) -> None:
    """``ConfigError`` for a seq outside 1 to 2**64-2 (nothing is sent)."""
    if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= SEQ_MAX):
        raise ConfigError(f"seq {seq!r} is not an integer from 1 to {SEQ_MAX}")


def batches_path(stream: str, seq: Optional[int]) -> str:
    check_seq(seq)
    path = f"/v1/streams/{segment(stream)}/batches"
    return path if seq is None else f"{path}?seq={seq}"


#: What a payload may be given as; it is sent byte for byte.
Payload = Union[bytes, bytearray, memoryview]


def payload_bytes(payload: object, what: str = "the payload") -> bytes:
    """``payload`` as bytes when it is ``bytes``, ``bytearray`` or ``memoryview``; ``ConfigError``
    otherwise (nothing is sent). ``bytes(5)`` would be five zero bytes and ``bytes([104, 105])``
    b"hi": a payload is never guessed from another type."""
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, (bytearray, memoryview)):
        return bytes(payload)
    hint = " (encode it first, e.g. .encode())" if isinstance(payload, str) else ""
    raise ConfigError(f"{what} must be bytes, bytearray or memoryview, not {type(payload).__name__}{hint}")


def encode_frames(payloads: Sequence[Payload]) -> bytes:
    """The body of a frames publish: per payload a 4-byte big-endian length, then its bytes.
    ``ConfigError`` for a payload that is not a list of bytes-like payloads, no payload, more than
    10,000, or one of 2**32 bytes or more."""
    if isinstance(payloads, (bytes, bytearray, memoryview, str)) or not isinstance(payloads, Sequence):
        raise ConfigError(
            f"publish_many takes a list of payloads (each bytes, bytearray or memoryview), not {type(payloads).__name__}"
        )
    if not 1 <= len(payloads) <= FRAMES_MAX:
        raise ConfigError(f"a frames publish carries 1 to {FRAMES_MAX} batches, not {len(payloads)}")
    parts: List[bytes] = []
    for i, p in enumerate(payloads):
        data = payload_bytes(p, f"batch {i}")
        if len(data) >= 2**32:
            raise ConfigError(f"batch {i} is too large for a frame (2^32 bytes or more)")
        parts.append(struct.pack(">I", len(data)))
        parts.append(data)
    return b"".join(parts)


def check_cursor(after: object) -> int:
    """A subscription's starting cursor: an integer from 0 to 2**64-1, or -1 (meaning 0, as the
    server reads it); ``ConfigError`` otherwise (a corrupt cursor must not replay the stream)."""
    if isinstance(after, bool) or not isinstance(after, int) or not -1 <= after <= 2**64 - 1:
        raise ConfigError(f"the cursor {after!r} is not an integer from 0 to {2**64 - 1} (or -1, meaning 0)")
    return max(after, 0)


def put_stream_body(retention: Optional[Retention]) -> bytes:
    return b"" if retention is None else json.dumps({"retention": retention.to_json()}).encode()


def read_path(stream: str, after: int, limit: int, wait_ms: int, min_index: Optional[int]) -> str:
    path = f"/v1/streams/{segment(stream)}/batches?after={after}&limit={limit}&wait_ms={wait_ms}"
    return path if min_index is None else f"{path}&min_index={min_index}"


def parse_json(node: str, body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError as e:
        raise ProtocolError(node, f"not JSON: {e}") from None


class Nodes:
    """The configured nodes (base URLs), a rotation over them, and the leader learned from the
    ``Runnev-Leader`` header: writes go there first, saving the forwarding hop."""

    def __init__(self, nodes: Union[str, Sequence[str]], tls: bool) -> None:
        if isinstance(nodes, str):
            nodes = [n for n in nodes.split(",")]
        clean: List[str] = []
        for raw in nodes:
            n = raw.strip().rstrip("/")
            if not n:
                continue
            if "://" not in n:
                n = ("https://" if tls else "http://") + n
            elif tls and n.startswith("http://"):
                # With a CA file the nodes are reached over TLS, and named so in messages.
                n = "https://" + n[len("http://") :]
            bad = ConfigError(f"{raw!r} is not a node address: write HOST:PORT, http://HOST:PORT or https://HOST:PORT")
            try:
                url = httpx.URL(n)
            except httpx.InvalidURL:
                raise bad from None
            if url.scheme not in ("http", "https") or not url.host or url.port is None:
                raise bad
            if url.path not in ("", "/") or url.query:
                raise bad
            clean.append(n)
        if not clean:
            raise ConfigError("no node given")
        self.urls = clean
        self._authority = [httpx.URL(n).netloc.decode() for n in clean]
        self._next = itertools.count()
        self._leader: Optional[int] = None

    def pick(self) -> str:
        """The next node in rotation."""
        return self.urls[next(self._next) % len(self.urls)]

    def pick_for_write(self) -> str:
        """The known leader, else the next in rotation."""
        leader = self._leader
        return self.urls[leader] if leader is not None else self.pick()

    def learn_leader(self, headers: Mapping[str, str]) -> None:
        addr = headers.get(LEADER_HEADER)
        if addr is not None:
            self._leader = self._authority.index(addr) if addr in self._authority else None

    def forget_leader(self) -> None:
        self._leader = None


@dataclass
class Answer:
    """A definitive answer: the node that gave it, its status (2xx, or 404 for a delete whose
    lost attempt most likely did it) and its body."""

    node: str
    status: int
    body: bytes


class TlsRefusals:
    """TLS handshakes in a row that failed in a way no retry mends (``tls_refusal``), for a call
    or a subscription: a full round of them over the nodes raises ``TlsError``, as the
    configuration does not fit the cluster (the Rust client's rule)."""

    def __init__(self, nodes: Nodes) -> None:
        self._nodes = nodes
        self._in_a_row = 0

    def check(self, node: str, e: BaseException) -> Optional[str]:
        """The refusal's words when ``e`` is one (counted; ``TlsError`` once every node refused
        so in a row), else ``None`` (the count starts again)."""
        tls = tls_refusal(e)
        if tls is None:
            self._in_a_row = 0
            return None
        self._in_a_row += 1
        if self._in_a_row >= len(self._nodes.urls):
            raise TlsError(node, tls)
        return tls

    def reset(self) -> None:
        """An answer came: the count starts again."""
        self._in_a_row = 0


class Call:
    """One call's retry state (the Rust client's ``call_with``). The transport asks ``node()``
    for where to send each attempt and reports what happened with ``on_answer`` or
    ``on_transport_error``; each returns an ``Answer`` (done) or the seconds to wait before the
    next attempt (0: at once), or raises the call's error.

    ``idempotent`` false (a publish without seq): only an attempt that certainly was not applied
    (a refused connection, a ``503`` before any proposal) is retried. ``gone_is_done``: a ``404``
    to a retry after an attempt that may have been applied is an ``Answer``."""

    def __init__(self, nodes: Nodes, policy: RetryPolicy, write: bool, idempotent: bool, gone_is_done: bool = False) -> None:
        self.nodes, self.policy = nodes, policy
        self.write, self.idempotent, self.gone_is_done = write, idempotent, gone_is_done
        self.started = time.monotonic()
        self.backoff = Backoff(policy)
        self.answered = self.maybe_applied = self.reached = False
        self.refused_in_a_row = 0
        self.tls = TlsRefusals(nodes)

    def node(self) -> str:
        return self.nodes.pick_for_write() if self.write else self.nodes.pick()

    def on_answer(self, node: str, status: int, headers: Mapping[str, str], body: bytes) -> Union[Answer, float]:
        self.tls.reset()
        self.nodes.learn_leader(headers)
        if status == 503:
            self.answered = self.reached = True
            why = unavailable_text(node, body)
            unknown = OUTCOME_HEADER in headers
            if unknown and not self.idempotent:
                raise UnknownOutcome(why)
            self.maybe_applied |= unknown
            return self._retry(why, refused=False)
        if 200 <= status < 300:
            return Answer(node, status, body)
        if status == 404 and self.gone_is_done and self.maybe_applied:
            return Answer(node, status, body)
        raise error_from_body(node, status, body)

    def on_transport_error(self, node: str, e: httpx.TransportError) -> float:
        tls = self.tls.check(node, e)
        if tls is not None:
            # A configuration that does not fit the cluster: the next node at once.
            return self._retry(f"{node}: {tls}", refused=True)
        why = transport_why(node, e)
        # Nothing left this client: no connection, or none free in the pool.
        if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
            return self._retry(why, refused=True)
        if not self.idempotent:
            raise UnknownOutcome(why)
        self.reached = self.maybe_applied = True
        return self._retry(why, refused=False)

    def _retry(self, last: str, refused: bool) -> float:
        # The leader we knew failed us: rotate until an answer names the new one.
        self.nodes.forget_leader()
        if refused:
            self.refused_in_a_row += 1
            if self.refused_in_a_row < len(self.nodes.urls):
                return 0.0
        self.refused_in_a_row = 0
        elapsed = time.monotonic() - self.started
        delay = self.backoff.next_delay()
        deadline = self.policy.give_up_after if self.reached else min(self.policy.unreachable_after, self.policy.give_up_after)
        if elapsed + delay > deadline:
            if self.answered:
                raise Unavailable(elapsed, last)
            raise Unreachable(list(self.nodes.urls), elapsed, last)
        log.debug("retrying on another node in %.3f s: %s", delay, last)
        return delay


#: What a subscription yields: the next batch after the cursor, or a gap (an alert: these seqs
#: were evicted before they could be delivered).
Delivery = Union[Batch, Gap]


class Resume:
    """A subscription's cursor and outage bookkeeping, shared by the sync and async iterators
    (the Rust client's src/client/subscription.rs).

    The cursor is the last seq delivered (a gap's ``to`` after a gap). Every connection asks for
    the batches after it (``after`` and ``Last-Event-ID``); the server's repeats at or below it
    are dropped. A connection that breaks, ends, falls silent for ``SUBSCRIPTION_IDLE`` or sends
    ``unavailable`` is followed at once by one to the next node; failed connection attempts back
    off. With ``max_outage`` (seconds), an outage that long raises ``Unavailable`` (nodes
    answered ``5xx``) or ``Unreachable``; without it the subscription retries forever."""

    def __init__(self, nodes: Nodes, policy: RetryPolicy, stream: str, after: int, max_outage: Optional[float]) -> None:
        self.nodes, self.policy, self.max_outage = nodes, policy, max_outage
        self.path = f"/v1/streams/{segment(stream)}/subscribe"
        self.cursor = check_cursor(after)
        self.backoff = Backoff(policy)
        self.failing_since: Optional[float] = None
        self.answered = False
        #: What the last node that answered ``5xx`` during this outage said.
        self.answer_why: Optional[str] = None
        self.tls = TlsRefusals(nodes)
        #: The base URL of the node serving the subscription now; None while it has none.
        self.node: Optional[str] = None

    def request(self) -> tuple[str, Dict[str, str]]:
        """The URL and headers of the next connection attempt."""
        url = f"{self.nodes.pick()}{self.path}?after={self.cursor}"
        return url, {"Last-Event-ID": str(self.cursor), "Accept": "text/event-stream"}

    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.policy.request_timeout, read=SUBSCRIPTION_IDLE)

    def connected(self, node: str) -> None:
        log.debug("subscription connected to %s after seq %d", node, self.cursor)
        self.node = node
        self.failing_since = None
        self.answered = False
        self.answer_why = None
        self.tls.reset()
        self.backoff.reset()

    def refused(self, node: str, status: int, body: bytes) -> None:
        """A non-200 answer to a connection: ``5xx`` is retried (``failed``), else raised."""
        if status >= 500:
            self.answered = True
            self.answer_why = unavailable_text(node, body)
            return
        raise error_from_body(node, status, body)

    def failed_transport(self, node: str, e: BaseException) -> float:
        """A connection attempt failed without an answer: as ``failed``, but a TLS handshake that
        every node in a row refused for good raises ``TlsError`` (retrying cannot mend it)."""
        tls = self.tls.check(node, e)
        return self.failed(transport_why(node, e) if tls is None else f"{node}: {tls}")

    def failed(self, why: str) -> float:
        """A connection attempt failed: the seconds to wait before the next, or raises when the
        outage reached ``max_outage`` (``Unavailable`` with what the last node that answered
        said, when one did)."""
        now = time.monotonic()
        if self.failing_since is None:
            self.failing_since = now
        outage = now - self.failing_since
        if self.max_outage is not None and outage >= self.max_outage:
            if self.answered:
                raise Unavailable(outage, self.answer_why or why)
            raise Unreachable(list(self.nodes.urls), outage, why)
        delay = self.backoff.next_delay()
        log.info("subscription could not connect (%s); retrying in %.3f s", why, delay)
        return delay

    def lost(self, why: str) -> None:
        """The connection ended: the outage starts now; the next attempt goes at once."""
        self.node = None
        self.failing_since = time.monotonic()
        log.info("subscription connection lost (%s); resuming on the next node after seq %d", why, self.cursor)

    def event(self, node: str, name: str, data: str) -> Union[Delivery, None, Literal[False]]:
        """What an SSE event means: a delivery, ``None`` (nothing to yield: a repeat, a ping),
        or ``False`` (the node is cut off from the leader: reconnect elsewhere)."""
        if name == "batch":
            b = decode(node, "batch", parse_json(node, data.encode()))
            assert isinstance(b, Batch)
            if b.seq <= self.cursor:
                return None
            self.cursor = b.seq
            return b
        if name == "gap":
            g = decode(node, "gap", parse_json(node, data.encode()))
            assert isinstance(g, Gap)
            if g.to <= self.cursor:
                return None
            self.cursor = g.to
            return g
        if name == "unavailable":
            self.lost(f"{node} is cut off from the leader: {data}")
            return False
        return None


def tls_refusal(e: BaseException) -> Optional[str]:
    """Why a TLS handshake failed in a way no retry mends, in words naming the fix, or ``None``
    (the Rust client's ``tls::refusal``): a certificate the CA file does not verify (another
    CA, another host name, expired) or a node that answered TLS with plain HTTP."""
    seen: Optional[BaseException] = e
    for _ in range(32):  # a chain of causes is short; this bounds a pathological one
        if seen is None:
            break
        if isinstance(seen, ssl.SSLCertVerificationError):
            return (
                f"the node's certificate was refused ({seen.verify_message}): give ca_file as the cluster CA's "
                "certificate, and the nodes by the names their certificates were issued for"
            )
        if isinstance(seen, ssl.SSLError) and seen.reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "HTTP_REQUEST"):
            return "the node seems to serve plain HTTP: leave out ca_file and use http://"
        seen = seen.__cause__ or seen.__context__
    return None


def transport_why(node: str, e: BaseException) -> str:
    return f"{node}: {type(e).__name__}: {e}" if str(e) else f"{node}: {type(e).__name__}"


def check_token_transport(nodes: Nodes, token: Optional[str]) -> None:
    """``ConfigError`` for a token with a node reached over plain ``http://``: only nodes that
    serve TLS check tokens (``--auth`` needs ``--tls-ca``), so there the token would only travel
    in clear, to be ignored or refused."""
    if token and any(u.startswith("http://") for u in nodes.urls):
        raise ConfigError(
            "a token is sent only over TLS (nodes that check tokens serve TLS): give ca_file, the cluster "
            "CA's certificate (then HOST:PORT means https://), or leave the token out"
        )


def client_options(token: Optional[str], ca_file: Optional[str]) -> Dict[str, Any]:
    """The ``httpx.Client`` / ``AsyncClient`` options for a token (``Authorization: Bearer``)
    and a CA file that verifies the nodes' TLS certificates (docs/security.md)."""
    headers = {"Authorization": f"Bearer {token.strip()}"} if token else {}
    verify: Union[bool, ssl.SSLContext] = True
    if ca_file is not None:
        try:
            verify = ssl.create_default_context(cafile=ca_file)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"the CA file {ca_file}: {e}") from None
    return {"headers": headers, "verify": verify}

