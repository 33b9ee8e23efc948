"""Typed errors of the Runnev client.

Owns: the exception hierarchy, and the one mapping of a node's error body
``{"error": {"code", "message", "frame"?}}`` (docs/http-api.md, "Errors") to an exception class.
Must never: hide an unknown outcome behind a retryable error, or lose the server's code.
"""

from __future__ import annotations

import json
from typing import Dict, Optional, Type


class RunnevError(Exception):
    """Base of every error this client raises."""


class ConfigError(RunnevError):
    """The client was set up wrongly (an empty node list, a malformed address, a bad argument).
    Nothing was sent."""


class ProtocolError(RunnevError):
    """An answer did not have the shape docs/http-api.md gives it."""

    def __init__(self, node: str, what: str) -> None:
        super().__init__(f"unexpected answer from {node}: {what}")
        self.node = node
        self.what = what


class UnknownOutcome(RunnevError):
    """A publish without seq reached the cluster but its outcome is unknown: a timeout, a
    connection lost after the request left, or ``503`` with ``Runnev-Outcome: unknown``. It was
    not retried, because a retry without seq could store the batch twice. Publish with a seq to
    retry safely (a stored retry is answered ``duplicate: true``)."""

    def __init__(self, why: str) -> None:
        super().__init__(
            "the outcome is unknown: the batch may or may not be stored (not retried, as a publish "
            f"without seq is not idempotent; publish with a seq to retry safely): {why}"
        )
        self.why = why


class Unreachable(RunnevError):
    """No node answered at all before the deadline: every connection was refused (for
    ``RetryPolicy.unreachable_after``), or accepted and lost without an answer."""

    def __init__(self, nodes: list[str], after: float, last: str) -> None:
        super().__init__(f"no Runnev node reachable at {', '.join(nodes)} (tried for {after:.1f} s); last problem: {last}")
        self.nodes = nodes
        self.after = after
        self.last = last


class TlsError(RunnevError):
    """This client refused every node's TLS in a way no retry mends: a certificate not signed by
    the CA of ``ca_file``, not issued for the address dialed, or expired; or a node that answers
    TLS with plain HTTP. Raised after one try of each node (the client's ``ca_file`` or node list
    does not fit the cluster: waiting will not help)."""

    def __init__(self, node: str, why: str) -> None:
        super().__init__(f"TLS with {node} failed: {why}")
        self.node = node
        self.why = why


class Unavailable(RunnevError):
    """Nodes answered, but none took the request before the retry deadline (``503 no_leader`` or
    ``not_ready`` throughout)."""

    def __init__(self, after: float, last: str) -> None:
        super().__init__(f"the cluster did not take the request within {after:.1f} s: {last}")
        self.after = after
        self.last = last


class ApiError(RunnevError):
    """A node answered with an error body (docs/http-api.md, "Errors"). Not retried: retrying
    cannot change it. ``frame`` is set for an error about one frame of a frames publish (for
    ``partial_duplicate``, the first new frame); ``node`` is the node that answered (``None`` for
    a stream name refused here before anything was sent)."""

    def __init__(self, status: int, code: str, message: str, frame: Optional[int] = None, node: Optional[str] = None) -> None:
        where = f" from frame {frame}" if frame is not None else ""
        super().__init__(f"{code} ({status}){where}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.frame = frame
        self.node = node


class InvalidStreamName(ApiError):
    """``400 invalid_stream_name``; also raised before sending for a name that breaks the rule."""


class InvalidSeq(ApiError):
    """``400 invalid_seq``: a seq outside 1 to 2**64-2."""


class InvalidParameter(ApiError):
    """``400 invalid_parameter``."""


class InvalidBody(ApiError):
    """``400 invalid_body`` (for a frames body, ``frame`` names the malformed frame)."""


class Unauthorized(ApiError):
    """``401 unauthorized``: no token, or an unknown, deleted or wrong one."""


class Forbidden(ApiError):
    """``403 forbidden``: no grant of the token covers the request."""


class StreamNotFound(ApiError):
    """``404 stream_not_found``."""


class NotFound(ApiError):
    """``404 not_found``: no such path, member or token."""


class SeqConflict(ApiError):
    """``409 seq_conflict``: the seq holds a batch with a different payload."""


class SeqNotIncreasing(ApiError):
    """``409 seq_not_increasing``."""


class SeqEvicted(ApiError):
    """``409 seq_evicted``: the seq is at or below ``evicted_through`` and holds no batch."""


class PartialDuplicate(ApiError):
    """``409 partial_duplicate``: frames ``0..frame`` are stored, the rest new; nothing was
    written. Resend the frames from ``frame`` with ``seq + frame``."""


class PayloadTooLarge(ApiError):
    """``413 payload_too_large``."""


class StorageFull(ApiError):
    """``507 storage_full``."""


class Internal(ApiError):
    """``500 internal``: a fault of the node, never of the request."""


_BY_CODE: Dict[str, Type[ApiError]] = {
    "invalid_stream_name": InvalidStreamName,
    "invalid_seq": InvalidSeq,
    "invalid_parameter": InvalidParameter,
    "invalid_body": InvalidBody,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "stream_not_found": StreamNotFound,
    "not_found": NotFound,
    "seq_conflict": SeqConflict,
    "seq_not_increasing": SeqNotIncreasing,
    "seq_evicted": SeqEvicted,
    "partial_duplicate": PartialDuplicate,
    "payload_too_large": PayloadTooLarge,
    "storage_full": StorageFull,
    "internal": Internal,
}


def error_from_body(node: str, status: int, body: bytes) -> RunnevError:
    """The exception for an error answer: the class of its code (``ApiError`` for a code not
    listed above), or ``ProtocolError`` when the body is not an error body."""
    try:
        err = json.loads(body)["error"]
        code, message = err["code"], err["message"]
        frame = err.get("frame")
        if not isinstance(code, str) or not isinstance(message, str):
            raise TypeError("code and message must be strings")
        if frame is not None and not isinstance(frame, int):
            raise TypeError("frame must be an integer")
    except (ValueError, KeyError, TypeError) as e:
        text = body.decode("utf-8", "replace").strip()
        return ProtocolError(node, f"status {status} with body {text!r} ({e})")
    cls = _BY_CODE.get(code, ApiError)
    return cls(status, code, message, frame, node)


def unavailable_text(node: str, body: bytes) -> str:
    """The words for a ``503`` answer: its code and message in a sentence, never its JSON."""
    e = error_from_body(node, 503, body)
    if isinstance(e, ApiError):
        if e.code == "no_leader":
            return f"no leader: a majority of nodes is down or partitioned ({node} said: {e.message})"
        if e.code == "not_ready":
            return f"not ready ({node} said: {e.message})"
        return f"{e.code} ({node} said: {e.message})"
    return f"{node} answered 503: {body.decode('utf-8', 'replace').strip()}"
