"""What the library reads from disk: the files an option may name.

* ``prompt``: a format by name (:data:`.prompts.PROMPT_FORMATS`) or a model's chat template file (its
  ``tokenizer_config.json`` or a Jinja file): the option checked, a prompt rendered in it, the special tokens the
  file declares;
* ``decision``: a saved content-check decision, as JSON text or a file holding it (:func:`option_text`).

Files that are input, not trust (the ``decision`` option's, the decisions folder's: :mod:`.content_check.saved_decisions`)
are read by :func:`read_untrusted`: only a regular file, opened without blocking (a FIFO or a device is refused before
a byte is read), a bounded number of bytes, decoded with its errors caught.

The prompt formats themselves are :mod:`.prompts` and the decision :mod:`.content_check`; neither reads a file."""

from __future__ import annotations

import errno
import functools
import json
import os
import pathlib
import stat
from collections.abc import Callable

from ..errors import InputError, MissingExtra
from .render import PROMPT_FORMATS, Messages

__all__ = ["check_prompt", "prompt_text", "jinja_template", "declared_tokens", "option_text", "read_untrusted",
           "not_yours", "DECISION_BYTES"]

#: The most bytes a saved decision is read to (one is ~2 KiB; a larger file is not a decision).
DECISION_BYTES = 1 << 20


def check_prompt(style: str) -> None:
    """An :class:`~.errors.InputError` unless ``style`` is ``"chat"``, a :data:`PROMPT_FORMATS` name or
    the path of a chat template file (a ``tokenizer_config.json`` with ``chat_template``, or a Jinja file)."""
    if style != "chat" and style not in PROMPT_FORMATS and not pathlib.Path(style).is_file():
        raise InputError(f"unknown prompt {style!r}; choose chat, {', '.join(PROMPT_FORMATS)}, or the path of the "
                         "model's tokenizer_config.json (or a .jinja chat template)")


def prompt_text(messages: Messages, style: str) -> str:
    """The messages as one text prompt in ``style``: a :data:`PROMPT_FORMATS` name, or the path of the
    model's chat template (:func:`jinja_template`).

    >>> prompt_text((("system", "S"), ("user", "U")), "chatml")
    '<|im_start|>system\\nS<|im_end|>\\n<|im_start|>user\\nU<|im_end|>\\n<|im_start|>assistant\\n'
    """
    return (PROMPT_FORMATS.get(style) or jinja_template(style))(messages)


@functools.lru_cache(maxsize=16)
def jinja_template(path: str) -> Callable[[Messages], str]:
    """The chat template of a ``tokenizer_config.json`` (its ``chat_template``; the ``"default"`` one of
    a list) or of a Jinja file, rendered as ``transformers`` does, with ``add_generation_prompt`` and
    an empty ``bos_token`` (the server adds BOS to a text prompt itself). Needs ``jinja2``
    (the ``templates`` extra)."""
    try:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise MissingExtra("jinja2", "templates") from None
    file = pathlib.Path(path)
    text = file.read_text(encoding="utf-8")
    config = json.loads(text) if file.suffix == ".json" else {"chat_template": text}
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates: the default one
        source = next((t.get("template") for t in source if t.get("name") == "default"), None)
    if not isinstance(source, str):
        raise InputError(f"{path} has no chat_template")

    def fail(message: str) -> None:
        raise InputError(f"the chat template of {path} refused the prompt: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = fail
    template = env.from_string(source)
    tokens = {k: v if isinstance(v, str) else (v or {}).get("content", "") for k, v in config.items()
              if k.endswith("_token")}
    return lambda messages: template.render(
        messages=[{"role": r, "content": c} for r, c in messages], add_generation_prompt=True,
        **{**tokens, "bos_token": ""})


@functools.lru_cache(maxsize=16)
def declared_tokens(style: str) -> tuple[str, ...]:
    """The special tokens a ``tokenizer_config.json`` given as ``prompt`` declares (its ``added_tokens_decoder``
    entries marked special, and its ``*_token`` fields); none for a built-in format."""
    file = pathlib.Path(style)
    if style in PROMPT_FORMATS or style == "chat" or file.suffix != ".json" or not file.is_file():
        return ()
    config = json.loads(file.read_text(encoding="utf-8"))
    added = config.get("added_tokens_decoder") or {}
    found = [t.get("content") for t in added.values() if isinstance(t, dict) and t.get("special")]
    found += [v if isinstance(v, str) else (v or {}).get("content") for k, v in config.items() if k.endswith("_token")]
    return tuple(sorted({t for t in found if isinstance(t, str) and len(t) > 1}))


def option_text(raw: str, what: str) -> str:
    """``raw`` if it is JSON text (starts with ``{``), else the text of the file it names, read afresh at every call
    (an :class:`~.errors.InputError` naming ``what`` if it cannot be read)."""
    if raw.lstrip().startswith("{"):
        return raw
    try:
        return read_untrusted(raw, DECISION_BYTES, follow=True)
    except FileNotFoundError as err:
        raise InputError(f"cannot read {what} from {raw!r}: {err}") from None
    except InputError as err:
        raise InputError(f"cannot read {what} from {raw!r}: {err}") from None


def not_yours(info: os.stat_result) -> str:
    """Why a file or folder with this ``stat`` is not the user's own (``""`` if it is): owned by another uid than
    the effective one, or writable by its group or by others (anyone who can write it can steer what is read).

    >>> not_yours(os.stat_result((0o100644, 0, 0, 1, os.geteuid(), 0, 0, 0, 0, 0)))
    ''
    >>> not_yours(os.stat_result((0o40777, 0, 0, 1, os.geteuid(), 0, 0, 0, 0, 0)))
    'writable by others (mode 0o777)'
    """
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        return f"owned by uid {info.st_uid}, not by you (uid {os.geteuid()})"
    if info.st_mode & 0o022:
        return f"writable by {'others' if info.st_mode & 0o002 else 'its group'} (mode {oct(stat.S_IMODE(info.st_mode))})"
    return ""


def read_untrusted(path: str | os.PathLike[str], limit: int, *, follow: bool = False, own: bool = False) -> str:
    """The text of the file ``path``, read as untrusted input: opened without blocking and (unless ``follow``)
    without following a symbolic link; then only a regular file (a FIFO, a device or a folder is refused before a
    byte is read); at most ``limit`` bytes, counted as read (``stat`` says 0 for ``/dev/zero``); decoded as UTF-8.
    ``own``: the file must also be the user's (:func:`not_yours`). A :class:`FileNotFoundError` when there is no
    file; an :class:`~.errors.InputError` saying what is wrong with it otherwise."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= 0 if follow else getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as err:
        if err.errno == errno.ELOOP and not follow:
            raise InputError("it is a symbolic link (not followed in this folder)") from None
        raise InputError(f"cannot read it ({err.strerror or err})") from None
    chunks: list[bytes] = []
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError("not a regular file (a named pipe, a device or a folder)")
        problem = not_yours(info) if own else ""
        if problem:
            raise InputError(problem)
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise InputError(f"larger than {limit} bytes")
    except OSError as err:
        raise InputError(f"cannot read it ({err.strerror or err})") from None
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"not UTF-8 text (byte {err.start})") from None
