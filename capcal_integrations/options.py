"""The ranking options, declared once.

:class:`Options` is the single schema: each field carries its documentation and its parser from a
string in its metadata. Everything else is derived from it: the keyword arguments of
:class:`~capcal_integrations.CapCalReranker` and its ``with_options``, the adapters' pydantic settings
(:mod:`.adapter`), the ``capcal`` command-line flags (:mod:`.cli`) and the method specs of
``capcal eval`` (``capcal:alpha=1.0,probability=trie``). A new option is one new field here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .calibration.formulas import FORMS
from .content_check.rules import guard_value
from .endpoints.routing import check_header
from .errors import InputError
from .option_values import (
    is_finite,
    is_whole,
    parse_alpha,
    parse_bool,
    parse_guard,
    parse_int,
    parse_optional_float,
    parse_optional_int,
    parse_optional_str,
)
from .prompts.files import check_prompt
from .prompts.render import (
    DEFAULT_PLACEHOLDER,
    RANK_ZEPHYR,
    RELEASE_PLACEHOLDER,
    TEMPLATES,
    PromptTemplate,
    labels,
    resolve_template,
)
from .types import Method  # re-exported: options.Method, as before

__all__ = ["Options", "Method", "METHOD_TABLE", "METHODS", "CALIBRATED_METHODS", "OPTION_NAMES", "PRESETS", "option_docs"]

#: Every ranking method of the engine, by name (the one table). ``auto`` runs ``capcal`` where the endpoint can
#: continue an assistant prefix and ``first-token-capcal`` where it cannot (hosted chat APIs).
METHOD_TABLE = {m.name: m for m in (
    Method("auto", calibrated=True), Method("capcal", calibrated=True),
    Method("vanilla", calibrated=False, answers_suffice=True),
    Method("first-token", calibrated=False, first_only=True), Method("first-token-capcal", calibrated=True, first_only=True),
    Method("psc", calibrated=False, answers_suffice=True, shuffles=True))}
METHODS = tuple(METHOD_TABLE)
#: The methods that run the content-free prompt and calibrate against it.
CALIBRATED_METHODS = frozenset(name for name, m in METHOD_TABLE.items() if m.calibrated)


#: Named bundles of options. ``release`` reproduces the CapCal authors' code (GitHub
#: ``USTC-StarTeam/CapCal``, ``LLMExp_StateMachine`` / ``LLMExp_DynamicBias``) for a 1:1 comparison:
#: its prompt as raw text, its placeholder, its decoding quirks and raw joint probabilities.
#: ``method`` and ``alpha`` still choose vanilla, a fixed rate or the adaptive rule.
PRESETS: dict[str, dict[str, Any]] = {
    "release": {"template": "capcal", "prompt": "raw", "decoding": "release", "normalise": False,
                "placeholder": RELEASE_PLACEHOLDER, "probability": "joint", "labels": "numeric",
                "max_passage_words": None, "guard": None, "alpha": "adaptive"},
}


def _option(default: Any, doc: str, parse: Callable[[str], Any] = str, choices: tuple[str, ...] = (),
            accepts: Any = None) -> Any:
    """A field of :class:`Options` with its documentation, string parser and (for the adapters'
    pydantic model) the type of the values it accepts, when wider than what it stores."""
    meta = {"doc": doc, "parse": parse, "choices": choices, "accepts": accepts}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Options:
    """Everything that decides how a list is ranked, validated on construction.

    >>> Options(method="vanilla", template="rank_gpt").template.name
    'rank_gpt'
    >>> Options(window=1)
    Traceback (most recent call last):
    ...
    capcal_integrations.errors.InputError: need window >= 2 and 1 <= stride <= window, got 1/10
    """

    preset: str | None = _option(None, "Apply a named bundle of options first ('release': the CapCal authors' code, "
                                 "quirks included); options given with it win.", parse_optional_str, tuple(PRESETS))
    method: str = _option("auto", "Ranking method: auto (capcal where the endpoint can continue an assistant prefix, "
                          "else first-token-capcal) | capcal | vanilla | first-token | first-token-capcal | psc.",
                          choices=METHODS)
    alpha: float | str = _option("auto", "'auto' (chosen label-free on the queries that decide the content check: the "
                                 "strength whose calibrated rankings of one list read in four orders agree most; 1 "
                                 "without the check), 'adaptive' (the released rule min(5 H / log|C|, 2)) or a fixed "
                                 "calibration strength >= 0.", parse_alpha)
    guard: str | None = _option(
        "query", "Whether the calibrated methods calibrate at all: the content rule that decides it ("
        "capcal_integrations.content_check.rules), once per model and reading options over the queries ranked, off the "
        "request path; until it decides, and for a model that does not read, every list keeps its given order. "
        "'query': each query's top window read "
        "at the first step in four orders (six under 20 passages), with the query and again without it; a sequential "
        "test on what the query adds, centred over the list's passage pairs, says 'reads', 'does not read' or 'cannot tell' "
        "(a taste only labels tell from reading: given order kept) as soon as the evidence is strong, "
        "at most check_lists queries (a model's preferences of its own cancel, and so does a query effect alike in every "
        "pair, such as a lift of the retriever's top half; docs/content-check.md). 'content': the four orders with the "
        "query only (half the deciding prompts; passes a model with consistent preferences that lean the retriever's "
        "way). None: always calibrate. A number (the retired per-list guard) is read as 'query', with a "
        "FutureWarning.", parse_guard)
    check_lists: int = _option(40, "The most queries the content check reads (guard='query' or 'content'); a check "
                               "still undecided then says 'does not read (undecided)'.", parse_int)
    check_wait: bool = _option(False, "Take the content check's readings inside the ranking (the list waits for them, "
                               "and is ranked by the decision if it decides) instead of in the background: for batch jobs "
                               "that want every list ranked by a decision taken in input order.", parse_bool)
    decision: str | None = _option(None, "A saved content-check decision (the JSON of "
                                   "reranker.content_decision().to_json(), or a file holding it), so that a new process "
                                   "ranks without deciding again; used where the model, its weights and the reading "
                                   "options match (else a warning, and decided afresh).", parse_optional_str)
    calibration: str = _option("additive", "'additive' (the paper's p - alpha (q - 1/|C|)) or 'log' "
                               "(log p - alpha log q).", choices=FORMS)
    normalise: bool = _option(True, "Renormalise p and q over the identifiers still allowed before calibrating "
                              "(True), or calibrate the raw joint probabilities as the release does (False; "
                              "needs probability='joint').", parse_bool)
    placeholder: str = _option(DEFAULT_PLACEHOLDER, "Passage body of the content-free prompt ('' allowed).")
    template: PromptTemplate = _option(RANK_ZEPHYR, "Prompt: 'rank_zephyr', 'rank_gpt', 'capcal' (the release's), "
                                       "'no_example' (no example ranking to copy) or a PromptTemplate.",
                                       choices=tuple(TEMPLATES), accepts=str | PromptTemplate)
    prompt: str = _option("chat", "'chat' (the server applies the model's chat template), 'raw' (plain text with "
                          "<|system|>/<|user|>/<|assistant|> tags, as the release sends it), or a chat format rendered "
                          "here for completions endpoints without one: 'chatml', 'llama3', 'gemma', or the path of the "
                          "model's tokenizer_config.json (all but 'chat' need /v1/completions).")
    decoding: str = _option("exact", "'exact' (identifiers as the model spells them, ' [3] > [5] > [') or 'release' "
                            "(the release's '[3]>[5]>[', a second '[' fed before each digit is scored, no "
                            "closing ']' for identifiers from 10).", choices=("exact", "release"))
    labels: str = _option("numeric", "Identifiers: 'numeric' ([1]..) or 'alpha' ([A].., at most 26 per window).",
                          choices=("numeric", "alpha"))
    probability: str = _option("joint", "'joint' (exact joint label probability) or 'trie' (renormalised at "
                               "every branching token; cheaper).", choices=("joint", "trie"))
    window: int = _option(20, "Sliding-window size for long lists.", parse_int)
    stride: int = _option(10, "Sliding-window stride.", parse_int)
    depth: int | None = _option(None, "Places to decode, best first (None: all). The passages below follow the last "
                                "decoded step's scores and are marked undecoded (Ranking.decoded, details()); the "
                                "first places are those of the full decoding. With a sliding window the top window "
                                "decodes to the depth and lower windows only what they pass up; psc decodes each "
                                "shuffle to it. The adapters default it to top_n.", parse_optional_int)
    deadline: float | None = _option(None, "Seconds a ranking may take (None: no limit). When it passes, in-flight "
                                     "requests are abandoned (their connections closed: the server stops them) and "
                                     "the places decided so far are returned, the rest in first-stage order "
                                     "(Ranking.partial, a note). A list of several windows keeps time for its top "
                                     "window: lower windows stop once less than twice the slowest is left (a note). "
                                     "The client's retries are off under a deadline.",
                                     parse_optional_float)
    m: int = _option(5, "Shuffles for method='psc'.", parse_int)
    seed: int = _option(0, "Shuffle seed for method='psc'.", parse_int)
    max_passage_words: int | None = _option(300, "Words kept per passage before the token budget applies "
                                            "(None: no limit).", parse_optional_int)
    max_context: int | None = _option(None, "Context size in tokens (default: what the server reports).",
                                      parse_optional_int)
    top_logprobs: int = _option(20, "Top-k log-probabilities asked per request (missing labels are re-asked "
                                "at the endpoint's maximum).", parse_int)
    concurrency: int = _option(8, "Requests in flight at once (async API and *_many).", parse_int)
    routing_header: str | None = _option("X-Session-ID", "Header that carries a random key per list on every request "
                                         "of the list (probe and /tokenize included), so that a router keeps the list "
                                         "on one server (vllm-router's consistent_hash reads X-Session-ID; LiteLLM "
                                         "x-litellm-session-id); None sends no key.", parse_optional_str)
    routed: bool = _option(False, "True when base_url is a router or load balancer in front of more than one server: "
                           "no llama.cpp slot pins, and llama.cpp prompts as token ids only (routers refuse its "
                           "mixed text-and-ids prompts).", parse_bool)

    def __post_init__(self) -> None:
        self._check_types()
        object.__setattr__(self, "template", resolve_template(self.template))
        for f in fields(self):
            choices = f.metadata["choices"]
            value = getattr(self, f.name)
            if choices and f.name != "template" and value not in choices and not (f.name == "preset" and value is None):
                raise InputError(f"unknown {f.name} {value!r}; choose one of {', '.join(choices)}")
        if self.window < 2 or not 1 <= self.stride <= self.window:
            raise InputError(f"need window >= 2 and 1 <= stride <= window, got {self.window}/{self.stride}")
        for name in ("m", "top_logprobs", "concurrency"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be >= 1, got {getattr(self, name)}")
        labels(min(self.window, 26), self.labels)
        check_prompt(self.prompt)
        if not self.normalise and self.probability != "joint":
            raise InputError("normalise=False needs probability='joint' (the trie form is normalised at every token)")
        if self.decoding == "release" and (self.labels != "numeric" or self.window > 99):
            raise InputError("decoding='release' needs numeric identifiers and window <= 99 (it scores two digits)")

    def _check_types(self) -> None:
        """Each value's type and range, before anything uses it: a bool is not a number here, NaN and
        infinities are refused (``alpha=inf`` made NaN scores, ``guard=nan`` switched the guard off), and
        the word limit is at least 1 (``0`` sent empty passages, ``-3`` cut each passage's last 3 words)."""
        for name in ("preset", "method", "calibration", "decoding", "labels", "probability", "prompt", "placeholder"):
            value = getattr(self, name)
            if not isinstance(value, str) and not (name == "preset" and value is None):
                raise InputError(f"{name} must be a string, got {value!r}")
        if not isinstance(self.template, (str, PromptTemplate)):
            raise InputError(f"template must be a template name or a PromptTemplate, got {self.template!r}")
        if not isinstance(self.normalise, bool):
            raise InputError(f"normalise must be True or False, got {self.normalise!r}")
        if not isinstance(self.routed, bool):
            raise InputError(f"routed must be True or False, got {self.routed!r}")
        if self.routing_header is not None and (why := check_header(self.routing_header)):
            raise InputError(why)
        if not (self.alpha in ("adaptive", "auto") or (is_finite(self.alpha) and self.alpha >= 0)):
            raise InputError(f"alpha must be 'auto', 'adaptive' or a finite number >= 0, got {self.alpha!r}")
        object.__setattr__(self, "guard", guard_value(self.guard))
        if not (self.decision is None or isinstance(self.decision, str)):
            raise InputError(f"decision must be a saved content decision (its JSON or a file), got {self.decision!r}")
        for name in ("window", "stride", "m", "seed", "top_logprobs", "concurrency"):
            if not is_whole(getattr(self, name)):
                raise InputError(f"{name} must be an integer, got {getattr(self, name)!r}")
        if not (is_whole(self.check_lists) and self.check_lists >= 1):
            raise InputError(f"check_lists must be an integer >= 1 (the most queries the content check reads), got "
                             f"{self.check_lists!r}")
        if not isinstance(self.check_wait, bool):
            raise InputError(f"check_wait must be True or False, got {self.check_wait!r}")
        if self.depth is not None and not (is_whole(self.depth) and self.depth >= 1):
            raise InputError(f"depth must be an integer >= 1 (places to decode), or None for all, got {self.depth!r}")
        if self.deadline is not None and not (is_finite(self.deadline) and self.deadline > 0):
            raise InputError(f"deadline must be a finite number of seconds > 0, or None for no limit, got {self.deadline!r}")
        for name in ("max_passage_words", "max_context"):
            value = getattr(self, name)
            if value is not None and not (is_whole(value) and value >= 1):
                raise InputError(f"{name} must be an integer >= 1, or None for no limit, got {value!r}")

    @property
    def calibrated(self) -> bool:
        """Whether the method runs the content-free prompt."""
        return self.method in CALIBRATED_METHODS

    @property
    def how(self) -> Method:
        """What the method does (:data:`METHOD_TABLE`)."""
        return METHOD_TABLE[self.method]

    def replace(self, **changes: Any) -> Options:
        """A copy with ``changes``; an unknown name is an :class:`~.errors.InputError` listing the known ones.
        A ``preset`` among them is applied first, so the other changes win over it.

        >>> Options().replace(method="psc", m=3).m
        3
        >>> o = Options().replace(preset="release", alpha=1.0)
        >>> o.template.name, o.prompt, o.normalise, o.alpha
        ('capcal', 'raw', False, 1.0)
        """
        unknown = set(changes) - set(OPTION_NAMES)
        if unknown:
            raise InputError(f"unknown option(s) {', '.join(sorted(unknown))}; known: {', '.join(OPTION_NAMES)}")
        preset = changes.get("preset")
        if preset is not None:
            if preset not in PRESETS:
                raise InputError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
            changes = {**PRESETS[preset], **changes}
        return dataclasses.replace(self, **changes)

    def settings(self) -> dict[str, Any]:
        """The options as keyword arguments; a built-in template by its name."""
        values = {name: getattr(self, name) for name in OPTION_NAMES}
        if TEMPLATES.get(self.template.name) is self.template:
            values["template"] = self.template.name
        return values

    @staticmethod
    def parse(name: str, raw: str) -> Any:
        """The value of option ``name`` written as a string (command line, method specs).

        >>> Options.parse("alpha", "1"), Options.parse("window", "30"), Options.parse("max_context", "none")
        (1.0, 30, None)
        """
        if name not in OPTION_NAMES:
            raise InputError(f"unknown option {name!r}; known: {', '.join(OPTION_NAMES)}")
        try:
            return OPTION_FIELDS[name].metadata["parse"](raw)
        except InputError as err:
            raise InputError(f"{name}: {err}") from None


OPTION_FIELDS = {f.name: f for f in fields(Options)}
#: The option names, in declaration order.
OPTION_NAMES = tuple(OPTION_FIELDS)


def option_docs() -> Mapping[str, str]:
    """Each option's one-line documentation."""
    return {name: f.metadata["doc"] for name, f in OPTION_FIELDS.items()}
