"""What the cluster answers, as typed values (shapes in docs/http-api.md and docs/contract.md).

Owns: decoding answers' JSON into these values. Must never: accept an answer of another shape
silently (a missing field is a ``ProtocolError``).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

from .errors import ProtocolError


@dataclass(frozen=True)
class Batch:
    """One batch: its ``seq``, ``ts`` (leader-assigned, ms since the Unix epoch) and payload."""

    seq: int
    ts: int
    data: bytes


@dataclass(frozen=True)
class Gap:
    """Seqs ``from_`` to ``to`` (inclusive) were evicted by retention (or removed by a delete)
    before they could be delivered (contract §5). A consumer continues after ``to``."""

    from_: int
    to: int


@dataclass(frozen=True)
class PublishAck:
    """The answer to a publish: ``duplicate`` is true for a retry of a batch already stored at
    that seq with the same bytes (``ts`` and ``index`` are then the original's). ``index`` is the
    Raft log index, usable as ``min_index`` for read-your-writes."""

    seq: int
    ts: int
    duplicate: bool
    index: int


@dataclass(frozen=True)
class FramesAck:
    """The answer to a frames publish: every frame stored at ``first_seq..=last_seq`` in one
    Raft entry, or (``duplicate``) all of them already stored by an earlier attempt."""

    first_seq: int
    last_seq: int
    count: int
    ts: int
    index: int
    duplicate: bool


@dataclass(frozen=True)
class Retention:
    """Retention limits; ``None`` means no limit (contract §4). Units: batches, bytes, ms."""

    max_batches: Optional[int] = None
    max_bytes: Optional[int] = None
    max_age_ms: Optional[int] = None

    def to_json(self) -> Dict[str, Any]:
        return {"max_batches": self.max_batches, "max_bytes": self.max_bytes, "max_age_ms": self.max_age_ms}


@dataclass(frozen=True)
class StreamInfo:
    """A stream's info as one node has applied it."""

    name: str
    first_seq: int
    last_seq: int
    evicted_through: int
    batches: int
    bytes: int
    retention: Retention


@dataclass(frozen=True)
class ReadAnswer:
    """The answer to a read: batches after the cursor in seq order, the gap before them if
    retention evicted seqs the reader asked for, the stream's ``last_seq`` on the node, and
    ``next_after`` to pass back as ``after`` to continue without loss."""

    batches: List[Batch]
    gap: Optional[Gap]
    last_seq: int
    next_after: int


def _int(d: Mapping[str, Any], k: str) -> int:
    v = d[k]
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{k} is not an integer")
    return v


def _opt_int(d: Mapping[str, Any], k: str) -> Optional[int]:
    return None if d.get(k) is None else _int(d, k)


def _bool(d: Mapping[str, Any], k: str) -> bool:
    v = d[k]
    if not isinstance(v, bool):
        raise TypeError(f"{k} is not a boolean")
    return v


def decode(node: str, what: str, d: Any) -> Any:
    """``d`` (parsed JSON) as the value ``what`` names; ``ProtocolError`` if it has another shape."""
    try:
        if not isinstance(d, dict):
            raise TypeError("not an object")
        return _DECODERS[what](d)
    except (KeyError, TypeError, ValueError, binascii.Error) as e:
        raise ProtocolError(node, f"{what}: {e!r}") from None


def _batch(d: Mapping[str, Any]) -> Batch:
    data = d["data"]
    if not isinstance(data, str):
        raise TypeError("data is not a string")
    return Batch(_int(d, "seq"), _int(d, "ts"), base64.b64decode(data, validate=True))


def _gap(d: Mapping[str, Any]) -> Gap:
    return Gap(_int(d, "from"), _int(d, "to"))


def _retention(d: Mapping[str, Any]) -> Retention:
    return Retention(_opt_int(d, "max_batches"), _opt_int(d, "max_bytes"), _opt_int(d, "max_age_ms"))


def _info(d: Mapping[str, Any]) -> StreamInfo:
    name = d["name"]
    if not isinstance(name, str):
        raise TypeError("name is not a string")
    return StreamInfo(
        name,
        _int(d, "first_seq"),
        _int(d, "last_seq"),
        _int(d, "evicted_through"),
        _int(d, "batches"),
        _int(d, "bytes"),
        _retention(d["retention"]),
    )


def _read(d: Mapping[str, Any]) -> ReadAnswer:
    return ReadAnswer(
        [_batch(b) for b in d["batches"]],
        None if d.get("gap") is None else _gap(d["gap"]),
        _int(d, "last_seq"),
        _int(d, "next_after"),
    )


_DECODERS: Dict[str, Any] = {
    "batch": _batch,
    "gap": _gap,
    "publish": lambda d: PublishAck(_int(d, "seq"), _int(d, "ts"), _bool(d, "duplicate"), _int(d, "index")),
    "frames": lambda d: FramesAck(
        _int(d, "first_seq"), _int(d, "last_seq"), _int(d, "count"), _int(d, "ts"), _int(d, "index"), _bool(d, "duplicate")
    ),
    "stream": _info,
    "streams": lambda d: [_info(s) for s in d["streams"]],
    "read": _read,
}
