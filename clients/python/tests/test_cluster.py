"""The client against a real three-node cluster of ``runnev serve`` processes."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import List, Union

import pytest
from harness import Cluster, LossyProxy, eventually

import runnev
from runnev import Batch, Client, FileCursor, Gap, Retention


def test_publish_and_read_round_trip(cluster: Cluster) -> None:
    payloads = [b"hello", b"", bytes(range(256)), b"\x00" * 1000]
    with Client(cluster.urls) as c:
        info, created = c.create_stream("py-round-trip")
        assert created and info.last_seq == 0 and info.first_seq == 1
        _, created = c.create_stream("py-round-trip")
        assert not created
        acks = [c.publish("py-round-trip", p) for p in payloads]
        assert [a.seq for a in acks] == [1, 2, 3, 4]
        assert not any(a.duplicate for a in acks)
        got = c.read("py-round-trip", after=0, min_index=acks[-1].index)
        assert [(b.seq, b.data) for b in got.batches] == list(enumerate(payloads, start=1))
        assert got.gap is None and got.last_seq == 4 and got.next_after == 4
        assert c.read("py-round-trip", after=2, limit=1, min_index=acks[-1].index).batches[0].data == payloads[2]
        # Stream info is one node's applied view: a follower may not have applied the last publish yet.
        assert eventually(lambda: c.stream("py-round-trip").batches == 4)
        assert "py-round-trip" in [s.name for s in c.streams()]
        assert c.delete_stream("py-round-trip") is True
        with pytest.raises(runnev.StreamNotFound) as e:
            c.publish("py-round-trip", b"x")
        assert e.value.status == 404 and e.value.code == "stream_not_found"
        with pytest.raises(runnev.InvalidStreamName):
            c.publish("no spaces", b"x")


def test_async_client_round_trip(cluster: Cluster) -> None:
    async def run() -> None:
        async with runnev.AsyncClient(cluster.urls) as c:
            await c.create_stream("py-async")
            ack = await c.publish("py-async", b"one")
            again = await c.publish("py-async", b"two", seq=2)
            assert (ack.seq, again.seq, again.duplicate) == (1, 2, False)
            assert (await c.publish("py-async", b"two", seq=2)).duplicate
            frames = await c.publish_many("py-async", [b"three", b"four"])
            assert (frames.first_seq, frames.last_seq) == (3, 4)
            got = await c.read("py-async", min_index=frames.index)
            assert [b.data for b in got.batches] == [b"one", b"two", b"three", b"four"]
            seen: List[int] = []
            sub = c.subscribe("py-async", after=1)
            async for item in sub:
                assert isinstance(item, Batch)
                seen.append(item.seq)
                if item.seq == 4:
                    break
            await sub.aclose()
            assert seen == [2, 3, 4] and sub.cursor == 4
            for _ in range(100):
                if (await c.stream("py-async")).last_seq == 4:
                    break
                await asyncio.sleep(0.1)
            assert (await c.stream("py-async")).last_seq == 4
            assert await c.delete_stream("py-async")

    asyncio.run(run())


def test_async_subscription_closes_from_another_task_and_after_a_break(cluster: Cluster) -> None:
    """``aclose()`` from another task ends an iteration waiting for the next batch (it raised
    "asynchronous generator is already running"), and a subscription left with ``break`` inside
    ``async with`` is closed with nothing for asyncio to report at exit (found by a fresh user's
    trial, which left it unclosed: the README now says to close it)."""

    problems: List[str] = []

    async def run() -> None:
        # What asyncio reports about its async generators, up to the shutdown of asyncio.run.
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: problems.append(str(ctx)))
        async with runnev.AsyncClient(cluster.urls) as c:
            await c.create_stream("py-async-close")
            await c.publish("py-async-close", b"one", seq=1)
            sub = c.subscribe("py-async-close")
            seen: List[int] = []

            async def consume() -> None:
                async for item in sub:
                    assert isinstance(item, Batch)
                    seen.append(item.seq)

            task = asyncio.create_task(consume())
            for _ in range(100):
                if seen:
                    break
                await asyncio.sleep(0.05)
            assert seen == [1]
            await sub.aclose()
            await asyncio.wait_for(task, 5)
            assert task.exception() is None and seen == [1]

            async with c.subscribe("py-async-close") as again:
                async for item in again:
                    assert isinstance(item, Batch) and item.seq == 1
                    break

    asyncio.run(run())
    assert problems == []


def test_sync_subscription_closes_from_another_thread_at_once(cluster: Cluster) -> None:
    """``close()`` from another thread ends an iteration blocked on the next batch at once (it
    took until the node's next keep-alive, up to 10 s)."""
    with Client(cluster.urls) as c:
        c.create_stream("py-sync-close")
        c.publish("py-sync-close", b"one", seq=1)
        sub = c.subscribe("py-sync-close")
        seen: List[int] = []
        worker = threading.Thread(target=lambda: seen.extend(b.seq for b in sub if isinstance(b, Batch)))
        worker.start()
        assert eventually(lambda: seen == [1])
        sub.close()
        worker.join(3.0)
        assert not worker.is_alive(), "the iteration did not end within 3 s of close()"


def test_publish_with_seq_whose_answer_was_lost_is_retried_as_a_duplicate(cluster: Cluster) -> None:
    with Client(cluster.urls) as c:
        c.create_stream("py-seq")
        proxy = LossyProxy(cluster.urls[0].removeprefix("http://"))
        try:
            # The first attempt goes through the proxy, is stored, and its answer is lost; the
            # retry on the next node, with the same seq, is answered as a duplicate.
            with Client([f"http://{proxy.addr}", *cluster.urls]) as lossy:
                ack = lossy.publish("py-seq", b"once", seq=1)
            assert proxy.requests == 1
            assert ack.duplicate and ack.seq == 1
        finally:
            proxy.close()
        got = c.read("py-seq", min_index=ack.index)
        assert [(b.seq, b.data) for b in got.batches] == [(1, b"once")]
        with pytest.raises(runnev.SeqConflict):
            c.publish("py-seq", b"other", seq=1)
        assert c.publish("py-seq", b"five", seq=5).seq == 5
        with pytest.raises(runnev.SeqNotIncreasing):
            c.publish("py-seq", b"three", seq=3)


def test_publish_without_seq_whose_answer_was_lost_raises_unknown_outcome(cluster: Cluster) -> None:
    with Client(cluster.urls) as c:
        c.create_stream("py-unknown")
        proxy = LossyProxy(cluster.urls[1].removeprefix("http://"))
        try:
            with Client([f"http://{proxy.addr}", *cluster.urls]) as lossy:
                with pytest.raises(runnev.UnknownOutcome):
                    lossy.publish("py-unknown", b"maybe")
            assert proxy.requests == 1
        finally:
            proxy.close()
        # The lost attempt was stored, and nothing retried it elsewhere: exactly one batch.
        got = c.read("py-unknown", wait_ms=5000)
        assert [b.data for b in got.batches] == [b"maybe"] and got.last_seq == 1


def test_frames_publish(cluster: Cluster) -> None:
    with Client(cluster.urls) as c:
        c.create_stream("py-frames")
        ack = c.publish_many("py-frames", [b"hello", b"", b"abc"], seq=1)
        assert (ack.first_seq, ack.last_seq, ack.count, ack.duplicate) == (1, 3, 3, False)
        assert c.publish_many("py-frames", [b"hello", b"", b"abc"], seq=1).duplicate
        with pytest.raises(runnev.PartialDuplicate) as e:
            c.publish_many("py-frames", [b"abc", b"new"], seq=3)
        assert e.value.frame == 1
        with pytest.raises(runnev.SeqConflict) as conflict:
            c.publish_many("py-frames", [b"hello", b"changed"], seq=1)
        assert conflict.value.frame == 1
        more = c.publish_many("py-frames", [b"d", b"e"])
        assert (more.first_seq, more.last_seq) == (4, 5)
        got = c.read("py-frames", min_index=more.index)
        assert [b.data for b in got.batches] == [b"hello", b"", b"abc", b"d", b"e"]
        with pytest.raises(runnev.ConfigError):
            c.publish_many("py-frames", [])


def test_subscribe_resumes_from_a_file_cursor(cluster: Cluster, tmp_path: Path) -> None:
    cursor = FileCursor(tmp_path / "consumer.cursor")
    with Client(cluster.urls) as c:
        c.create_stream("py-sub")
        for i in range(1, 6):
            c.publish("py-sub", f"m{i}".encode(), seq=i)
        seen: List[int] = []
        for item in c.subscribe("py-sub", after=cursor.load()):
            assert isinstance(item, Batch)
            seen.append(item.seq)
            cursor.save(item.seq)
            if item.seq == 3:
                break
        assert seen == [1, 2, 3] and cursor.load() == 3
        for i in range(6, 8):
            c.publish("py-sub", f"m{i}".encode(), seq=i)
        sub = c.subscribe("py-sub", after=cursor.load())
        rest = []
        for item in sub:
            assert isinstance(item, Batch)
            rest.append((item.seq, item.data))
            cursor.save(item.seq)
            if item.seq == 7:
                break
        sub.close()
        assert rest == [(i, f"m{i}".encode()) for i in range(4, 8)]
        assert cursor.load() == 7


def test_gap_after_retention_evicted_batches_behind_the_cursor(cluster: Cluster) -> None:
    with Client(cluster.urls) as c:
        c.create_stream("py-gap", Retention(max_batches=3))
        last = None
        for i in range(10):
            last = c.publish("py-gap", f"b{i + 1}".encode())
        assert last is not None
        # Every node has applied the evictions (a node behind would not know of the gap yet).
        for url in cluster.urls:
            with Client([url]) as one:
                got = one.read("py-gap", after=2, min_index=last.index)
            assert got.gap == Gap(3, 7) and [b.seq for b in got.batches] == [8, 9, 10]
            assert got.next_after == 10
        items: List[Union[Batch, Gap]] = []
        sub = c.subscribe("py-gap", after=2)
        for item in sub:
            items.append(item)
            if isinstance(item, Batch) and item.seq == 10:
                break
        assert items[0] == Gap(3, 7)
        assert [(b.seq, b.data) for b in items[1:] if isinstance(b, Batch)] == [(8, b"b8"), (9, b"b9"), (10, b"b10")]
        assert len(items) == 4 and sub.cursor == 10


def test_subscription_survives_the_leader_killed_mid_stream(tmp_path: Path) -> None:
    """kill -9 of the leader that serves the subscription: it continues on another node, every
    seq delivered once, in order, none skipped."""
    total, kill_at = 60, 20
    cluster = Cluster(tmp_path)
    try:
        leader = cluster.leader()
        others = [cluster.url(i) for i in cluster.ports if i != leader]
        with Client(cluster.urls) as c:
            c.create_stream("py-failover")
        # The subscriber's first node is the leader, so the kill breaks its connection.
        sub_client = Client([cluster.url(leader), *others])
        sub = sub_client.subscribe("py-failover", after=0, max_outage=30)
        items: List[Union[Batch, Gap]] = []
        nodes_seen: List[str] = []
        errors: List[BaseException] = []

        def consume() -> None:
            try:
                for item in sub:
                    items.append(item)
                    if sub.node is not None and (not nodes_seen or nodes_seen[-1] != sub.node):
                        nodes_seen.append(sub.node)
                    if isinstance(item, Batch) and item.seq == total:
                        return
            except BaseException as e:  # surfaced by the assertion below
                errors.append(e)

        t = threading.Thread(target=consume, daemon=True)
        t.start()
        with Client(cluster.urls) as pub:
            for seq in range(1, total + 1):
                if seq == kill_at + 1:
                    # Wait until the subscriber got what was published, on the leader, then kill it.
                    deadline = time.monotonic() + 20
                    while len(items) < kill_at and time.monotonic() < deadline:
                        time.sleep(0.05)
                    assert sub.node == cluster.url(leader), (sub.node, leader)
                    cluster.kill(leader)
                pub.publish("py-failover", f"p{seq}".encode(), seq=seq)
        t.join(timeout=60)
        sub_client.close()
        assert not errors, errors
        assert not t.is_alive(), f"the subscription stopped at {sub.cursor}"
        assert all(isinstance(i, Batch) for i in items), items
        assert [i.seq for i in items if isinstance(i, Batch)] == list(range(1, total + 1))
        assert [i.data for i in items if isinstance(i, Batch)] == [f"p{s}".encode() for s in range(1, total + 1)]
        assert nodes_seen[0] == cluster.url(leader) and nodes_seen[-1] != cluster.url(leader), nodes_seen
    finally:
        cluster.stop()
