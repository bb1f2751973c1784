"""The sentence decoder (Show, Translate and Tell): the handlers of ``POST /v1/captions`` (an uploaded image →
generated captions) and ``POST /v1/paraphrases`` (a sentence → paraphrases); their bodies, batchers and
documentation are entries of the table of operations (service/operations.py), which marks them as needing the
decoder: with a model trained without one both answer 409 and say why."""
from __future__ import annotations

from ..contract import Uploaded
from ..schemas import Captions, GeneratedCaptions, GeneratedText, Paraphrase, Paraphrases
from .routing import Call


def _generated(results: list[tuple[str, float]]) -> list[GeneratedText]:
    return [GeneratedText(text=text, score=score) for text, score in results]


async def caption_generation(call: Call, body: Uploaded[Captions]) -> GeneratedCaptions:
    pixels = await call.pixels(body.image)
    results = await call.run((pixels, body.fields.n, body.fields.beam_size))
    return GeneratedCaptions(captions=_generated(results))


async def paraphrase_generation(call: Call, body: Paraphrase) -> Paraphrases:
    results = await call.run((body.text, body.n, body.beam_size))
    return Paraphrases(paraphrases=_generated(results))
