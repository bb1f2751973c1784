"""The sentence decoder (Show, Translate and Tell): ``POST /v1/captions`` (an uploaded image → generated
captions) and ``POST /v1/paraphrases`` (a sentence → paraphrases). With a model trained without a decoder both
answer 409 and say why."""
from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Request

from ..batcher import DynamicBatcher
from ..contract import error_responses
from ..schemas import GeneratedCaptions, GeneratedText, Paraphrases
from ..state import ServiceState
from .bodies import body_kind, read_form, read_json
from .deps import POST_ERRORS, service, submit, upload_pixels

router = APIRouter(prefix="/v1")

DECODER_NOTE = ("Needs a model with a sentence decoder (Show, Translate and Tell; `/readyz` says `\"decoder\": "
                "true`); with any other model this route answers 409 and says why.")


def _decoder(batcher: DynamicBatcher | None, state: ServiceState, what: str) -> DynamicBatcher:
    """The decoder route's batcher (the state creates it when the loaded model has a decoder); 409 without."""
    if batcher is None or not state.has_decoder:
        raise HTTPException(409, f"{what} needs a model with a sentence decoder (Show, Translate and Tell); the "
                                 f"loaded model '{state.loaded.model.cfg.name}' was trained without one "
                                 f"(decoder.enabled: false): serve an STT model, e.g. one trained with "
                                 f"configs/stt.yaml")
    return batcher


def _generated(results: list[tuple[str, float]]) -> list[GeneratedText]:
    return [GeneratedText(text=text, score=score) for text, score in results]


def _decoder_route(path: str, response_model: type, summary: str):
    """A POST route that needs the decoder: its 409, and ``x-requires-decoder`` in the OpenAPI document."""
    return router.post(path, response_model=response_model, responses=error_responses(*POST_ERRORS, 409),
                       summary=summary, description=DECODER_NOTE, openapi_extra={"x-requires-decoder": True})


@_decoder_route("/captions", GeneratedCaptions, "Image → generated captions, best first (needs a model with a "
                                                "decoder)")
async def captions(request: Request, state: ServiceState = Depends(service)):
    batcher = _decoder(state.caption_batcher, state, "caption generation")
    body_kind(request, ("form",), "send multipart/form-data with an 'image' file (and optional 'n', 'beam_size')")
    data, body = await read_form(request, state, state.bodies.captions)
    pixels = await upload_pixels(data, state, request, "caption")
    results = await submit(batcher, (pixels, body.n, body.beam_size), state, request)
    return GeneratedCaptions(captions=_generated(results))


@_decoder_route("/paraphrases", Paraphrases, "Sentence → paraphrases, best first, never the sentence itself (needs "
                                             "a model with a decoder)")
async def paraphrases(request: Request, state: ServiceState = Depends(service)):
    batcher = _decoder(state.paraphrase_batcher, state, "paraphrase generation")
    body_kind(request, ("json",), "send JSON {\"text\": ..., \"n\": ..., \"beam_size\": ...}")
    body = await read_json(request, state.bodies.paraphrase)
    results = await submit(batcher, (body.text, body.n, body.beam_size), state, request)
    return Paraphrases(paraphrases=_generated(results))
