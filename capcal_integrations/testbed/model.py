"""The testbed's parametric reranker: the logits of the identifiers, given what a prompt shows.

For a prompt that lists ``n`` passages, the label logit of slot ``j`` is

* real prompt: ``s * grade(passage) + b(j) + delta(j) + preference(passage) + u(list, j) + noise``;
* empty prompt (every passage the placeholder): ``b(j) + noise``.

``b`` is the slot prior, ``delta`` the real-vs-empty slot mismatch, ``preference`` a per-passage taste
that has nothing to do with relevance (the same in every prompt that shows the passage), and the noise
is Gaussian, drawn once per (seed, prompt, slot): the same prompt always gets the same answer (so the
several requests of one decoding step agree, and two methods asking the same prompt compare on the
same draw), another prompt (another order, another query) gets fresh noise. The labels then follow a
Plackett-Luce model: at every decoding step, the softmax of these logits over the labels not yet chosen.

Three parameters give the lists of one model different shapes (all off by default; a list is named by
``list_key``, its query: the real, swapped and empty prompts of one list share it):

* ``noise_scale``: each list's noise (real and empty prompts) is multiplied by ``exp(N(0, noise_scale))``,
  drawn once per (seed, list), so some lists are louder than others;
* ``tails``: the noise is Student-t with ``tails`` degrees of freedom (> 2), scaled to the same SD;
* ``shared_slots``: the SD of list-level slot effects ``u(list, j)``, drawn once per (seed, list, slot) and
  added to every real prompt of the list, whatever order its passages are in (so two readings of a list
  share them, as the real 0.5B's do: ``slot_effects.json``'s ``shared_slots``).

``tie`` labels may be tied at a floor: in each prompt the ``tie`` lowest logits are set to the lowest
of them, as a server that cuts its top log-probabilities returns one floor value for all the rest;
``shown`` says it by what the server keeps (all but the top ``shown`` tied, whatever the list's length:
the ``ties`` scenario keeps 8, so a 20-passage prompt ties 12 and a 6-passage prompt none).

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
from collections.abc import Callable, Sequence
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
    shown: int = 0  # only the top `shown` labels' logits are told apart; the rest are tied (0: all shown)
    seed: int = 0
    name: str = field(default="custom", compare=False)
    noise_scale: float = 0.0  # SD of the log of a list's noise multiplier (drawn once per list); 0 = none
    tails: float = 0.0  # degrees of freedom of Student-t noise (> 2, scaled to the same SD); 0 = Gaussian
    shared_slots: float = 0.0  # SD of the list-level slot effects u(list, slot) of real prompts; 0 = none

    def __post_init__(self) -> None:
        if self.noise_scale < 0 or self.shared_slots < 0 or self.tails < 0 or 0 < self.tails <= 2:
            from ..errors import InputError
            raise InputError(f"testbed model: noise_scale and shared_slots must be >= 0 and tails 0 or > 2, got "
                             f"{self.noise_scale}, {self.shared_slots}, {self.tails}")

    def logits(self, grades: Sequence[float] | None, prompt: str, passages: Sequence[str] = (), *,
               list_key: str = "") -> list[float]:
        """The label logits of one prompt: ``grades`` per slot for a real prompt, ``None`` for the empty one;
        ``prompt`` identifies the prompt (its noise), ``passages`` (keys of the passages' texts) their preferences,
        ``list_key`` the list (its query: its noise scale and shared slot effects)."""
        n = len(grades) if grades is not None else len(passages)
        rng = random.Random(_digest(f"{self.seed}|{prompt}"))
        b = stretch(self.prior, n)
        scale = self.list_scale(list_key)
        draw = rng.gauss if not self.tails else self._t(rng)
        if grades is None:
            sd = self.noise_empty * scale
            out = [b[j] + draw(0.0, sd) for j in range(n)]
        else:
            d = stretch(self.delta, n)
            sd = self.noise * scale
            out = [self.s * grades[j] + b[j] + d[j] + draw(0.0, sd) for j in range(n)]
            if self.preference:
                out = [v + self.preference * _unit(f"{self.seed}|passage|{p}") for v, p in zip(out, passages)]
            if self.shared_slots:
                u = self.slot_effects(list_key, n)
                out = [v + e for v, e in zip(out, u)]
        tied = max(self.tie, n - self.shown if self.shown else 0)
        if tied > 1:
            low = sorted(range(n), key=lambda j: out[j])[:min(tied, n)]
            floor = min(out[j] for j in low)
            for j in low:
                out[j] = floor
        return out

    def list_scale(self, list_key: str = "") -> float:
        """The multiplier of the list's noise SD: ``exp(N(0, noise_scale))``, fixed by the seed and the list."""
        return math.exp(self.noise_scale * _unit(f"{self.seed}|scale|{list_key}")) if self.noise_scale else 1.0

    def slot_effects(self, list_key: str, n: int) -> list[float]:
        """The list-level slot effects ``u(list, j)`` of a real prompt of ``n`` slots (zeros without ``shared_slots``)."""
        if not self.shared_slots:
            return [0.0] * n
        return [self.shared_slots * _unit(f"{self.seed}|slot|{list_key}|{j}") for j in range(n)]

    def _t(self, rng: random.Random) -> Callable[[float, float], float]:
        """A Student-t draw with ``tails`` degrees of freedom, scaled to SD ``sd`` (the signature of ``gauss``)."""
        nu = self.tails
        unit = math.sqrt((nu - 2) / nu)

        def draw(mu: float, sd: float) -> float:
            z = rng.gauss(0.0, 1.0)
            return mu + sd * unit * z / math.sqrt(rng.gammavariate(nu / 2, 2.0) / nu)

        return draw

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
    large_model = SlotModel(prior=tuple(large["prior"]), delta=tuple(large["delta"]), noise=real_noise(large),
                            noise_empty=large["noise_empty"], name="delta-1.5b")
    return {
        "no-delta": base.replace(name="no-delta"),
        "delta-0.5b": base.replace(delta=tuple(small["delta"]), name="delta-0.5b"),
        "delta-1.5b": large_model,
        "last-digit": base.replace(delta=_last_digit(), name="last-digit"),
        "ties": base.replace(shown=8, name="ties"),
        "noise-scale-0.5": base.replace(noise_scale=0.5, name="noise-scale-0.5"),
        "noise-scale-1": base.replace(noise_scale=1.0, name="noise-scale-1"),
        "heavy-tails": base.replace(tails=3.0, name="heavy-tails"),
        # the real prompt's list x slot variation split as the 0.5B's reordered lists split it: mostly shared
        "shared-slots": base.replace(shared_slots=small["shared_slots"], noise=small["noise_fresh"], name="shared-slots"),
        "scale-1.5b": large_model.replace(noise_scale=large["noise_scale"], name="scale-1.5b"),
    }


#: The slot scenarios: no real-vs-empty mismatch (the 0.5B's prior); the 0.5B's and the 1.5B's fitted prior and
#: mismatch; a last-digit-shared mismatch; all but the top 8 labels tied at a floor (0.5B prior). Issue 22's shapes of
#: real traffic, on the 0.5B's prior unless said: each list's noise scaled by exp(N(0, .5)) and exp(N(0, 1));
#: Student-t noise with 3 degrees of freedom; list-level slot effects shared by every reading of a list (the
#: 0.5B's fitted ``shared_slots``, SD .36, with its fitted fresh noise, .21, in place of the whole real-prompt
#: noise); the 1.5B's own spread of per-list noise scales (``delta-1.5b`` with its fitted ``noise_scale``, .47).
SCENARIOS: dict[str, SlotModel] = _scenarios()


def scenario(name: str, s: float, seed: int = 0, **changes: object) -> SlotModel:
    """The named scenario (:data:`SCENARIOS`) at content slope ``s`` and noise seed ``seed``."""
    if name not in SCENARIOS:
        from ..errors import InputError
        raise InputError(f"unknown testbed scenario {name!r}; choose one of {', '.join(SCENARIOS)}")
    return SCENARIOS[name].replace(s=s, seed=seed, **changes)
