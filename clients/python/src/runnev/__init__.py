"""Python client for Runnev, a Raft-replicated log service.

``Client`` (blocking) and ``AsyncClient`` (asyncio) talk to a list of nodes with failover;
``publish`` with a seq is retried safely, without one it raises ``UnknownOutcome`` rather than
risk storing a batch twice; ``subscribe`` yields ``Batch`` and ``Gap`` items across node
failures; ``FileCursor`` keeps a consumer's cursor. The rules are those of docs/http-api.md and
the Rust client (src/client/).
"""

from ._core import Delivery, RetryPolicy
from .aio import AsyncClient, AsyncSubscription
from .client import Client, Subscription
from .cursor import FileCursor
from .errors import (
    ApiError,
    ConfigError,
    Forbidden,
    Internal,
    InvalidBody,
    InvalidParameter,
    InvalidSeq,
    InvalidStreamName,
    NotFound,
    PartialDuplicate,
    PayloadTooLarge,
    ProtocolError,
    RunnevError,
    SeqConflict,
    SeqEvicted,
    SeqNotIncreasing,
    StorageFull,
    StreamNotFound,
    TlsError,
    Unauthorized,
    Unavailable,
    UnknownOutcome,
    Unreachable,
)
from .models import Batch, FramesAck, Gap, PublishAck, ReadAnswer, Retention, StreamInfo

__all__ = [
    "ApiError",
    "AsyncClient",
    "AsyncSubscription",
    "Batch",
    "Client",
    "ConfigError",
    "Delivery",
    "FileCursor",
    "Forbidden",
    "FramesAck",
    "Gap",
    "Internal",
    "InvalidBody",
    "InvalidParameter",
    "InvalidSeq",
    "InvalidStreamName",
    "NotFound",
    "PartialDuplicate",
    "PayloadTooLarge",
    "ProtocolError",
    "PublishAck",
    "ReadAnswer",
    "Retention",
    "RetryPolicy",
    "RunnevError",
    "SeqConflict",
    "SeqEvicted",
    "SeqNotIncreasing",
    "StorageFull",
    "StreamInfo",
    "StreamNotFound",
    "Subscription",
    "TlsError",
    "Unauthorized",
    "Unavailable",
    "UnknownOutcome",
    "Unreachable",
]
