"""The synchronous client: ``Client`` over a list of nodes, and ``Subscription``.

Owns: running the retry decisions of ``_core`` over a blocking ``httpx.Client``. Must never:
decide a retry itself (``_core.Call`` and ``_core.Resume`` do, for both clients alike).
"""

from __future__ import annotations

import socket
import time
from typing import Iterator, List, Optional, Sequence, Union

import httpx
from httpx_sse import SSEError, connect_sse

from . import _core
from ._core import Answer, Call, Delivery, Nodes, Payload, RetryPolicy
from .models import FramesAck, PublishAck, ReadAnswer, Retention, StreamInfo, decode


class Client:
    """A Runnev client over ``nodes`` (a list, or a comma-separated string, of ``HOST:PORT``,
    ``http://HOST:PORT`` or ``https://HOST:PORT``; ``HOST:PORT`` means https when ``ca_file`` is
    given). Sends ``token`` as ``Authorization: Bearer`` on every request; verifies the nodes'
    TLS certificates against ``ca_file`` (the cluster CA's PEM, e.g. ``runnev local --secure``'s
    ``ca.pem``). Safe to share between threads; close it (or use ``with``) when done.

    Failover (the Rust client's rules): a refused connection moves on to the next node at once;
    after a round of refusals, and after any other failure, it backs off exponentially. A call
    that saw only refused connections for ``policy.unreachable_after`` raises ``Unreachable``;
    one that reached a node retries ``503`` and lost answers until ``policy.give_up_after``, then
    raises ``Unavailable``. Any other error answer is raised at once as an ``ApiError``
    subclass. Writes go first to the leader named by the ``Runnev-Leader`` header.

    Errors of every method: ``ConfigError`` (nothing sent), ``InvalidStreamName`` (nothing sent),
    ``ApiError`` and its subclasses, ``Unreachable``, ``Unavailable``, ``ProtocolError``."""

    def __init__(
        self,
        nodes: Union[str, Sequence[str]],
        *,
        token: Optional[str] = None,
        ca_file: Optional[str] = None,
        policy: Optional[RetryPolicy] = None,
    ) -> None:
        self._nodes = Nodes(nodes, tls=ca_file is not None)
        _core.check_token_transport(self._nodes, token)
        self.policy = policy or RetryPolicy()
        self._http = httpx.Client(**_core.client_options(token, ca_file))

    @property
    def nodes(self) -> List[str]:
        """The nodes' base URLs."""
        return list(self._nodes.urls)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        content_type: Optional[str] = None,
        idempotent: bool = True,
        gone_is_done: bool = False,
        extra_timeout: float = 0.0,
    ) -> Answer:
        call = Call(self._nodes, self.policy, method != "GET", idempotent, gone_is_done)
        headers = {"Content-Type": content_type} if content_type else {}
        timeout = self.policy.request_timeout + extra_timeout
        while True:
            node = call.node()
            try:
                r = self._http.request(method, node + path, content=body, headers=headers, timeout=timeout)
                step = call.on_answer(node, r.status_code, r.headers, r.content)
            except httpx.TransportError as e:
                step = call.on_transport_error(node, e)
            if isinstance(step, Answer):
                return step
            if step > 0:
                time.sleep(step)

    def publish(self, stream: str, payload: Payload, seq: Optional[int] = None) -> PublishAck:
        """Publishes one batch (the payload byte for byte); with ``seq``, idempotently.

        With a seq every failure that is not a definitive answer (a refused or lost connection,
        a timeout, a ``503``) is retried with the same seq, and a batch a lost attempt stored is
        answered ``duplicate=True``. Without a seq, only a refused connection or a ``503`` before
        any proposal is retried; a timeout, a connection lost after the request left, or ``503``
        with ``Runnev-Outcome: unknown`` raise ``UnknownOutcome``.

        Errors: ``StreamNotFound``, ``SeqConflict``, ``SeqNotIncreasing``, ``SeqEvicted``,
        ``PayloadTooLarge``, ``UnknownOutcome``, and those of every method."""
        a = self._call("POST", _core.batches_path(stream, seq), _core.payload_bytes(payload), idempotent=seq is not None)
        return decode(a.node, "publish", _core.parse_json(a.node, a.body))  # type: ignore[no-any-return]

    def publish_many(self, stream: str, payloads: Sequence[Payload], seq: Optional[int] = None) -> FramesAck:
        """Publishes ``payloads`` as many batches in one request (``application/vnd.runnev.frames``):
        one Raft entry, all or none; frame k at seq ``seq + k``, or at consecutive seqs after the
        stream's last. Retried as ``publish`` is.

        Errors: as ``publish``, where ``ApiError.frame`` names the frame at fault, plus
        ``PartialDuplicate`` (nothing written; resend from ``frame`` with ``seq + frame``) and
        ``ConfigError`` for 0 or more than 10,000 payloads."""
        body = _core.encode_frames(payloads)
        path = _core.batches_path(stream, seq)
        a = self._call("POST", path, body, _core.FRAMES_CONTENT_TYPE, idempotent=seq is not None)
        return decode(a.node, "frames", _core.parse_json(a.node, a.body))  # type: ignore[no-any-return]

    def read(self, stream: str, after: int = 0, limit: int = 100, wait_ms: int = 0, min_index: Optional[int] = None) -> ReadAnswer:
        """Reads up to ``limit`` batches with seq > ``after``, waiting up to ``wait_ms`` ms for
        one, from a node that has applied ``min_index`` when given (read-your-writes). A gap is
        in ``ReadAnswer.gap``; pass ``next_after`` back as ``after`` to continue."""
        path = _core.read_path(stream, after, limit, wait_ms, min_index)
        a = self._call("GET", path, extra_timeout=wait_ms / 1000)
        return decode(a.node, "read", _core.parse_json(a.node, a.body))  # type: ignore[no-any-return]

    def create_stream(self, stream: str, retention: Optional[Retention] = None) -> tuple[StreamInfo, bool]:
        """Creates ``stream``, or replaces its retention as a whole when ``retention`` is given
        (``PUT``, idempotent). Returns its info and whether this call created it."""
        a = self._call("PUT", f"/v1/streams/{_core.segment(stream)}", _core.put_stream_body(retention))
        return decode(a.node, "stream", _core.parse_json(a.node, a.body)), a.status == 201

    def stream(self, stream: str) -> StreamInfo:
        """One stream's info, from one node's applied state."""
        a = self._call("GET", f"/v1/streams/{_core.segment(stream)}")
        return decode(a.node, "stream", _core.parse_json(a.node, a.body))  # type: ignore[no-any-return]

    def streams(self) -> List[StreamInfo]:
        """Every stream, in name order, from one node's applied state."""
        a = self._call("GET", "/v1/streams")
        return decode(a.node, "streams", _core.parse_json(a.node, a.body))  # type: ignore[no-any-return]

    def delete_stream(self, stream: str) -> bool:
        """Deletes ``stream`` and its batches. Returns True when this call's answer said so, False
        when an attempt whose answer was lost most likely did (a retry found it gone).
        ``StreamNotFound`` when it did not exist."""
        a = self._call("DELETE", f"/v1/streams/{_core.segment(stream)}", gone_is_done=True)
        return a.status != 404

    def subscribe(self, stream: str, after: int = 0, *, max_outage: Optional[float] = None) -> "Subscription":
        """A live subscription to ``stream`` after the cursor ``after`` (the last seq processed;
        0 for the start): an iterator of ``Batch`` and ``Gap`` in seq order, each seq at most
        once, failing over between nodes. See ``Subscription``."""
        return Subscription(self, stream, after, max_outage)


class Subscription:
    """Iterates ``Batch`` and ``Gap`` items of a stream after a cursor, over Server-Sent Events
    from one node at a time; on a broken, ended or silent connection, or an ``unavailable``
    event, it resumes on the next node after the last seq it yielded (``cursor``). A ``Gap``
    says seqs ``from_..=to`` were evicted before they could be delivered; the subscription goes
    on after it. ``max_outage`` (seconds) ends it with ``Unavailable``/``Unreachable`` after that
    long without a connection (default: retry forever). A ``4xx`` answer (``StreamNotFound``,
    ``Unauthorized``) is raised. ``close()`` ends it."""

    def __init__(self, client: Client, stream: str, after: int, max_outage: Optional[float]) -> None:
        self._client = client
        self._resume = _core.Resume(client._nodes, client.policy, stream, after, max_outage)
        self._closed = False
        self._current: Optional[httpx.Response] = None

    @property
    def cursor(self) -> int:
        """The last seq yielded (a gap's ``to`` after a gap), or the starting cursor."""
        return self._resume.cursor

    @property
    def node(self) -> Optional[str]:
        """The base URL of the node serving the subscription now; None while it has none."""
        return self._resume.node

    def close(self) -> None:
        """Ends the subscription; an iteration blocked in another thread ends at once (its
        connection's socket is shut down, which wakes the blocked read)."""
        self._closed = True
        current = self._current
        if current is not None:
            stream = current.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            current.close()

    def __iter__(self) -> Iterator[Delivery]:
        r = self._resume
        while not self._closed:
            url, headers = r.request()
            node = url.split("/v1/", 1)[0]
            connected = False
            try:
                with connect_sse(self._client._http, "GET", url, headers=headers, timeout=r.timeout()) as source:
                    resp = source.response
                    if resp.status_code != 200:
                        r.refused(node, resp.status_code, resp.read())
                        time.sleep(r.failed(f"{node} answered {resp.status_code}"))
                        continue
                    r.connected(node)
                    connected = True
                    self._current = resp
                    for sse in source.iter_sse():
                        item = r.event(node, sse.event, sse.data)
                        if item is False:
                            break
                        if item is not None:
                            yield item
                    else:
                        r.lost(f"{node} closed the connection")
            except (httpx.TransportError, httpx.StreamError, SSEError) as e:
                if self._closed:
                    return
                if not connected:
                    time.sleep(r.failed_transport(node, e))
                else:
                    r.lost(_core.transport_why(node, e))
            finally:
                self._current = None
