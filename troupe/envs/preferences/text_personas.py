"""ALGORITHMS.md §C.5's personas in text: responses whose measurable attributes are the features,
so that a persona is a weighting of attributes a reward model has to read from the text.

A response is one sentence of words drawn from fixed, disjoint vocabularies (`VOCAB`), shuffled.
Its eight attributes (`ATTRIBUTES`), each counted exactly from the text by `attribute_values`:

====  ===============  ==============================================================
 0    ``length``       words in the response (numbers count as words)
 1    ``science``      share of the words that are science-topic words
 2    ``formality``    formal markers (``therefore``, ``moreover``, ...)
 3    ``numbers``      number tokens (``17``, ``204``)
 4    ``hedging``      hedges (``perhaps``, ``likely``, ...)
 5    ``politeness``   polite words (``please``, ``thanks``, ...)
 6    ``casual``       casual markers (``yeah``, ``cool``, ...)
 7    ``cooking``      share of the words that are cooking-topic words
====  ===============  ==============================================================

The features are the attributes standardised by the generator's own distribution
(`TextPersonas.features`): φ_j = (value_j − center_j) / scale_j, center and scale the mean and
standard deviation of attribute j over the responses the generator writes (closed forms for the
counts; a fixed-seed Monte Carlo for the two shares). With `PersonaConfig`'s defaults, train
personas weight attributes 0–5 and test personas put most weight on ``casual`` and ``cooking``.
Labels are Bradley–Terry on φ read back from the text, never on the numbers the text was
written from, so what a model reads is exactly what labels the pair.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import numpy as np

from troupe.envs.preferences.episodes import Comparison, Episode, FeatureEpisodes, demo_slots, draw_k
from troupe.envs.preferences.personas import PersonaConfig, bt_probability, check_personas
from troupe.platform.errors import ConfigError

ATTRIBUTES = ("length", "science", "formality", "numbers", "hedging", "politeness", "casual", "cooking")
VOCAB = {
    "filler": ("the", "a", "note", "answer", "point", "idea", "here", "is", "about", "this", "we", "can",
               "see", "one", "way", "to", "it", "and", "of", "some"),
    "science": ("atom", "energy", "cell", "gravity", "molecule", "orbit", "protein", "quantum", "enzyme",
                "photon"),
    "formality": ("therefore", "moreover", "furthermore", "consequently", "hence", "regarding"),
    "hedging": ("perhaps", "maybe", "possibly", "likely", "arguably"),
    "politeness": ("please", "thanks", "kindly", "appreciate", "sorry"),
    "casual": ("yeah", "cool", "gonna", "stuff", "okay", "awesome"),
    "cooking": ("recipe", "oven", "garlic", "simmer", "flour", "butter", "onion", "bake", "salt", "pepper"),
}
PROMPTS = ("Write a short note about the weekend.", "Explain the idea in a few words.",
           "Reply to the message below.", "Describe your plan for tomorrow.", "Answer the question briefly.")
# Words drawn per response, each uniform on {lo..hi}. Numbers are written as integers 2..999.
COUNTS = {"filler": (4, 16), "science": (0, 8), "formality": (0, 4), "numbers": (0, 4), "hedging": (0, 4),
          "politeness": (0, 4), "casual": (0, 4), "cooking": (0, 8)}
_WORD = re.compile(r"[a-z]+|\d+")
_CLASS = {w: c for c, words in VOCAB.items() for w in words}
_SHARES = ("science", "cooking")


def attribute_values(text: str) -> np.ndarray:
    """The eight attributes of `ATTRIBUTES`, counted from ``text`` (lower-cased word and number tokens)."""
    tokens = _WORD.findall(text.lower())
    n = len(tokens)
    counts = dict.fromkeys(VOCAB, 0) | {"numbers": 0}
    for t in tokens:
        if t.isdigit():
            counts["numbers"] += 1
        elif t in _CLASS:
            counts[_CLASS[t]] += 1
    science, cooking = (counts[c] / n if n else 0.0 for c in _SHARES)
    return np.array([n, science, counts["formality"], counts["numbers"], counts["hedging"],
                     counts["politeness"], counts["casual"], cooking], dtype=float)


def _uniform_moments(lo: int, hi: int) -> tuple[float, float]:
    return (lo + hi) / 2, ((hi - lo + 1) ** 2 - 1) / 12


def _draw_counts(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {c: rng.integers(lo, hi + 1, size=n) for c, (lo, hi) in COUNTS.items()}


@dataclasses.dataclass
class TextPersonas:
    """Writes responses and reads their features back; personas and episodes as in `personas`."""

    cfg: PersonaConfig = dataclasses.field(default_factory=PersonaConfig)

    def __post_init__(self) -> None:
        if self.cfg.dim != len(ATTRIBUTES):
            raise ConfigError(f"personas.dim={self.cfg.dim}: text responses have {len(ATTRIBUTES)} attributes "
                              f"{ATTRIBUTES}; set personas.dim={len(ATTRIBUTES)}")
        moments = {c: _uniform_moments(*r) for c, r in COUNTS.items()}
        length_mean = sum(m for m, _ in moments.values())
        length_var = sum(v for _, v in moments.values())
        # The shares have no simple closed form: their moments over a fixed-seed sample of counts.
        sample = _draw_counts(np.random.default_rng(0), 200_000)
        total = sum(sample.values())
        center, scale = [], []
        for name in ATTRIBUTES:
            if name == "length":
                m, s = length_mean, np.sqrt(length_var)
            elif name in _SHARES:
                share = sample[name] / total
                m, s = float(share.mean()), float(share.std())
            else:
                m, s = moments[name][0], np.sqrt(moments[name][1])
            center.append(m)
            scale.append(s)
        self.center = np.array(center)
        self.scale = np.array(scale)

    def features(self, texts: str | Sequence[str]) -> np.ndarray:
        """φ of each text, (n, 8) (or (8,) for one): its attributes standardised."""
        if isinstance(texts, str):
            return (attribute_values(texts) - self.center) / self.scale
        return (np.stack([attribute_values(t) for t in texts]) - self.center) / self.scale

    def write(self, rng: np.random.Generator, n: int) -> list[str]:
        """n responses, each a shuffled sentence of its drawn word counts."""
        counts = _draw_counts(rng, n)
        texts = []
        for i in range(n):
            words = [str(int(v)) for v in rng.integers(2, 1000, size=counts["numbers"][i])]
            for c in VOCAB:
                words += list(rng.choice(VOCAB[c], size=counts[c][i]))
            rng.shuffle(words)
            texts.append(" ".join(words).capitalize() + ".")
        return texts

    def episodes(self, personas: np.ndarray, n: int, rng: np.random.Generator,
                 k: int | tuple[int, int] | None = None, names: Sequence[str] | None = None) -> list[Episode]:
        """n text episodes: a persona drawn from ``personas`` (named by ``names``, default ``persona-i``),
        ``k`` demos (int or ``(lo, hi)``, default ``(0, max_demos)``) and a query, all labelled by
        BT on the features read from the text."""
        w_all = check_personas(self.cfg, personas)
        names = list(names) if names is not None else [f"persona-{i}" for i in range(len(w_all))]
        if len(names) != len(w_all):
            raise ConfigError(f"{len(names)} persona names for {len(w_all)} personas; give one name each")
        ks = draw_k(n, (0, self.cfg.max_demos) if k is None else k, rng)
        out = []
        for i in range(n):
            who = int(rng.integers(len(w_all)))
            pairs = []
            for _ in range(int(ks[i]) + 1):
                a, b = self.write(rng, 2)
                p = float(bt_probability(w_all[who], self.features(a), self.features(b), self.cfg.beta0))
                pairs.append(Comparison(str(rng.choice(PROMPTS)), a, b, int(rng.random() < p)))
            out.append(Episode(tuple(pairs[:-1]), pairs[-1], names[who]))
        return out

    def feature_episodes(self, episodes: Sequence[Episode], personas: np.ndarray,
                         names: Sequence[str] | None = None) -> FeatureEpisodes:
        """The same episodes in numbers, φ read from each text (p_true from ``personas``, the episode's
        objective looked up in ``names``, default ``persona-i``)."""
        w_all = check_personas(self.cfg, personas)
        names = list(names) if names is not None else [f"persona-{i}" for i in range(len(w_all))]
        n, d = len(episodes), self.cfg.dim
        capacity = max([e.k for e in episodes] + [1])
        chosen, rejected = np.zeros((2, n, capacity, d))
        demo_label = np.zeros((n, capacity), dtype=np.int64)
        for i, e in enumerate(episodes):
            if e.k:
                demo_label[i, : e.k] = [c.label for c in e.demos]
                chosen[i, : e.k] = self.features([c.chosen for c in e.demos])
                rejected[i, : e.k] = self.features([c.rejected for c in e.demos])
        qa = self.features([e.query.a for e in episodes])
        qb = self.features([e.query.b for e in episodes])
        unknown = sorted({e.objective for e in episodes} - set(names))
        if unknown:
            raise ConfigError(f"episodes of objective(s) {unknown} that are not among the persona names "
                              f"{names}; give the names the episodes were drawn with")
        who = np.array([names.index(e.objective) for e in episodes])
        mask = demo_slots(np.array([e.k for e in episodes]), capacity)
        label = np.array([e.query.label for e in episodes], dtype=np.int64)
        return FeatureEpisodes(chosen, rejected, mask, demo_label, qa, qb, label,
                               bt_probability(w_all[who], qa, qb, self.cfg.beta0), who)


@dataclasses.dataclass(frozen=True)
class ResponsePool:
    """Responses written once, with the features read back from their text: episodes drawn from a
    pool cost index draws, not text generation (a learner draws thousands of pairs per second)."""

    texts: tuple[str, ...]
    features: np.ndarray  # (n, 8), `TextPersonas.features` of each text
    prompts: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.texts)


def response_pool(personas: TextPersonas, n: int, rng: np.random.Generator) -> ResponsePool:
    """``n`` responses of ``personas``' generator, each with a prompt drawn from `PROMPTS`."""
    texts = personas.write(rng, n)
    return ResponsePool(tuple(texts), personas.features(texts), tuple(str(p) for p in rng.choice(PROMPTS, size=n)))


def pool_episodes(personas: TextPersonas, pool: ResponsePool, weights: np.ndarray, n: int, rng: np.random.Generator,
                  k: int | tuple[int, int] | None = None, names: Sequence[str] | None = None) -> list[Episode]:
    """As `TextPersonas.episodes`, with every response drawn from ``pool`` (each pair of two distinct
    responses), labels Bradley–Terry on the pool's features."""
    w_all = check_personas(personas.cfg, weights)
    names = list(names) if names is not None else [f"persona-{i}" for i in range(len(w_all))]
    if len(names) != len(w_all):
        raise ConfigError(f"{len(names)} persona names for {len(w_all)} personas; give one name each")
    if len(pool) < 2:
        raise ConfigError(f"a response pool of {len(pool)} responses; pairs need at least 2")
    ks = draw_k(n, (0, personas.cfg.max_demos) if k is None else k, rng)
    who = rng.integers(len(w_all), size=n)
    out = []
    for i in range(n):
        m = int(ks[i]) + 1
        a = rng.integers(len(pool), size=m)
        b = (a + rng.integers(1, len(pool), size=m)) % len(pool)  # never a response against itself
        p = bt_probability(w_all[who[i]], pool.features[a], pool.features[b], personas.cfg.beta0)
        won = rng.random(m) < p
        pairs = [Comparison(pool.prompts[a[j]], pool.texts[a[j]], pool.texts[b[j]], int(won[j])) for j in range(m)]
        out.append(Episode(tuple(pairs[:-1]), pairs[-1], names[who[i]]))
    return out
