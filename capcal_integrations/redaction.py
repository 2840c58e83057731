"""Credentials out of anything written down: logs, command lines recorded in reports, error messages.

A URL may carry a secret in its user-info (``http://user:secret@host``) or in a query parameter
(``?api_key=...``, ``?auth=``, ``?sig=``); a header dump in ``Authorization: bearer ...`` or ``x-api-key:``;
a dict's or a dataclass's rendering in an ``api_key`` field; a command line after ``--api-key``.
:func:`redact` replaces each with ``***`` in text, :func:`redact_url` in a URL, :func:`redact_value` in
a dumped structure (``model_dump``, ``to_dict``); :class:`RedactingFilter` does it to every record of a
logger, and hides every URL's whole query string (:func:`redact_queries`: a key under a name no list foresees,
``?k=sk-...``, shows in httpx's request lines otherwise); the CLI installs it, so ``-v``'s request lines never
show a password.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

__all__ = ["redact", "redact_url", "redact_value", "redact_argv", "redact_queries", "RedactingFilter"]

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/@\s?#]+)@")
_SECRET_NAMES = (r"api[_-]?key|apikey|key|token|access[_-]?token|refresh[_-]?token|id[_-]?token|auth|authorization"
                 r"|password|passwd|pwd|secret|client[_-]?secret|sig|signature|x-amz-signature|x-goog-signature"
                 r"|x-api-key|api-token|session[_-]?token|credential|credentials")
_QUERY_SECRET = re.compile(rf"(?P<key>[?&;](?:{_SECRET_NAMES})=)[^&\s#'\"]+", re.I)
_BEARER = re.compile(r"(?P<key>\b(?:Bearer|Basic|Token)\s+)[A-Za-z0-9._~+/=:-]{6,}", re.I)
#: ``x-api-key: K`` / ``api-key=K`` in a header dump, a log line or a command line (not in a URL query).
_HEADER_SECRET = re.compile(r"(?P<key>(?<![\w?&;-])(?:x-api-key|api-key|x-auth-token|proxy-authorization)\s*[:=]\s*)"
                            r"(?!Bearer\b|Basic\b|\*\*\*)[^\s,;&'\"}]+", re.I)
#: ``'api_key': 'K'`` (a dict's repr), ``"api_key": "K"`` (JSON), ``api_key='K'`` (a dataclass's repr).
_FIELD_NAMES = (r"[a-z_]*(?:api[_-]?key|apikey|access[_-]?token|auth[_-]?token|refresh[_-]?token|session[_-]?token|hf_token"
                r"|secret|password|passwd)|authorization|x-api-key|api-token|credentials?|signature")
_FIELD_SECRET = re.compile(rf"(?P<key>(?P<q>['\"]?)\b(?:{_FIELD_NAMES})(?P=q)\s*[:=]\s*)"
                           rf"(?P<v>'[^']*'|\"[^\"]*\"|b'[^']*')", re.I)
_SECRET_FLAGS = ("--api-key", "--token", "--password")
#: a URL's query string (after ``?``, up to a fragment, a space or a quote)
_URL_QUERY = re.compile(r"(?P<url>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s?#'\"<>]+)\?(?!\*\*\*)[^\s#'\"<>]+")


def _field(m: re.Match[str]) -> str:
    value = m["v"]
    if value in ("''", '""', "None") or value[1:-1] == "***":
        return m[0]
    quote = value[-1]
    return m["key"] + value[: len(value) - len(value.lstrip("b"))] + quote + "***" + quote


def redact(text: str) -> str:
    """``text`` with URL credentials, secret query parameters, bearer tokens, API-key headers and secret
    fields of a dict's, JSON's or dataclass's rendering replaced by ``***``.

    >>> redact("POST http://bob:hunter2@10.0.0.5:8000/v1/completions?api_key=abc&x=1 done")
    'POST http://***@10.0.0.5:8000/v1/completions?api_key=***&x=1 done'
    >>> redact("Authorization: Bearer sk-abcdefghijkl"), redact("authorization: bearer sk-abcdefghijkl")
    ('Authorization: Bearer ***', 'authorization: bearer ***')
    >>> redact("x-api-key: sk-123456 next"), redact("https://h/v1?auth=abc&sig=def#f")
    ('x-api-key: *** next', 'https://h/v1?auth=***&sig=***#f')
    >>> redact("{'api_key': 'sk-1', 'model': 'm'}"), redact('{"api_key": "sk-1"}'), redact("Settings(api_key='sk-1')")
    ("{'api_key': '***', 'model': 'm'}", '{"api_key": "***"}', "Settings(api_key='***')")
    """
    text = _USERINFO.sub(lambda m: m["scheme"] + "***@", text)
    text = _QUERY_SECRET.sub(lambda m: m["key"] + "***", text)
    text = _BEARER.sub(lambda m: m["key"] + "***", text)
    text = _HEADER_SECRET.sub(lambda m: m["key"] + "***", text)
    return _FIELD_SECRET.sub(_field, text)


def redact_url(url: str) -> str:
    """A URL safe to show: its user-info and secret query parameters replaced (what a ``repr`` or a dump of
    a ``base_url`` shows).

    >>> redact_url("http://user:pw@host:8000/v1?api_key=k&x=1")
    'http://***@host:8000/v1?api_key=***&x=1'
    """
    return _QUERY_SECRET.sub(lambda m: m["key"] + "***", _USERINFO.sub(lambda m: m["scheme"] + "***@", url))


def redact_value(value: object) -> object:
    """``value`` with every string in it (through dicts, lists and tuples) :func:`redact`-ed, and the value of
    every key that names a secret (``api_key``, ``token``, ``password``, ...) replaced by ``***``: for
    ``model_dump``, ``to_dict`` and ``dumpd`` outputs.

    >>> redact_value({"base_url": "http://u:p@h/v1", "api_key": "sk-1", "n": 3, "h": {"x-api-key": "k"}})
    {'base_url': 'http://***@h/v1', 'api_key': '***', 'n': 3, 'h': {'x-api-key': '***'}}
    """
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: ("***" if isinstance(k, str) and _secret_name(k) and v not in (None, "") else redact_value(v))
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(v) for v in value)
    return value


def _secret_name(name: str) -> bool:
    return bool(re.fullmatch(_FIELD_NAMES, name, re.I))


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


def redact_queries(text: str) -> str:
    """``text`` with the query string of every URL in it replaced by ``***`` (whatever its parameters are named).

    >>> redact_queries('HTTP Request: POST http://h:8000/v1/completions?k=sk-1&x=2 "HTTP/1.1 200 OK"')
    'HTTP Request: POST http://h:8000/v1/completions?*** "HTTP/1.1 200 OK"'
    """
    return _URL_QUERY.sub(lambda m: m["url"] + "?***", text)


class RedactingFilter(logging.Filter):
    """A logging filter that renders each record's message, :func:`redact`-s it and hides its URLs' query strings
    (:func:`redact_queries`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_queries(redact(message))
        if clean != message:
            record.msg, record.args = clean, None
        return True
