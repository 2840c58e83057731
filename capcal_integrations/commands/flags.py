"""The flags the ``capcal`` commands share: the endpoint (``--base-url``, ``--api-key``, ``--model``,
``--engine``), the lists to work on (``--query``/``--passages`` or ``--input``), one ``--flag`` per ranking
option (:data:`~.options.OPTION_NAMES`, parsed and checked by :meth:`~.options.Options.parse`) and
``--alphas``."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import InputError
from ..options import OPTION_FIELDS, OPTION_NAMES, Options
from ..prompts.render import PromptTemplate
from ..server.net import ENGINES

__all__ = ["add_option_flags", "options_from_args", "add_endpoint_options", "add_input_options", "alphas"]


def add_option_flags(parser: argparse.ArgumentParser, only: tuple[str, ...] = OPTION_NAMES) -> None:
    """One ``--flag`` per option (default: the library's), parsed and checked by :meth:`Options.parse`."""
    group = parser.add_argument_group("ranking options")
    for name in only:
        f = OPTION_FIELDS[name]

        def convert(raw: str, name: str = name) -> Any:
            try:
                return Options.parse(name, raw)
            except InputError as err:
                raise argparse.ArgumentTypeError(str(err)) from None

        default = f.default.name if isinstance(f.default, PromptTemplate) else f.default
        group.add_argument("--" + name.replace("_", "-"), dest=name, type=convert, default=_UNSET,
                           choices=f.metadata["choices"] or None, help=f"{f.metadata['doc']} (default: {default})")


_UNSET = object()  # not given on the command line (``--guard none`` gives None)


def options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The options given on the command line (those left unset keep the library's defaults)."""
    return {name: getattr(args, name) for name in OPTION_NAMES if getattr(args, name, _UNSET) is not _UNSET}


def add_endpoint_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080/v1 (default: "
                                      "$CAPCAL_BASE_URL, else the server your `capcal serve` runs on 127.0.0.1:8080, "
                                      "else the embedded one)")
    p.add_argument("--api-key", default=None,
                   help="key for the --base-url endpoint (default: $CAPCAL_API_KEY if it is $CAPCAL_BASE_URL, "
                        "$OPENAI_API_KEY if it is $OPENAI_BASE_URL: a key goes only with its own URL); a local "
                        "server found or started without --base-url is always sent its own key")
    p.add_argument("--model", default=None,
                   help="the model: with --base-url, the name to ask the endpoint for (default: the first it lists); "
                        "without, the embedded model to use (0.5b, the default; 1.5b, smollm2): a running capcal serve "
                        "is reused only if it serves this model (the same meaning as in capcal eval)")
    p.add_argument("--engine", choices=ENGINES, default=ENGINES[0],
                   help="engine of the embedded server started when no endpoint is given (default llamacpp)")
    p.add_argument("--model-name", default=None, help=argparse.SUPPRESS)  # before --model meant both: kept working
    add_option_flags(p)


def add_input_options(p: argparse.ArgumentParser) -> None:
    """The lists to work on, read by :func:`~.rerank_command.read_requests`."""
    p.add_argument("--query", help="the query (with --passages)")
    p.add_argument("--passages", help="file with one passage per line (or JSONL objects with 'text')")
    p.add_argument("--input", help="JSONL with {'query': ..., 'passages': [...]} per line ('-' for stdin)")


def alphas(text: str) -> tuple[float, ...]:
    try:
        alphas = tuple(float(a) for a in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if any(a < 0 for a in alphas):
        raise argparse.ArgumentTypeError(f"strengths must be >= 0, got {text!r}")
    return alphas
