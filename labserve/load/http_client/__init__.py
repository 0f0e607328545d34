"""The load generators' HTTP/1.1 client: one keep-alive pool, two ways to read a reply.

:mod:`~labserve.load.http_client.endpoint` (a URL read once, a request's bytes made once),
:mod:`~labserve.load.http_client.connection` (one connection: it frames each reply for the
request's reader), :mod:`~labserve.load.http_client.pool` (the keep-alive pool both load
generators use) and :mod:`~labserve.load.http_client.reply` (the whole-reply reader of
request batching; the streamed generation's reader is
:class:`~labserve.load.generation.stream.CompletionStream`). Why a client of labserve's own
and not a library: the README's "Load over HTTP".
"""

from labserve.load.http_client.connection import ReplyReader
from labserve.load.http_client.endpoint import Endpoint, request_bytes
from labserve.load.http_client.pool import ConnectionPool
from labserve.load.http_client.reply import Reply, WholeReply, outcome_of_status

__all__ = [
    "ConnectionPool",
    "Endpoint",
    "Reply",
    "ReplyReader",
    "WholeReply",
    "outcome_of_status",
    "request_bytes",
]
