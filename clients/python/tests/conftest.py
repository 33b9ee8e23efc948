from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from harness import Cluster  # noqa: E402


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One three-node cluster shared by the tests that do not kill a node."""
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    yield c
    c.stop()
