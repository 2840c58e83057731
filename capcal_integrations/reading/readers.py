"""How identifier probabilities are read on an endpoint: one :class:`Reader` per route the endpoint kind names
(:func:`~capcal_integrations.endpoints.probe.route`), so that the flows ask a reader what it can do instead of
comparing route names.

* ``prefix``: after an assistant prefix in the served chat template, by the served model's token ids
  (:mod:`.labels`); decodes step by step.
* ``text``: after any prefix in a prompt rendered here, by token texts (:mod:`.textlabels`); step by step.
* ``generation``: from the model's own answer, its first identifier only (hosted chat APIs that cannot
  continue a prefix); a full order is the answer parsed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..endpoints.probe import route
from ..types import Capabilities

__all__ = ["Reader", "READERS", "reader_of"]


@dataclass(frozen=True)
class Reader:
    """What one route can do. ``steps``: it continues a prefix, so a ranking decodes step by step (else the
    first step is read from the model's answer, and a full order is the answer itself). ``token_ids``: it reads
    by the served model's tokens, so the identifier spellings are tokenized once per endpoint.
    ``auto_method``: what ``method="auto"`` runs; ``why_auto``: the reason logged (``{prompt}``: the prompt
    format); ``below_depth``: how the places below the decoded depth are ordered."""

    route: str
    steps: bool
    token_ids: bool
    why_auto: str
    below_depth: str

    @property
    def auto_method(self) -> str:
        return "capcal" if self.steps else "first-token-capcal"


READERS = {
    "prefix": Reader("prefix", True, True, "it continues an assistant prefix", "the last decoded step's scores"),
    "text": Reader("text", True, False, "its /v1/completions continues a prompt rendered here ({prompt})",
                   "the last decoded step's scores"),
    "generation": Reader("generation", False, False, "it cannot continue an assistant prefix, so the first "
                         "identifier of the model's answer is read", "their given order"),
}


def reader_of(caps: Capabilities, prompt: str = "chat") -> Reader:
    """The reader of this endpoint for prompts in format ``prompt`` (``Options.prompt``); a
    :class:`~capcal_integrations.errors.CapabilityError` where it cannot read identifiers at all."""
    return READERS[route(caps, prompt)]
