"""Planted documents for the curation tests: prose that passes every quality rule, and the
documents each stage is meant to remove."""

from __future__ import annotations

import random

VOCAB = ("people world country history science water garden village market winter summer river mountain "
         "teacher student family friend morning evening letter window kitchen station engine doctor "
         "bridge forest island harbour museum library painter farmer council season weather journey "
         "question answer problem reason example picture number language").split()
VERBS = "visited described noticed discovered remembered finished carried followed opened painted built studied".split()
ADJ = "quiet bright narrow famous gentle ancient simple modern heavy careful early useful".split()


def sentence(r: random.Random) -> str:
    return (f"The {r.choice(ADJ)} {r.choice(VOCAB)} of the {r.choice(VOCAB)} {r.choice(VERBS)} "
            f"a {r.choice(ADJ)} {r.choice(VOCAB)} with the {r.choice(VOCAB)} and {r.choice(VOCAB)}.")


def prose(seed: int, sentences: int = 14) -> str:
    """English-looking text: every line two sentences ending in '.', stop words present, no
    repeated lines, mean word length ~5."""
    r = random.Random(seed)
    s = [sentence(r) for _ in range(sentences)]
    return "\n".join(" ".join(s[i:i + 2]) for i in range(0, len(s), 2))


GERMAN = ("Die Stadt liegt an einem breiten Fluss, und im Sommer kommen viele Besucher aus dem ganzen Land. "
          "Der alte Markt ist jeden Morgen voller Menschen, die Obst, Gemüse und frisches Brot kaufen wollen. "
          "Am Abend sitzen die Familien in den Gärten und sprechen über die Arbeit und das Wetter.")
FRENCH = ("La ville se trouve au bord d'une large rivière, et en été de nombreux visiteurs viennent de tout le pays. "
          "Le vieux marché est plein de monde chaque matin, et les gens achètent des fruits, des légumes et du pain. "
          "Le soir, les familles restent dans les jardins et parlent du travail et du temps qu'il fait.")
ENGLISH = ("The town lies on a wide river, and in summer many visitors come from all over the country. "
           "The old market is full of people every morning who want to buy fruit, vegetables and fresh bread. "
           "In the evening the families sit in their gardens and talk about work and the weather.")


def near_copy(text: str, every: int, seed: int = 0) -> str:
    """`text` with every `every`-th word replaced by a word not in the vocabulary."""
    r = random.Random(seed)
    out = []
    for i, w in enumerate(text.split(" ")):
        out.append(f"zq{r.randrange(10**6)}" + ("." if w.endswith(".") else "") if i % every == every - 1 else w)
    return " ".join(out)
