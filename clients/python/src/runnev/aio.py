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
from ._core import Answer, Call, Delivery, Nodes, RetryPolicy
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

    async def publish(self, stream: str, payload: bytes, seq: Optional[int] = None) -> PublishAck:
        """See ``Client.publish``."""
        a = await self._call("POST", _core.batches_path(stream, seq), bytes(payload), idempotent=seq is not None)
        return decode(a.node, "publish", _core.parse_json(a.node, a.body))  # type: ignore[no-any-return]

    async def publish_many(self, stream: str, payloads: Sequence[bytes], seq: Optional[int] = None) -> FramesAck:
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
    """``runnev.Subscription`` for asyncio: an async iterator of ``Batch`` and ``Gap``."""

    def __init__(self, client: AsyncClient, stream: str, after: int, max_outage: Optional[float]) -> None:
        self._client = client
        self._resume = _core.Resume(client._nodes, client.policy, stream, after, max_outage)
        self._gen: Optional[AsyncGenerator[Delivery, None]] = None

    @property
    def cursor(self) -> int:
        """The last seq yielded (a gap's ``to`` after a gap), or the starting cursor."""
        return self._resume.cursor

    @property
    def node(self) -> Optional[str]:
        """The base URL of the node serving the subscription now; None while it has none."""
        return self._resume.node

    def __aiter__(self) -> AsyncIterator[Delivery]:
        self._gen = self._run()
        return self._gen

    async def aclose(self) -> None:
        """Ends the subscription and closes its connection."""
        if self._gen is not None:
            await self._gen.aclose()

    async def _run(self) -> AsyncGenerator[Delivery, None]:
        r = self._resume
        while True:
            url, headers = r.request()
            node = url.split("/v1/", 1)[0]
            connected = False
            try:
                async with aconnect_sse(self._client._http, "GET", url, headers=headers, timeout=r.timeout()) as source:
                    resp = source.response
                    if resp.status_code != 200:
                        r.refused(node, resp.status_code, await resp.aread())
                        await asyncio.sleep(r.failed(f"{node} answered {resp.status_code}"))
                        continue
                    r.connected(node)
                    connected = True
                    async for sse in source.aiter_sse():
                        item = r.event(node, sse.event, sse.data)
                        if item is False:
                            break
                        if item is not None:
                            yield item
                    else:
                        r.lost(f"{node} closed the connection")
            except (httpx.TransportError, httpx.StreamError, SSEError) as e:
                why = _core.transport_why(node, e)
                if connected:
                    r.lost(why)
                else:
                    await asyncio.sleep(r.failed(why))
