"""Which sentences name a person: the words the person discount reads a text query by (training/models/concepts.py
``unfamiliarity``, index/people.py), and the words ``jointspace concepts`` labels a training photo's captions by.

English only, as the model's text side. Words, not the model: the trained embedding puts "a person" closest to the
photos with the least content (a texture, a star field), so it cannot say whether a query is about people, and the
shipped model's text side puts "a pilot" nearer "a photo of a warplane." than "a photo of a person." (0.55 against
0.24); the words can. Three lists: :data:`PERSON_WORDS`, written by hand (pronouns, plurals, "face" and "selfie",
"fireman", whose first WordNet sense is a children's game), :data:`GROUP_WORDS` ("couple", "team", "crowd"), which
count unless an "of" says what the group is of ("a couple of apples"), and the nouns WordNet 3.0 files under
``noun.person`` whose main sense is a person (``person_nouns.txt``, about 4,700: "pilot", "scientist",
"grandmother"; written by benchmarks/person_nouns.py, whose docstring has the rules). A plural counts as its
singular ("pilots", "businessmen"). Nouns that also name things are left out ("player": a CD player; "boxer" and
"shepherd": dogs; "whale", whose first WordNet sense is a very large person, "hood", and "primate", a bishop before
an ape; "monarch": an ImageNet butterfly) unless a WordNet phrase for a person says which ("a baseball player", "a
guitar player"); the words of an ImageNet class's name that is not a person do not count ("king penguin", "Granny
Smith"), nor those of WordNet's several-word nouns for a thing ("pilot whale", "worker bee"), nor does a possessive
("lady's slipper", an orchid).
"""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path

PERSON_WORDS = (
    "man", "men", "woman", "women", "person", "persons", "people", "boy", "boys", "girl", "girls", "child",
    "children", "kid", "kids", "baby", "babies", "toddler", "toddlers", "teenager", "teenagers", "teen", "teens",
    "lady", "ladies", "guy", "guys", "gentleman", "gentlemen", "someone", "somebody", "he", "she",
    "adult", "adults", "human", "humans", "mother", "father", "mom", "dad", "son", "daughter", "brother", "sister",
    "bride", "groom", "worker", "workers", "photographer", "photographers", "astronaut", "astronauts", "soldier",
    "soldiers", "policeman", "policemen", "doctor", "nurse", "student", "students", "tourist", "tourists", "dancer",
    "dancers", "skier", "skiers", "surfer", "surfers", "snowboarder", "snowboarders", "cyclist", "cyclists", "biker",
    "bikers", "rider", "riders", "climber", "climbers", "runner", "runners", "swimmer", "swimmers", "diver", "divers",
    "fisherman", "fishermen", "fireman", "firemen", "farmer", "farmers", "chef", "clown", "clowns", "spectators",
    "face", "faces", "selfie", "selfies",
)
GROUP_WORDS = ("crowd", "crowds", "family", "families", "audience", "audiences", "couple", "couples", "team", "teams")
# groups of people, unless "of" follows: "a couple of apples", "a family of ducks" ("a crowd of people": people);
# "a family of four" counts
LEFT_OUT = ("player", "boxer", "shepherd", "whale", "hood", "primate")   # person nouns that name common things
                                                                         # too (benchmarks/person_nouns.py)
NOUNS_FILE = Path(__file__).with_name("person_nouns.txt")
_WORD = re.compile(r"[a-z]+(?:['’]s\b)?")
_NUMBER = r"(?:\d+|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)(?![a-z])"
_OF = re.compile(r"\s+of(?![a-z])(?!\s+" + _NUMBER + ")")       # "of" but "of four": "a family of four"


@cache
def _lexicon() -> tuple[frozenset[str], re.Pattern | None, dict[str, tuple[str, ...]]]:
    """(every word that names a person, the pattern of the phrases that name one ("baseball player", and its
    plural), the thing phrases whose words do not count ("king penguin", "pilot whale") by each of their words that
    would count)."""
    lines = [line.strip() for line in NOUNS_FILE.read_text().splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    words = frozenset(PERSON_WORDS) | {line for line in lines if ":" not in line}
    people = [line.removeprefix("person:").strip() for line in lines if line.startswith("person:")]
    things: dict[str, list[str]] = {}
    for line in lines:
        if line.startswith("thing:"):
            phrase = line.removeprefix("thing:").strip().lower()
            for token in dict.fromkeys(_WORD.findall(phrase)):
                if _counts(token, words) or token in GROUP_WORDS:
                    things.setdefault(token, []).append(phrase)
    return words, _phrases(people), {w: tuple(p) for w, p in things.items()}


def _phrases(phrases: list[str]) -> re.Pattern | None:
    """Any of ``phrases`` as a whole (no letter just before or after), or its plural ("s" or "es" after it), the
    longest first. None for no phrase."""
    if not phrases:
        return None
    alternatives = "|".join(re.escape(p) for p in sorted(phrases, key=len, reverse=True))
    return re.compile(r"(?<![a-z])(?:" + alternatives + r")(?:e?s)?(?![a-z])")


def singulars(word: str) -> tuple[str, ...]:
    """``word`` and what it is the plural of, by English's regular rules ("pilots", "nannies", "coaches",
    "businessmen")."""
    out = [word]
    if word.endswith("men"):
        out.append(word[:-3] + "man")
    if word.endswith("ies"):
        out.append(word[:-3] + "y")
    if word.endswith(("ses", "xes", "zes", "ches", "shes")):
        out.append(word[:-2])
    if word.endswith("s"):
        out.append(word[:-1])
    return tuple(out)


def names_person(text: str) -> bool:
    """Whether ``text`` names a person: it holds a person phrase ("a baseball player"), or one of its words (not a
    possessive, not part of a thing phrase) is one of :data:`PERSON_WORDS` or of the WordNet nouns, or the plural of
    one, or one of :data:`GROUP_WORDS` that no "of" follows."""
    words, people, things = _lexicon()
    lowered = text.lower()
    if people is not None and people.search(lowered):
        return True
    return any(_person_word(lowered, m, words)
               and not _in_thing(lowered, m, tuple(p for w in singulars(m.group()) for p in things.get(w, ())))
               for m in _WORD.finditer(lowered))


def _person_word(text: str, word: re.Match, words: frozenset[str]) -> bool:
    """Whether ``word`` (a match in ``text``) is a word for a person, or a group of people that no "of" follows (but
    "of" and a number)."""
    if word.group() in GROUP_WORDS:
        return not _OF.match(text, word.end())
    return _counts(word.group(), words)


def _in_thing(text: str, word: re.Match, phrases: tuple[str, ...]) -> bool:
    """Whether ``word`` (a match in ``text``) lies within one of ``phrases`` there, as a whole or its plural (no
    letter just before, none after it or after an "s" or "es" there: "pilot whales"; "kite (bird of prey)" ends in a
    parenthesis)."""
    start, end = word.span()
    for phrase in phrases:
        at = text.find(phrase, max(0, end - len(phrase) - 2))
        while 0 <= at <= start:
            after = at + len(phrase)
            tail = _plural_tail(text, after)
            if tail is not None and after + tail >= end and not (at and text[at - 1].isalpha()):
                return True
            at = text.find(phrase, at + 1)
    return False


def _plural_tail(text: str, at: int) -> int | None:
    """How many letters after ``at`` in ``text`` end the word there: 0, or those of a plural's "s" or "es"; None if
    the word goes on."""
    return next((len(tail) for tail in ("", "s", "es") if text.startswith(tail, at)
                 and not text[at + len(tail):at + len(tail) + 1].isalpha()), None)


def _counts(token: str, words: frozenset[str]) -> bool:
    if token[-2:] in ("'s", "’s"):          # a possessive: "lady's slipper"
        return False
    return any(w in words for w in singulars(token))
