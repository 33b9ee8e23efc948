"""The client against ``runnev local --secure``: client TLS verified with the cluster's CA file,
and tokens sent as ``Authorization: Bearer``."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
from harness import SecureCluster, runnev_bin

import runnev
from runnev import Batch, Client, RetryPolicy


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    c = SecureCluster(tmp_path_factory.mktemp("secure"))
    yield c
    c.stop()


def test_token_and_ca_file_publish_read_and_subscribe(secure: SecureCluster) -> None:
    # HOST:PORT without a scheme means https when a CA file is given.
    nodes = [u.removeprefix("https://") for u in secure.urls]
    with Client(nodes, token=secure.token, ca_file=secure.ca) as c:
        assert c.nodes == secure.urls
        c.create_stream("py-secure")
        ack = c.publish("py-secure", b"secret", seq=1)
        assert c.read("py-secure", min_index=ack.index).batches[0].data == b"secret"
        for item in c.subscribe("py-secure"):
            assert item == Batch(1, ack.ts, b"secret")
            break


def test_no_token_is_unauthorized(secure: SecureCluster) -> None:
    with Client(secure.urls, ca_file=secure.ca) as c:
        with pytest.raises(runnev.Unauthorized) as e:
            c.streams()
        assert e.value.status == 401 and e.value.code == "unauthorized"
        with pytest.raises(runnev.Unauthorized):
            next(iter(c.subscribe("py-secure")))
    with Client(secure.urls, token="rnv_admin_" + "0" * 64, ca_file=secure.ca) as c:
        with pytest.raises(runnev.Unauthorized):
            c.publish("py-secure", b"x")


def test_without_the_ca_file_no_node_is_trusted(secure: SecureCluster, tmp_path: Path) -> None:
    # The system's CAs do not trust the cluster's: a TLS error after one try of each node, not
    # "no node reachable" after retries (nor a subscription retrying for ever).
    with Client(secure.urls, token=secure.token) as c:
        with pytest.raises(runnev.TlsError) as e:
            c.streams()
        assert "certificate was refused" in str(e.value) and "ca_file" in str(e.value)
        with pytest.raises(runnev.TlsError):
            next(iter(c.subscribe("py-secure")))
    # Nor does another CA's certificate.
    other = tmp_path / "other"
    subprocess.run([runnev_bin(), "cert", "create-ca", "--dir", str(other)], check=True, capture_output=True)
    with Client(secure.urls, token=secure.token, ca_file=str(other / "ca.pem")) as c:
        with pytest.raises(runnev.TlsError):
            c.publish("py-secure", b"x", seq=99)

    async def subscribe_async() -> None:
        async with runnev.AsyncClient(secure.urls, token=secure.token, ca_file=str(other / "ca.pem")) as a:
            async for _ in a.subscribe("py-secure"):
                pass

    with pytest.raises(runnev.TlsError):
        asyncio.run(asyncio.wait_for(subscribe_async(), 30))
    # A token is never sent over plain HTTP; with the CA file, http:// means the node over TLS.
    plain = [u.replace("https://", "http://") for u in secure.urls]
    with pytest.raises(runnev.ConfigError) as c_err:
        Client(plain, token=secure.token)
    assert "only over TLS" in str(c_err.value)
    with Client(plain, token=secure.token, ca_file=secure.ca) as c:
        assert c.nodes == secure.urls
        c.streams()
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    with pytest.raises(runnev.ConfigError):
        Client(secure.urls, ca_file=str(bad))
