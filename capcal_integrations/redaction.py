"""Credentials out of anything written down: logs, command lines recorded in reports, error messages.

A URL may carry a secret in its user-info (``http://user:secret@host``) or in a query parameter
(``?api_key=...``); a command line may carry one after ``--api-key``. :func:`redact` replaces each
with ``***``; :class:`RedactingFilter` does it to every record of a logger (the CLI installs it, so
``-v``'s request lines never show a password).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

__all__ = ["redact", "redact_argv", "RedactingFilter"]

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/@\s]+)@")
_QUERY_SECRET = re.compile(r"(?P<key>[?&](?:api[_-]?key|key|token|access_token|password|secret)=)[^&\s#]+", re.I)
_BEARER = re.compile(r"(?P<key>\b(?:Bearer|Basic)\s+)[A-Za-z0-9._~+/=-]{8,}")
_SECRET_FLAGS = ("--api-key", "--token", "--password")


def redact(text: str) -> str:
    """``text`` with URL credentials, secret query parameters and bearer tokens replaced by ``***``.

    >>> redact("POST http://bob:hunter2@10.0.0.5:8000/v1/completions?api_key=abc&x=1 done")
    'POST http://***@10.0.0.5:8000/v1/completions?api_key=***&x=1 done'
    >>> redact("Authorization: Bearer sk-abcdefghijkl")
    'Authorization: Bearer ***'
    """
    text = _USERINFO.sub(lambda m: m["scheme"] + "***@", text)
    text = _QUERY_SECRET.sub(lambda m: m["key"] + "***", text)
    return _BEARER.sub(lambda m: m["key"] + "***", text)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line safe to record: every argument :func:`redact`-ed, and the value of ``--api-key``
    (``--api-key K`` or ``--api-key=K``) replaced.

    >>> redact_argv(["eval", "--base-url", "http://u:p@h/v1", "--api-key", "sk-1", "--token=t"])
    ['eval', '--base-url', 'http://***@h/v1', '--api-key', '***', '--token=***']
    """
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        flag = arg.split("=", 1)[0]
        if flag in _SECRET_FLAGS:
            if "=" in arg:
                out.append(flag + "=***")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact(arg))
    return out


class RedactingFilter(logging.Filter):
    """A logging filter that renders each record's message and :func:`redact`-s it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True
