"""The ``capcal`` command: ``serve``, ``key``, ``rerank``, ``tune``, ``demo``, ``decide``, ``label``, ``status``, ``eval``
and ``testbed``.

With no ``--base-url`` (and no ``$CAPCAL_BASE_URL``), ``rerank``, ``tune`` and ``demo`` reuse the server
your ``capcal serve`` runs on 127.0.0.1:8080 (once it has proved it is that one: see
``capcal_integrations/server/ownership.py``), else start the embedded one for the duration of the
command; either way they send that server its own key, never ``$OPENAI_API_KEY``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TextIO

from ..calibration.formulas import FORMS
from ..errors import KEY_HINT, CapCalError, EndpointError, InputError, SetupError
from ..redaction import RedactingFilter, redact
from ..reranker import CapCalReranker
from ..server.command import add_serve_parser, serve_command
from .decide import add_parser as add_decide_parser
from .decide import read_triples
from .decide import run as run_decide
from .demo import run as run_demo
from .flags import add_endpoint_options, add_input_options, alphas, options_from_args
from .rerank import read_requests
from .rerank import run as run_rerank

if TYPE_CHECKING:
    from ..server import Endpoint

log = logging.getLogger("capcal")


def _out(text: str = "", stream: TextIO | None = None) -> None:
    (stream or sys.stdout).write(text + "\n")


def _reranker(args: argparse.Namespace, found: Endpoint) -> CapCalReranker:
    """The reranker for ``found`` (a :class:`~.server.Endpoint`): a local server gets its own key; an
    endpoint the user named gets ``--api-key`` (None: the environment's key of that URL's own pair, as
    :func:`~.client.resolve_endpoint` pairs them)."""
    url, model = found
    return CapCalReranker(base_url=url, model=args.model_name or model, api_key=found.api_key or args.api_key,
                          **options_from_args(args))


def _endpoint(args: argparse.Namespace) -> contextlib.AbstractContextManager[Endpoint]:
    from ..server import endpoint

    if args.api_key and not (args.base_url or os.environ.get("CAPCAL_BASE_URL")):
        raise InputError("--api-key is the key of the --base-url endpoint; a local server found or started "
                         "without --base-url is sent its own key")
    return endpoint(args.base_url, args.model, engine=args.engine, hosted=getattr(args, "hosted", False))


# --------------------------------------------------------------------------- rerank


@contextlib.contextmanager
def _connected(args: argparse.Namespace) -> Iterator[CapCalReranker]:
    """The reranker of the endpoint ``args`` name (or of the local server found or started), while it is up."""
    with _endpoint(args) as found:
        yield _reranker(args, found)


def cmd_rerank(args: argparse.Namespace) -> int:
    return run_rerank(args, lambda: _connected(args), options_from_args(args))


# --------------------------------------------------------------------------- tune


def cmd_tune(args: argparse.Namespace) -> int:
    from ..tuning import DEFAULT_ALPHAS, choose_alpha

    requests = read_requests(args)
    alphas = args.alphas or DEFAULT_ALPHAS
    with _endpoint(args) as found:
        rr = _reranker(args, found)
        _out(f"capcal tune: {len(requests)} lists x {args.shuffles} shuffles, one decoding step each...", sys.stderr)
        choice = choose_alpha(rr, [(r["query"], r["passages"]) for r in requests], alphas=alphas,
                              shuffles=args.shuffles, seed=options_from_args(args).get("seed", 0), form=args.form)
    _out(json.dumps({"alpha": choice.alpha, "form": choice.form, "tau_by_alpha": choice.curve,
                     "queries": choice.queries, "shuffles": choice.shuffles, "requests": choice.usage.requests,
                     "weak": choice.weak}))
    _out(f"use: --alpha {choice.alpha:g}" + (" --calibration log" if choice.form == "log" else ""), sys.stderr)
    return 0


# --------------------------------------------------------------------------- demo


def cmd_demo(args: argparse.Namespace) -> int:
    with _endpoint(args) as found:
        return run_demo(_reranker(args, found), forcing="guard" not in options_from_args(args))


# --------------------------------------------------------------------------- key


def cmd_decide(args: argparse.Namespace) -> int:
    triples = read_triples(args)  # a malformed file fails before a server starts
    with _endpoint(args) as found:
        return run_decide(args, _reranker(args, found), triples)


def cmd_key(args: argparse.Namespace) -> int:
    """Print the key of the server this user's ``capcal serve`` runs on ``--port`` (after the checks that it is
    that server), alone on stdout: ``export CAPCAL_API_KEY=$(capcal key)``; ``--url``: its base URL instead
    (``export CAPCAL_BASE_URL=$(capcal key --url)``)."""
    from ..server.launcher import DEFAULT_PORT
    from ..server.ownership import NotOurs, check_own_server

    port = args.port or DEFAULT_PORT
    try:
        record = check_own_server(port)
    except NotOurs as why:
        raise InputError(f"no capcal serve of yours found on port {port} ({why}); start one with `capcal serve"
                         f"{'' if port == DEFAULT_PORT else f' --port {port}'}`") from None
    _out(f"http://127.0.0.1:{port}/v1" if args.url else record.api_key)
    return 0


# --------------------------------------------------------------------------- main


DESCRIPTION = "Position-bias-calibrated LLM listwise reranking (CapCal) from the command line."
EPILOG = """examples:
  capcal serve                      # the embedded model on 127.0.0.1:8080 (prints where its key is)
  export CAPCAL_API_KEY=$(capcal key)
  capcal rerank --query "how long do fleas live" --passages passages.txt --top-n 3
  capcal demo

-v (--verbose) goes before or after the command."""


def _at_least_one(text: str) -> int:
    """``--top-n``: an integer >= 1 (argparse exits 2 with this message otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of passages, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (omit it to write every passage), got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="capcal", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log requests and decisions")
    sub = parser.add_subparsers(dest="command", required=True)

    add_serve_parser(sub)

    p = sub.add_parser("key", help="print the API key of your running capcal serve (export CAPCAL_API_KEY=$(capcal key))")
    p.add_argument("--port", type=int, default=None, help="the port capcal serve listens on (default 8080)")
    p.add_argument("--url", action="store_true", help="print its base URL instead (export CAPCAL_BASE_URL=$(capcal key "
                                                      "--url))")

    p = sub.add_parser("rerank", help="rerank passages from a file or JSONL; JSONL out")
    add_input_options(p)
    p.add_argument("--output", help="write JSONL here instead of stdout")
    p.add_argument("--top-n", type=_at_least_one, default=None,
                   help="write the best N passages; only that many places are decoded (the --depth option; default: all)")
    p.add_argument("--workers", type=int, default=None,
                   help="batch on Ray: this many workers (default: one per --base-url; several comma-separated "
                        "--base-url also start a batch), each bound to one endpoint; --output is appended to and a "
                        "stopped run resumes where it stopped (needs the ray extra; behind a router: --routed true)")
    add_endpoint_options(p)

    p = sub.add_parser("tune", help="choose alpha without labels: the most shuffle-consistent strength (JSON out)")
    add_input_options(p)
    p.add_argument("--shuffles", type=int, default=4, help="random orders per list (default 4)")
    p.add_argument("--alphas", default=None, type=alphas, help="comma-separated strengths to try (default 0,0.25,...,2)")
    p.add_argument("--form", default=None, choices=FORMS, help="calibration form (default additive)")
    add_endpoint_options(p)

    p = sub.add_parser("demo", help="one real query: what the default does, then vanilla vs CapCal forced, with the "
                                    "empty-prompt prior")
    p.add_argument("--hosted", action="store_true",
                   help="show the embedded model as a hosted chat-only API (no assistant prefill, top_logprobs <= 20, "
                        "no tokenizer routes): method auto then runs first-token-capcal")
    add_endpoint_options(p)

    add_decide_parser(sub, add_endpoint_options)

    for command in sub.choices.values():  # -v after the command too (its default does not hide one given before)
        command.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                             help="log requests and decisions")

    sub.add_parser("eval", help="evaluate methods on a benchmark (see: capcal eval --help)", add_help=False)
    sub.add_parser("label", help="grade retrieved passages on a local page (see: capcal label --help)", add_help=False)
    sub.add_parser("testbed", help="measure the methods on the simulated reranker (see: capcal testbed --help)",
                   add_help=False)
    sub.add_parser("status", help="each content decision kept and each check still deciding (what the default does "
                                  "per model)", add_help=False)
    sub.add_parser("decisions", help="the same as status; decisions forget ID|--all deletes", add_help=False)
    return parser


def _exit_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so a server started for the command is stopped on the way out."""
    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


def _setup_logging(verbose: bool, fmt: str) -> None:
    """Log to stderr; every handler redacts credentials (``-v`` logs request URLs, which may carry them)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format=fmt)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


def _subcommand(name: str) -> Callable[[list[str]], int]:
    """The ``main(argv)`` of a command with its own parser, imported only when run."""
    if name == "eval":
        from ..evaluation.command import main as eval_main

        return eval_main
    if name == "label":
        from .label import main as label_main

        return label_main
    if name in ("decisions", "status"):
        from .decisions import main as decisions_main

        return lambda argv: decisions_main(argv, prog=f"capcal {name}")
    from ..testbed.command import main as testbed_main

    return testbed_main


CLI_KEY_HINT = ("the endpoint wants an API key: pass --api-key or set CAPCAL_API_KEY; for a `capcal serve` server, "
                "`capcal key` prints its key (`capcal key --port N` for one on another port)")


def _handled(run: Callable[[], int], verbose: bool) -> int:
    """``run()``'s status; a failure is one redacted line on stderr (exit 1), an interruption exit 130."""
    try:
        return run()
    except CapCalError as err:
        text = str(err)
        if isinstance(err, EndpointError) and err.status in (401, 403):  # the command line's own words for the key
            text = text.replace(KEY_HINT, CLI_KEY_HINT)
        _out(f"capcal: error: {redact(text)}", sys.stderr)
        if isinstance(err, SetupError) and err.details:
            _out(redact(err.details) if verbose else "(run with -v for details)", sys.stderr)
        return 1
    except OSError as err:
        _out(f"capcal: error: {redact(str(err))}", sys.stderr)
        return 1
    except KeyboardInterrupt:
        _out("capcal: interrupted", sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    """Run the ``capcal`` command; returns the exit status. Every failure is one line on stderr:
    ``capcal: error: ...`` (exit 1), an argument error (exit 2), or an interruption (exit 130)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _exit_on_sigterm()
    if argv[:1] in (["eval"], ["testbed"], ["decisions"], ["status"], ["label"]):  # commands with their own parsers
        verbose = "-v" in argv or "--verbose" in argv
        _setup_logging(verbose, "capcal: %(message)s")
        return _handled(lambda: _subcommand(argv[0])(argv[1:]), verbose)
    args = build_parser().parse_args(argv)
    _setup_logging(args.verbose, "%(name)s: %(message)s")
    logging.getLogger("capcal_integrations.server").setLevel(logging.INFO)  # say when a local server starts
    commands = {"serve": serve_command, "key": cmd_key, "rerank": cmd_rerank, "tune": cmd_tune, "demo": cmd_demo,
                "decide": cmd_decide}
    return _handled(lambda: commands[args.command](args), args.verbose)


if __name__ == "__main__":
    sys.exit(main())
