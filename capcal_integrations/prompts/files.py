"""What the library reads from disk: the files an option may name.

* ``prompt``: a format by name (:data:`.prompts.PROMPT_FORMATS`) or a model's chat template file (its
  ``tokenizer_config.json`` or a Jinja file): the option checked, a prompt rendered in it, the special tokens the
  file declares;
* ``decision``: a saved content-check decision, as JSON text or a file holding it (:func:`option_text`).

The prompt formats themselves are :mod:`.prompts` and the decision :mod:`.content_check`; neither reads a file."""

from __future__ import annotations

import functools
import json
import pathlib
from collections.abc import Callable

from ..errors import InputError, MissingExtra
from .render import PROMPT_FORMATS, Messages

__all__ = ["check_prompt", "prompt_text", "jinja_template", "declared_tokens", "option_text"]


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
        return pathlib.Path(raw).read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(f"cannot read {what} from {raw!r}: {err}") from None
