"""Creates the JetStream stream the benchmark publishes to, and waits until it can take writes.

Run by nats.sh with the venv's Python (install.sh puts nats-py there):

    python nats_stream.py --servers nats://127.0.0.1:14222,... --stream BENCH --subjects 'bench.>'

The stream is what runnev-peer-bench (bench/src/main.rs) creates when it finds none: file storage
and three replicas, so every publish is replicated through one Raft group, as every Runnev publish
is. An existing stream is kept if it has that shape, and refused otherwise. Exits once the stream
has a leader and every replica is current and online; non-zero after --timeout-secs.
"""

import argparse
import asyncio
import sys
import time

import nats
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import NotFoundError


async def ensure_stream(servers, name, subjects, replicas, timeout_secs):
    nc = await nats.connect(servers=servers, connect_timeout=5)
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info(name)
            cfg = info.config
            if cfg.storage != StorageType.FILE or cfg.num_replicas != replicas or cfg.subjects != subjects:
                sys.exit(
                    f"stream {name} exists with storage {cfg.storage}, {cfg.num_replicas} replicas and "
                    f"subjects {cfg.subjects}; expected file, {replicas}, {subjects}: "
                    "restart the cluster with nats.sh stop --wipe"
                )
        except NotFoundError:
            await js.add_stream(
                StreamConfig(name=name, subjects=subjects, storage=StorageType.FILE, num_replicas=replicas)
            )
        deadline = time.monotonic() + timeout_secs
        while True:
            cluster = (await js.stream_info(name)).cluster
            replicas_ok = cluster is not None and all(r.current and not r.offline for r in cluster.replicas or [])
            if cluster is not None and cluster.leader and replicas_ok:
                print(f"stream {name}: subjects {subjects}, {replicas} file replicas, leader {cluster.leader}")
                return
            if time.monotonic() >= deadline:
                sys.exit(f"stream {name} has no leader with current replicas after {timeout_secs} s")
            await asyncio.sleep(0.2)
    finally:
        await nc.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--servers", required=True, help="comma-separated nats:// URLs")
    p.add_argument("--stream", default="BENCH")
    p.add_argument("--subjects", default="bench.>", help="comma-separated subject patterns")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--timeout-secs", type=float, default=30)
    a = p.parse_args()
    servers = [s.strip() for s in a.servers.split(",") if s.strip()]
    subjects = [s.strip() for s in a.subjects.split(",") if s.strip()]
    asyncio.run(ensure_stream(servers, a.stream, subjects, a.replicas, a.timeout_secs))


if __name__ == "__main__":
    main()
