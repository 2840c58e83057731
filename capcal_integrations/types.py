"""The data model: small frozen dataclasses, no I/O."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import InputError


def _deprecated(message: str) -> None:
    warnings.warn(message + "; it goes in a later release", FutureWarning, stacklevel=3)

__all__ = ["Document", "Step", "Usage", "Ranking", "Capabilities", "Method", "as_document"]


@dataclass(frozen=True)
class Document:
    """A passage to rerank. ``id`` and ``metadata`` are carried through untouched."""

    text: str
    id: str | None = None
    title: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


def as_document(item: object) -> Document:
    """Accept ``str``, :class:`Document`, a dict with ``text``/``content``/``page_content``, or an
    object with one of those attributes (LangChain ``Document``, rank_llm candidates).

    >>> as_document("a passage").text
    'a passage'
    >>> as_document({"text": "t", "title": "T", "docid": "7"})
    Document(text='t', id='7', title='T', metadata={})
    """
    if isinstance(item, Document):
        if not isinstance(item.text, str) or not isinstance(item.title, (str, type(None))):
            raise TypeError(f"Document text must be a string (and its title a string or None), got "
                            f"{type(item.text).__name__} ({type(item.title).__name__} title)")
        return item
    if isinstance(item, str):
        return Document(item)
    if isinstance(item, Mapping):
        for key in ("text", "contents", "content", "page_content", "body", "passage", "segment"):
            if isinstance(item.get(key), str):
                doc_id, title = item.get("docid", item.get("id")), item.get("title")
                if not isinstance(title, (str, type(None))):
                    raise TypeError(f"a passage's title must be a string or None, got {type(title).__name__}")
                return Document(item[key], None if doc_id is None else str(doc_id), title)
        raise TypeError(f"mapping has no text field (looked for text/content/page_content/...): keys "
                        f"{sorted(map(str, item))[:10]}")
    for attr in ("text", "page_content", "content"):
        value = getattr(item, attr, None)
        if isinstance(value, str):
            return Document(value)
    raise TypeError(f"cannot read passage text from {type(item).__name__}; pass str, Document or a dict with 'text'")


@dataclass(frozen=True)
class Step:
    """One decoding step of one window, for tracing and for the eval.

    ``candidates`` are input indices (0-based, into the whole list) still in play; ``p`` is the real
    stream's distribution over them, ``q`` the empty stream's (``None`` for vanilla), ``scores`` the
    calibrated scores (equal to ``p`` for vanilla), ``chosen`` the input index picked. ``pruned``: how many
    candidates' ``p`` are upper bounds because they could not be chosen (vanilla's middle steps ask only the
    nodes the choice needs; the choice is the exact joint form's, the chosen one's ``p`` exact, the others'
    renormalised shares and the entropy then approximate). In capcal's middle steps (additive form) it counts the
    candidates not read through on the real or the empty stream: the choice is certified to be the whole
    reading's, and ``p``, ``q``, ``scores``, ``alpha`` and ``entropy`` are computed with every candidate at its
    upper bound (the chosen one's share an estimate; docs/endpoints.md, Exactness).
    """

    candidates: tuple[int, ...]
    p: tuple[float, ...]
    q: tuple[float, ...] | None
    scores: tuple[float, ...]
    alpha: float
    entropy: float
    chosen: int
    window: int = 0
    upper_bounds: int = 0
    pruned: int = 0


@dataclass(frozen=True)
class Usage:
    """What a reranking cost: HTTP requests and the tokens the server reported."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.requests + other.requests,
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cached_tokens + other.cached_tokens,
        )


@dataclass(frozen=True)
class Ranking:
    """The result of one reranking.

    ``order``: input indices, best first; always a permutation of ``range(n)``.
    ``scores``: one per *input* passage, higher is more relevant, strictly consistent with
    ``order`` (``scores[order[0]] > scores[order[1]] > ...``). For the listwise methods the
    score of the passage chosen at rank ``r`` out of ``n`` is ``(n - r - 1 + c) / n``, where ``c`` is
    its calibrated share at the step it was chosen (0..1); for ``first-token`` it is the calibrated
    first-step score itself.
    ``method``: the method that ran (``auto`` resolved: ``capcal`` or ``first-token-capcal``); ``"given-order"``
    where none did (a list kept in its given order, or of at most one passage): then ``scores`` are places only,
    and the adapters give the retriever's own scores instead.
    ``prior``: the empty-prompt distribution over identifiers at the first step of the first
    window (``None`` if no empty stream ran). ``steps``: every decoding step (see :class:`Step`).
    ``upper_bounds``: how many label probabilities were upper bounds or estimates because the endpoint's
    top-k did not contain a needed token, or (hosted chat APIs) the model's answer did not pass through a
    token several identifiers share (never silently zero). ``notes``: anything else worth knowing.
    ``agreement`` and ``guarded`` are deprecated read-only properties (a ``FutureWarning`` when read):
    ``agreement`` is always empty (the retired per-list guard filled it); ``guarded`` is ``(0,)`` exactly when
    ``kept_given_order``, which says it.
    ``decoded``: how many leading places of ``order`` the method decided (``Options.depth``, a deadline,
    or identifiers a generated answer left out); the places after them were *not* decided by the model
    and say so in :meth:`details` and a note. ``None``: every place was decided.
    ``partial``: the deadline (``Options.deadline``) passed first; the places after ``decoded`` are in
    first-stage order (:mod:`.deadline`).
    ``checked``: the windows read for the content check inside this ranking (``check_wait=True``: its top
    window read at the first step in four orders, :mod:`.content_check`); readings taken in the background
    are not counted here.
    ``kept_given_order``: the whole list is in its given order because a rule kept it (the content check
    deciding, or decided that the model does not read the passages): nothing was decoded (``decoded`` 0),
    ``method`` is ``"given-order"`` and a note says why.
    """

    order: tuple[int, ...]
    scores: tuple[float, ...]
    method: str = "capcal"
    prior: tuple[float, ...] | None = None
    steps: tuple[Step, ...] = ()
    usage: Usage = Usage()
    upper_bounds: int = 0
    notes: tuple[str, ...] = ()
    decoded: int | None = None
    partial: bool = False
    checked: tuple[int, ...] = ()
    kept_given_order: bool = False

    @property
    def agreement(self) -> tuple[float, ...]:
        """Deprecated: always empty (the retired per-list guard, ``guard=<z-score>``, filled it)."""
        _deprecated("Ranking.agreement is always empty (the per-list guard that filled it is retired)")
        return ()

    @property
    def guarded(self) -> tuple[int, ...]:
        """Deprecated: ``(0,)`` when the list was kept in its given order, else empty; read ``kept_given_order``.

        >>> import warnings
        >>> with warnings.catch_warnings(record=True):
        ...     Ranking((0, 1), (1.0, 0.5), "given-order", kept_given_order=True).guarded
        (0,)
        """
        _deprecated("Ranking.guarded is deprecated: read Ranking.kept_given_order")
        return (0,) if self.kept_given_order else ()

    @property
    def placed_by_model(self) -> bool:
        """Whether a model placed the list (``scores`` are the model's), not kept in its given order (the content
        check, or at most one passage: ``method`` ``"given-order"``, ``scores`` places only).

        >>> Ranking((0, 1), (1.0, 0.5), "given-order").placed_by_model
        False
        """
        return self.method != "given-order"

    def top(self, k: int | None = None) -> tuple[int, ...]:
        """The first ``k`` input indices of :attr:`order` (all when ``k`` is None; ``k`` >= 0).

        >>> Ranking((2, 0, 1), (0.3, 0.1, 0.9)).top(2)
        (2, 0)
        """
        if k is not None and not (isinstance(k, int) and not isinstance(k, bool) and k >= 0):
            raise InputError(f"k must be an integer >= 0 or None, got {k!r}")
        return self.order if k is None else self.order[:k]

    def details(self) -> list[dict[str, Any]]:
        """Per input passage, for tracing: its rank, whether the list was kept in its given order (the content
        rule: ``kept_given_order``, so its place is the first stage's, not the model's), whether its place
        was decided (``decoded``: False below the depth or after a deadline) and whether the deadline cut the
        ranking (``partial``), and the numbers
        of the last decoding step it took part in (``p`` real, ``q`` empty prompt, calibrated ``score``,
        ``alpha``).

        >>> r = Ranking((1, 0), (0.25, 0.9), steps=(Step((0, 1), (0.4, 0.6), (0.7, 0.3), (0.2, 0.8), 2.0, 0.67, 1),))
        >>> r.details()[1]  # doctest: +NORMALIZE_WHITESPACE
        {'rank': 1, 'input_rank': 2, 'method': 'capcal', 'upper_bounds': 0, 'kept_given_order': False,
         'decoded': True, 'partial': False, 'p': 0.6, 'q': 0.3, 'score': 0.8, 'alpha': 2.0}
        """
        last = {i: (step, j) for step in self.steps for j, i in enumerate(step.candidates)}
        kept = set(range(len(self.order))) if self.kept_given_order else set()
        rank = {i: r for r, i in enumerate(self.order)}
        out = []
        for i in range(len(self.order)):
            d: dict[str, Any] = {"rank": rank[i] + 1, "input_rank": i + 1, "method": self.method,
                                 "upper_bounds": self.upper_bounds, "kept_given_order": i in kept,
                                 "decoded": self.decoded is None or rank[i] < self.decoded,
                                 "partial": self.partial}
            if i in last:
                step, j = last[i]
                d.update(p=round(step.p[j], 4), q=None if step.q is None else round(step.q[j], 4),
                         score=round(step.scores[j], 4), alpha=round(step.alpha, 4))
            out.append(d)
        return out


@dataclass(frozen=True)
class Capabilities:
    """What an endpoint can do, probed once per (endpoint, model) and cached.

    ``kind`` is the endpoint kind the probe chose (a :class:`capcal_integrations.endpoints.base.Kind`, one
    module each in :mod:`capcal_integrations.endpoints`): the cheapest exact way found to read next-token
    log-probabilities after an arbitrary assistant prefix, or, where no prefix in the model's chat template
    can be continued (hosted APIs), how identifiers are read instead. ``transport`` is its name, kept for
    display and for capabilities built by hand (then the kind is the one of that name). ``text_completions``
    is the top-k of a plain ``/v1/completions`` that takes text prompts (0: none); there a prompt rendered
    on the client continues any prefix. ``tokenize`` names the server's ``/tokenize`` dialect (``""``: none).
    ``logprobs``: chat completions return ``top_logprobs`` (then generated answers can be read).
    ``prompt_lists``: ``/v1/completions`` takes a list of prompts per request. ``chat``: chat
    completions answer (with or without log-probabilities).
    """

    model: str
    logprobs: bool
    max_top_logprobs: int
    transport: str
    chat_extra: Mapping[str, Any] = field(default_factory=dict)
    tokenize: str = ""
    template: bool = False  # /apply-template available
    prompt_lists: bool = False
    logprob_token_ids: bool = False
    context: int | None = None
    server: str = ""
    slots: int = 0  # llama.cpp server slots (prompts are pinned to one each)
    text_completions: int = 0
    chat: bool = False
    weights: str = ""  # a fingerprint of the served weights, from what the server reports (see .probe)
    kind: Any = field(default=None, compare=False, repr=False)  # the probe's choice (see above)


@dataclass(frozen=True)
class Method:
    """What a ranking method does (one per name in :data:`~.options.METHOD_TABLE`), so that the flows ask it
    rather than compare names: ``calibrated``: it runs the content-free prompt and calibrates against it;
    ``first_only``: it reads the first decoding step only (one request per window); ``answers_suffice``: where an
    endpoint returns no log-probabilities it can still rank from the model's answers alone; ``shuffles``:
    permutation self-consistency (``m`` shuffled rankings, Borda)."""

    name: str
    calibrated: bool
    first_only: bool = False
    answers_suffice: bool = False
    shuffles: bool = False
