"""Judged queries from the evaluation set a RAG developer already has and the retriever they rank after: what
both adapters' ``CapCalRerank.decide(retriever, dataset)`` share.

A dataset is a list of :class:`Question`: its text and what answers it (ids or passage texts, each with a grade;
1 where the dataset only lists them). Each question's retrieved items, in the retriever's order, are graded by
the first of their keys (an id, a text) that the question names, 0 otherwise (:func:`judged_lists`); the core's
:meth:`~capcal_integrations.CapCalReranker.decide` takes the triples. Its shapes:

* LlamaIndex's ``EmbeddingQAFinetuneDataset`` (``generate_qa_embedding_pairs`` makes one; both are in
  ``llama-index-finetuning``, not in llama-index-core 0.14) or any object of its shape: ``queries`` (id ->
  text), ``corpus`` (id -> text), ``relevant_docs`` (query id -> ids): :func:`qa_dataset_questions`,
  duck-typed, so no extra package;
* ``(question, relevant)`` pairs, ``relevant`` one id or text, a sequence of them or a mapping of them to
  grades (LangChain's adapter): :func:`pair_questions`.

Pure: the adapters run the retriever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InputError

__all__ = ["Question", "qa_dataset_questions", "pair_questions", "judged_lists"]

log = logging.getLogger(__name__)

Judged = tuple[str, list[str], list[int]]


@dataclass(frozen=True)
class Question:
    """One judged question: its text and the grade of each id or passage text that answers it."""

    text: str
    relevant: Mapping[str, int]


def _grades(relevant: Any, where: str) -> dict[str, int]:
    """``relevant`` (one id or text, a sequence of them, or a mapping of them to grades) as ``{key: grade}``."""
    if isinstance(relevant, str):
        relevant = [relevant]
    if isinstance(relevant, Mapping):
        items = list(relevant.items())
    elif isinstance(relevant, Iterable):
        items = [(key, 1) for key in relevant]
    else:
        raise InputError(f"{where}: the relevant ids or texts must be a list (or a mapping to grades), "
                         f"got {type(relevant).__name__}")
    out: dict[str, int] = {}
    for key, grade in items:
        if not isinstance(grade, int) or isinstance(grade, bool) or grade < 0:
            raise InputError(f"{where}: grades must be integers >= 0, got {grade!r} for {str(key)[:40]!r}")
        out[str(key)] = max(grade, out.get(str(key), 0))
    return out


def qa_dataset_questions(dataset: Any) -> list[Question]:
    """The questions of an ``EmbeddingQAFinetuneDataset`` (or an object with its ``queries``, ``corpus`` and
    ``relevant_docs``): a relevant id stands for itself and for its corpus text, so a retriever over an index
    rebuilt with other node ids still matches. An id the corpus does not hold is an :class:`InputError`.

    >>> class D: queries, corpus, relevant_docs = {"q": "why?"}, {"n1": "because"}, {"q": ["n1"]}
    >>> qa_dataset_questions(D())
    [Question(text='why?', relevant={'n1': 1, 'because': 1})]
    """
    try:
        queries, corpus, relevant_docs = dataset.queries, dataset.corpus, dataset.relevant_docs
    except AttributeError:
        raise InputError(f"the dataset must have queries, corpus and relevant_docs (LlamaIndex's "
                         f"EmbeddingQAFinetuneDataset), got {type(dataset).__name__}") from None
    if not queries:
        raise InputError("the dataset holds no queries: nothing to decide from")
    out, unknown = [], []
    for qid, text in queries.items():
        grades = _grades(relevant_docs.get(qid, ()), f"relevant_docs[{qid!r}]")
        unknown += [key for key in grades if corpus and key not in corpus]
        by_text = {str(corpus[key]).strip(): g for key, g in grades.items() if key in corpus}
        out.append(Question(str(text), {**grades, **{t: max(g, grades.get(t, 0)) for t, g in by_text.items()}}))
    if unknown:
        raise InputError(f"relevant_docs names {len(unknown)} ids that match nothing in the dataset's corpus "
                         f"(e.g. {unknown[0]!r}): the dataset's relevant_docs and corpus disagree")
    return out


def pair_questions(pairs: Any) -> list[Question]:
    """``(question, relevant)`` pairs as questions; ``relevant``: ids or texts (a string is one of them), or a
    mapping of them to grades.

    >>> pair_questions([("why?", ["d1", "because"]), ("how?", {"d2": 2})])[1]
    Question(text='how?', relevant={'d2': 2})
    """
    if isinstance(pairs, (str, bytes, Mapping)) or not isinstance(pairs, Iterable):
        raise InputError("the dataset must be a sequence of (question, relevant ids or texts) pairs")
    out = []
    for i, pair in enumerate(pairs):
        try:
            question, relevant = pair
        except (TypeError, ValueError):
            raise InputError(f"dataset item {i}: expected a (question, relevant ids or texts) pair, "
                             f"got {type(pair).__name__}") from None
        if not isinstance(question, str):
            raise InputError(f"dataset item {i}: the question must be a string, got {type(question).__name__}")
        out.append(Question(question, _grades(relevant, f"dataset item {i} ({question[:40]!r})")))
    if not out:
        raise InputError("the dataset is empty: nothing to decide from")
    return out


def judged_lists(questions: Sequence[Question], retrieved: Sequence[Sequence[Any]],
                 keys: Callable[[Any], Sequence[str]], text: Callable[[Any], str]) -> list[Judged]:
    """``(question, passage texts, grades)`` for each question and what the retriever returned for it, in the
    retriever's order: an item's grade is that of the first of its ``keys`` (id, text, ...) the question names,
    else 0. A question whose retrieved items hold nothing relevant is kept (the core leaves it out: it says
    nothing about an order); none holding anything relevant is an :class:`InputError` that shows what was
    compared.

    >>> qs = [Question("why?", {"n1": 1}), Question("how?", {"n9": 2})]
    >>> judged_lists(qs, [["n1", "n2"], ["n3"]], lambda x: [x], str.upper)
    [('why?', ['N1', 'N2'], [1, 0]), ('how?', ['N3'], [0])]
    """
    if not questions:
        raise InputError("the dataset is empty: nothing to decide from")
    out, found = [], 0
    for question, items in zip(questions, retrieved, strict=True):
        grades = [next((question.relevant[k] for k in keys(item) if k in question.relevant), 0) for item in items]
        found += any(grades)
        out.append((question.text, [text(item) for item in items], grades))
    if not found:
        seen = next((keys(item) for items in retrieved for item in items), None)
        wanted = next((list(q.relevant)[:1] for q in questions if q.relevant), None)
        raise InputError(f"the retriever returned no relevant passage for any of the {len(questions)} questions: "
                         f"no retrieved id or text matched the dataset's (retrieved keys look like "
                         f"{[str(k)[:40] for k in seen] if seen else 'nothing'}, relevant ones like "
                         f"{[str(k)[:40] for k in wanted] if wanted else 'nothing'}); is the retriever over the "
                         "dataset's corpus, and does it return enough passages (top_k)?")
    if found < len(questions):
        log.info("%d of %d questions retrieved no relevant passage and say nothing about an order: left out",
                 len(questions) - found, len(questions))
    return out
