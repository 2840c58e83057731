"""The testbed's parametric reranker: the logits of the identifiers, given what a prompt shows.

For a prompt that lists ``n`` passages, the label logit of slot ``j`` is

* real prompt: ``s * grade(passage) + b(j) + delta(j) + preference(passage) + noise``;
* empty prompt (every passage the placeholder): ``b(j) + noise``.

``b`` is the slot prior, ``delta`` the real-vs-empty slot mismatch, ``preference`` a per-passage taste
that has nothing to do with relevance (the same in every prompt that shows the passage), and the noise
is Gaussian, drawn once per (seed, prompt, slot): the same prompt always gets the same answer (so the
several requests of one decoding step agree, and two methods asking the same prompt compare on the
same draw), another prompt (another order, another query) gets fresh noise. The labels then follow a
Plackett-Luce model: at every decoding step, the softmax of these logits over the labels not yet chosen.

``tie`` labels may be tied at a floor: in each prompt the ``tie`` lowest logits are set to the lowest
of them, as a server that cuts its top log-probabilities returns one floor value for all the rest.

Slot vectors are fitted from the packaged models' records (:mod:`.fit`, ``slot_effects.json``); a
vector of another length is stretched over the list by relative position (first and last slots kept).

This is a test instrument: it shows what the library's rules do when the truth is known, not what a
real model does.
"""

from __future__ import annotations

import hashlib
import json
import math
import pathlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

__all__ = ["SlotModel", "stretch", "SCENARIOS", "scenario", "slot_effects"]

_EFFECTS = pathlib.Path(__file__).with_name("slot_effects.json")


@dataclass(frozen=True)
class SlotModel:
    """The parameters of the simulated reranker (logits; see the module docstring)."""

    s: float = 1.0  # content slope per relevance grade
    prior: tuple[float, ...] = ()  # b(slot); () = none
    delta: tuple[float, ...] = ()  # delta(slot), real prompts only; () = none
    preference: float = 0.0  # SD of the per-passage preference (real prompts only)
    noise: float = 0.3  # SD of the real prompt's noise per slot
    noise_empty: float = 0.13  # SD of the empty prompt's noise per slot
    tie: int = 0  # how many of the lowest labels are tied at one floor value
    seed: int = 0
    name: str = field(default="custom", compare=False)

    def logits(self, grades: Sequence[float] | None, prompt: str, passages: Sequence[str] = ()) -> list[float]:
        """The label logits of one prompt: ``grades`` per slot for a real prompt, ``None`` for the empty one;
        ``prompt`` identifies the prompt (its noise), ``passages`` (keys of the passages' texts) their preferences."""
        n = len(grades) if grades is not None else len(passages)
        rng = random.Random(_digest(f"{self.seed}|{prompt}"))
        b = stretch(self.prior, n)
        if grades is None:
            out = [b[j] + rng.gauss(0.0, self.noise_empty) for j in range(n)]
        else:
            d = stretch(self.delta, n)
            out = [self.s * grades[j] + b[j] + d[j] + rng.gauss(0.0, self.noise) for j in range(n)]
            if self.preference:
                out = [v + self.preference * _unit(f"{self.seed}|passage|{p}") for v, p in zip(out, passages)]
        if self.tie > 1:
            low = sorted(range(n), key=lambda j: out[j])[:min(self.tie, n)]
            floor = min(out[j] for j in low)
            for j in low:
                out[j] = floor
        return out

    def replace(self, **changes: object) -> SlotModel:
        return replace(self, **changes)


def stretch(vector: Sequence[float], n: int) -> list[float]:
    """``vector`` read at ``n`` evenly spaced relative positions (linear interpolation); zeros if empty.

    >>> stretch([0.0, 1.0, 2.0], 5), stretch([1.0, 2.0], 2), stretch([], 2)
    ([0.0, 0.5, 1.0, 1.5, 2.0], [1.0, 2.0], [0.0, 0.0])
    """
    m = len(vector)
    if not m:
        return [0.0] * n
    if m == n or m == 1:
        return [float(vector[j % m]) for j in range(n)]
    out = []
    for j in range(n):
        x = j * (m - 1) / (n - 1) if n > 1 else 0.0
        lo = min(int(x), m - 2)
        out.append(vector[lo] + (x - lo) * (vector[lo + 1] - vector[lo]))
    return out


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


def _unit(text: str) -> float:
    """A standard normal value determined by ``text``."""
    return random.Random(_digest(text)).gauss(0.0, 1.0)


def slot_effects() -> dict[str, dict]:
    """The fitted slot effects per packaged model (``slot_effects.json``, written by :mod:`.fit`)."""
    return json.loads(_EFFECTS.read_text(encoding="utf-8"))["fits"]


def _last_digit(size: float = 1.5, n: int = 20, seed: int = 17) -> tuple[float, ...]:
    """A slot effect shared by identifiers with the same last digit (``[3]`` and ``[13]``), real prompts only:
    what a half-window rotation cannot tell from content. Fixed values, standard deviation ``size``."""
    rng = random.Random(seed)
    by_digit = [rng.gauss(0.0, 1.0) for _ in range(10)]
    mean = math.fsum(by_digit) / 10
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in by_digit) / 10)
    return tuple(round(size * (by_digit[(j + 1) % 10] - mean) / sd, 4) for j in range(n))


def _scenarios() -> dict[str, SlotModel]:
    fits = slot_effects()
    small, large = fits["0.5b"], fits["1.5b"]

    def real_noise(fit: dict) -> float:  # the real stream's own noise: the difference's minus the empty stream's
        return round(math.sqrt(max(fit["noise_real"] ** 2 - fit["noise_empty"] ** 2, 0.01)), 4)

    base = SlotModel(prior=tuple(small["prior"]), noise=real_noise(small), noise_empty=small["noise_empty"])
    return {
        "no-delta": base.replace(name="no-delta"),
        "delta-0.5b": base.replace(delta=tuple(small["delta"]), name="delta-0.5b"),
        "delta-1.5b": SlotModel(prior=tuple(large["prior"]), delta=tuple(large["delta"]), noise=real_noise(large),
                                noise_empty=large["noise_empty"], name="delta-1.5b"),
        "last-digit": base.replace(delta=_last_digit(), name="last-digit"),
        "ties": base.replace(tie=12, name="ties"),
    }


#: The slot scenarios of the issue: no real-vs-empty mismatch (the 0.5B's prior); the 0.5B's and the 1.5B's
#: fitted prior and mismatch; a last-digit-shared mismatch; twelve labels tied at a floor (0.5B prior).
SCENARIOS: dict[str, SlotModel] = _scenarios()


def scenario(name: str, s: float, seed: int = 0, **changes: object) -> SlotModel:
    """The named scenario (:data:`SCENARIOS`) at content slope ``s`` and noise seed ``seed``."""
    if name not in SCENARIOS:
        from ..errors import InputError
        raise InputError(f"unknown testbed scenario {name!r}; choose one of {', '.join(SCENARIOS)}")
    return SCENARIOS[name].replace(s=s, seed=seed, **changes)
