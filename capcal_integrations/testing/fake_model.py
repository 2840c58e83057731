"""The fake endpoint's model: a tiny tokenizer and next-token log-probabilities that read nothing.

The tokenizer knows ``[``, `` [``, ``]``, ``>``, digits, capital letters and Qwen's three control tokens
(:data:`SPECIAL`); any other character is a token of its own, so every prompt decodes back to its text
(:func:`decode`, :func:`split_prompt`). The next-token log-probabilities are pseudo-random over the whole
vocabulary but deterministic in the prompt (:func:`distribution`). :mod:`.endpoint` answers with them in every
dialect.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence

__all__ = ["VOCAB", "PIECE", "SPECIAL", "tokenize", "piece_of", "decode", "split_prompt", "distribution",
           "content_logprobs", "symbol"]

VOCAB = {" [": 508, "[": 58, "]": 60, " >": 861, ">": 29, "x": 87}
VOCAB.update({str(d): 15 + d for d in range(10)})
VOCAB.update({chr(65 + i): 100 + i for i in range(26)})
PIECE = {v: k for k, v in VOCAB.items()}  # the tokens next-token distributions range over
#: Qwen's control tokens and ids: parsed from text unless ``parse_special`` is false, as llama.cpp does.
SPECIAL = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
_OTHER = 1_000_000  # any other character is its own token, 1_000_000 + its code point (so prompts decode)


def tokenize(text: str, *, parse_special: bool = True) -> list[tuple[int, str]]:
    """The fake model's ``(id, piece)`` tokens of ``text``.

    >>> tokenize(" [12]")
    [(508, ' ['), (16, '1'), (17, '2'), (60, ']')]
    """
    out, i = [], 0
    while i < len(text):
        special = next((s for s in SPECIAL if text.startswith(s, i)), None) if parse_special else None
        piece = special or (text[i:i + 2] if text[i:i + 2] in VOCAB else text[i])
        out.append((SPECIAL.get(piece) or VOCAB.get(piece) or _OTHER + ord(piece), piece))
        i += len(piece)
    return out


def piece_of(token: int) -> str:
    return PIECE.get(token) or {v: k for k, v in SPECIAL.items()}.get(token) or chr(token - _OTHER)


def decode(prompt: str | Sequence[str | int]) -> str:
    """The text of a prompt as sent: a string, token ids, or llama.cpp's mixed list of both."""
    if isinstance(prompt, str):
        return prompt
    return "".join(x if isinstance(x, str) else piece_of(x) for x in prompt)


def split_prompt(prompt: list) -> tuple[str, str]:
    """A llama.cpp mixed prompt as (the chat template's text, the assistant prefix after it): the prefix
    is the token ids after the prompt's last text element."""
    last = max(k for k, x in enumerate(prompt) if isinstance(x, str))
    return decode(prompt[:last + 1]), decode(prompt[last + 1:])


def distribution(prompt: str) -> list[tuple[int, float]]:
    """Deterministic pseudo-random next-token log-probabilities over the whole fake vocabulary."""
    rng = random.Random(hashlib.sha256(prompt.encode()).digest())
    weights = {tid: rng.random() ** 3 + 1e-4 for tid in PIECE}
    total = sum(weights.values())
    return sorted(((tid, math.log(w / total)) for tid, w in weights.items()), key=lambda e: -e[1])


def content_logprobs(prompt: str, top: int) -> dict:
    dist = distribution(prompt)[:top]
    entries = [{"id": t, "token": PIECE[t], "bytes": list(PIECE[t].encode()), "logprob": lp} for t, lp in dist]
    return {"content": [{**entries[0], "top_logprobs": entries}]}


def symbol(piece: str) -> str:
    """How a byte-level BPE tokenizer spells a piece (vLLM's ``token_strs``): a space is ``Ġ``."""
    return piece.replace(" ", "Ġ")
