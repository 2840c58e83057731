"""The fake endpoint of the tests: :mod:`capcal_integrations.testing`, re-exported under the names the tests
have always imported from here (``httpx2`` included: the installed openai's HTTP library)."""

from capcal_integrations.testing.endpoint import (  # noqa: F401 - re-exported
    PIECE,
    SPECIAL,
    VOCAB,
    clients,
    content_logprobs,
    decode,
    distribution,
    hosted,
    httpx2,
    make_handler,
    piece_of,
    split_prompt,
    symbol,
    tokenize,
    tokenized_texts,
    vllm_completions,
)
from capcal_integrations.testing.loopback import Loopback, Seen  # noqa: F401 - re-exported


def no_completions(request):
    """A ``fault`` for ``make_handler``: no ``/v1/completions`` (a vLLM without prompt lists, read through chat
    prefill: one chat request per prompt)."""
    return httpx2.Response(404, json={}) if request.url.path == "/v1/completions" else None
