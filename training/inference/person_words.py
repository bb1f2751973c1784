"""Which sentences name a person: the words the person discount reads a text query by (training/models/concepts.py
``unfamiliarity``, index/people.py), and the words ``jointspace concepts`` labels a training photo's captions by.

English only, as the model's text side. A word list, not the model: the trained embedding puts "a person" closest to
the photos with the least content (a texture, a star field), so it cannot say whether a query is about people; the
words can. Nouns that also name things are left out ("player": a CD player; "boxer" and "shepherd": dogs), and a
possessive ("lady's slipper", an orchid) does not count.
"""
from __future__ import annotations

import re

PERSON_WORDS = (
    "man", "men", "woman", "women", "person", "persons", "people", "boy", "boys", "girl", "girls", "child",
    "children", "kid", "kids", "baby", "babies", "toddler", "toddlers", "teenager", "teenagers", "teen", "teens",
    "lady", "ladies", "guy", "guys", "gentleman", "gentlemen", "someone", "somebody", "he", "she", "crowd", "family",
    "adult", "adults", "human", "humans", "mother", "father", "mom", "dad", "son", "daughter", "brother", "sister",
    "bride", "groom", "worker", "workers", "photographer", "photographers", "astronaut", "astronauts", "soldier",
    "soldiers", "policeman", "policemen", "doctor", "nurse", "student", "students", "tourist", "tourists", "dancer",
    "dancers", "skier", "skiers", "surfer", "surfers", "snowboarder", "snowboarders", "cyclist", "cyclists", "biker",
    "bikers", "rider", "riders", "climber", "climbers", "runner", "runners", "swimmer", "swimmers", "diver", "divers",
    "fisherman", "fishermen", "farmer", "farmers", "chef", "clown", "clowns", "audience", "spectators",
)
_PATTERN = re.compile(r"\b(" + "|".join(PERSON_WORDS) + r")\b(?!['’]s)", re.IGNORECASE)


def names_person(text: str) -> bool:
    """Whether ``text`` names a person (one of :data:`PERSON_WORDS`, as a whole word, not as a possessive)."""
    return bool(_PATTERN.search(text))
