"""The asyncio client: ``AsyncClient`` and ``AsyncSubscription``, the same calls as
``runnev.Client`` with ``await`` and ``async for``.

Owns: running the retry decisions of ``_core`` over an ``httpx.AsyncClient``. Must never:
decide a retry itself (``_core.Call`` and ``_core.Resume`` do, for both clients alike).
"""

from __future__ import annotations

import asyncio
from typing import AsyncGenerator, AsyncIterator, List, Optional, Sequence, Union

import httpx
from httpx_sse import SSEError, aconnect_sse

from . import _core
from ._core import Answer, Call, Delivery, Nodes, Payload, RetryPolicy
from .models import FramesAck, PublishAck, ReadAnswer, Retention, StreamInfo, decode


class AsyncClient:
    """``runnev.Client`` for asyncio: the same arguments, rules and errors; every call is a
    coroutine, and ``subscribe`` returns an async iterator. Close it with ``await aclose()`` (or
    ``async with``)."""

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
        self._http = httpx.AsyncClient(**_core.client_options(token, ca_file))

    @property
    def nodes(self) -> List[str]:
        """The nodes' base URLs."""
        return list(self._nodes.urls)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(
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
                r = await self._http.request(method, node + path, content=body, headers=headers, timeout=timeout)
                step = call.on_answer(node, r.status_code, r.headers, r.content)
            except httpx.TransportError as e:
                step = call.on_transport_error(node, e)
            if isinstance(step, Answer):
                return step
            if step > 0:
                await asyncio.sleep(step)

    async def publish(self, stream: str, payload: Payload, seq: Optional[int] = None) -> PublishAck:
        """See ``Client.publish``."""
        a = await self._call("POST", _core.batches_path(stream, seq), _core.payload_bytes(payload), idempotent=seq is not None)
        return decode(a.node, "publish", _core.parse_json(a.node, a.body))  # type: ignore[no-any-return]

    async def publish_many(self, stream: str, payloads: Sequence[Payload], seq: Optional[int] = None) -> FramesAck:
        """See ``Client.publish_many``."""
        body = _core.encode_frames(payloads)
        path = _core.batches_path(stream, seq)
        a = await self._call("POST", path, body, _core.FRAMES_CONTENT_TYPE, idempotent=seq is not None)
        return decode(a.node, "frames", _core.parse_json(a.node, a.body))  # type: ignore[no-any-return]

    async def read(
        self, stream: str, after: int = 0, limit: int = 100, wait_ms: int = 0, min_index: Optional[int] = None
    ) -> ReadAnswer:
        """See ``Client.read``."""
        path = _core.read_path(stream, after, limit, wait_ms, min_index)
        a = await self._call("GET", path, extra_timeout=wait_ms / 1000)
        return decode(a.node, "read", _core.parse_json(a.node, a.body))  # type: ignore[no-any-return]

    async def create_stream(self, stream: str, retention: Optional[Retention] = None) -> tuple[StreamInfo, bool]:
        """See ``Client.create_stream``."""
        a = await self._call("PUT", f"/v1/streams/{_core.segment(stream)}", _core.put_stream_body(retention))
        return decode(a.node, "stream", _core.parse_json(a.node, a.body)), a.status == 201

    async def stream(self, stream: str) -> StreamInfo:
        """See ``Client.stream``."""
        a = await self._call("GET", f"/v1/streams/{_core.segment(stream)}")
        return decode(a.node, "stream", _core.parse_json(a.node, a.body))  # type: ignore[no-any-return]

    async def streams(self) -> List[StreamInfo]:
        """See ``Client.streams``."""
        a = await self._call("GET", "/v1/streams")
        return decode(a.node, "streams", _core.parse_json(a.node, a.body))  # type: ignore[no-any-return]

    async def delete_stream(self, stream: str) -> bool:
        """See ``Client.delete_stream``."""
        a = await self._call("DELETE", f"/v1/streams/{_core.segment(stream)}", gone_is_done=True)
        return a.status != 404

    def subscribe(self, stream: str, after: int = 0, *, max_outage: Optional[float] = None) -> "AsyncSubscription":
        """See ``Client.subscribe``; iterate it with ``async for``."""
        return AsyncSubscription(self, stream, after, max_outage)


class AsyncSubscription:
    """``runnev.Subscription`` for asyncio: an async iterator of ``Batch`` and ``Gap``, and an
    async context manager that closes it. ``await aclose()`` ends it, from the task that
    iterates it or from any other (the iteration then ends). Close it when you leave ``async
    for`` early (``break``): ``async with client.subscribe(…) as sub: async for item in sub:``.
    Left open, its connection is closed by asyncio's shutdown, which may report errors of the
    HTTP library's own generators (Python closes all of them at once there)."""

    def __init__(self, client: AsyncClient, stream: str, after: int, max_outage: Optional[float]) -> None:
        self._client = client
        self._resume = _core.Resume(client._nodes, client.policy, stream, after, max_outage)
        self._gen: Optional[AsyncGenerator[Delivery, None]] = None
        self._closed = False
        self._current: Optional[httpx.Response] = None
        self._closing: Optional[asyncio.Event] = None

    @property
    def cursor(self) -> int:
        """The last seq yielded (a gap's ``to`` after a gap), or the starting cursor."""
        return self._resume.cursor

    @property
    def node(self) -> Optional[str]:
        """The base URL of the node serving the subscription now; None while it has none."""
        return self._resume.node

    async def __aenter__(self) -> "AsyncSubscription":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncIterator[Delivery]:
        self._gen = self._run()
        return self._gen

    async def aclose(self) -> None:
        """Ends the subscription and closes its connection. From another task than the one
        iterating, the iteration ends at its next step (a read under way is woken by the closed
        connection, a backoff by the close)."""
        self._closed = True
        if self._closing is not None:
            self._closing.set()
        current = self._current
        if current is not None:
            await current.aclose()
        gen = self._gen
        if gen is not None and not getattr(gen, "ag_running", False):
            await gen.aclose()

    async def _sleep(self, seconds: float) -> None:
        """Waits ``seconds``, or less when the subscription is closed meanwhile."""
        if self._closing is None:
            self._closing = asyncio.Event()
        try:
            await asyncio.wait_for(self._closing.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def _run(self) -> AsyncGenerator[Delivery, None]:
        r = self._resume
        while not self._closed:
            url, headers = r.request()
            node = url.split("/v1/", 1)[0]
            connected = False
            try:
                async with aconnect_sse(self._client._http, "GET", url, headers=headers, timeout=r.timeout()) as source:
                    resp = source.response
                    if resp.status_code != 200:
                        r.refused(node, resp.status_code, await resp.aread())
                        await self._sleep(r.failed(f"{node} answered {resp.status_code}"))
                        continue
                    r.connected(node)
                    connected = True
                    self._current = resp
                    async for sse in source.aiter_sse():
                        item = r.event(node, sse.event, sse.data)
                        if item is False:
                            break
                        if item is not None:
                            try:
                                yield item
                            except GeneratorExit:
                                # Closed by aclose() or by finalization after a `break`: what
                                # closing the connection raises next must not resume the loop.
                                self._closed = True
                                raise
                    else:
                        r.lost(f"{node} closed the connection")
            except (httpx.TransportError, httpx.StreamError, SSEError) as e:
                if self._closed:
                    return
                if connected:
                    r.lost(_core.transport_why(node, e))
                else:
                    await self._sleep(r.failed_transport(node, e))
            finally:
                self._current = None
