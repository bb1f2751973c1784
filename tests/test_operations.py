"""The table of operations (service/operations.py) is what the app serves: an operation added to it — here a toy one,
defined in this file alone — gets its route, its request body in the OpenAPI document with the app's limits, its
415/422/409 answers, admission (load shedding at capacity) and in-flight counting, and a batcher of its own that runs
its engine method."""
import asyncio
import re
import threading
from pathlib import Path

from fastapi.testclient import TestClient
from pydantic import BaseModel, Field

from conftest import batch_stats, serve_app
from server_process import wait_ready
from service.api.routing import Call, Operation, Route
from service.app import create_app
from service.contract import Json
from service.operations import OPERATIONS
from service.schemas import Request, Text
from service.settings import Settings


class Echo(Request):
    """A toy body: its text's limit is the app's (JOINTSPACE_MAX_TEXT_CHARS)."""
    text: Text = Field(..., description="a sentence, at most {max_text_chars} characters")


class Embedded(BaseModel):
    dims: int
    counted: int


class Toy:
    """The toy operation's engine method and handler; ``hold`` keeps a batch running until it is set."""

    def __init__(self):
        self.batches: list[int] = []
        self.hold = threading.Event()
        self.hold.set()

    def run(self, engine, items):
        self.hold.wait(30)
        self.batches.append(len(items))
        vectors = engine.embed_texts(list(items))
        return [int(v.shape[0]) for v in vectors]

    async def handle(self, call: Call, body: Echo) -> Embedded:
        counted = call.state.inflight["toy"]          # counted by admission while the request is in
        return Embedded(dims=await call.run(body.text), counted=counted)


def _table(toy: Toy) -> tuple[Route, ...]:
    echo = Route("echo", "/v1/toy/echo", (Operation("toy_echo", Json(Echo), "toy", toy.run, toy.handle),),
                 Embedded, summary="A toy: the dimension of a sentence's embedding", send="send JSON {\"text\": ...}")
    decode = Route("toy_decode", "/v1/toy/decode", (Operation("toy_decoding", Json(Echo), "toy_decoder", toy.run,
                                                              toy.handle, decoder=True),),
                   Embedded, summary="A toy that needs the sentence decoder", send="send JSON {\"text\": ...}")
    return (*OPERATIONS, echo, decode)


def _settings(tiny_model_path, tiny_index_dir, **kwargs) -> Settings:
    return Settings(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0, max_text_chars=40,
                    **kwargs)


def test_a_new_operation_is_served_documented_and_batched(tiny_model_path, tiny_index_dir):
    toy = Toy()
    app = create_app(_settings(tiny_model_path, tiny_index_dir), operations=_table(toy))
    with TestClient(app) as c:
        doc = c.get("/openapi.json").json()
        op = doc["paths"]["/v1/toy/echo"]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Echo"}
        echo = doc["components"]["schemas"]["Echo"]
        assert echo["properties"]["text"]["maxLength"] == 40 and echo["additionalProperties"] is False
        assert "40 characters" in echo["properties"]["text"]["description"]
        assert {"400", "413", "415", "422", "503"} <= set(op["responses"]) and "409" not in op["responses"]
        decode = doc["paths"]["/v1/toy/decode"]["post"]
        assert decode["x-requires-decoder"] is True and "409" in decode["responses"]
        assert "/v1/search/images" in doc["paths"]                          # the table's own routes are still there

        wait_ready(c)
        r = c.post("/v1/toy/echo", json={"text": "a red circle"})
        assert r.status_code == 200, r.text
        dims = c.app.state.service.loaded.engine.embed_texts(["a red circle"]).shape[1]
        assert r.json() == {"dims": dims, "counted": 1}
        assert toy.batches == [1] and c.app.state.service.inflight["toy"] == 0
        assert batch_stats(c.get("/metrics").text, "toy") == (1.0, 1.0)   # its own batcher ran it
        for body, ctype, status, words in ((b'{"text": "a"}', "text/plain", 415, "send JSON"),
                                           (b'{"text": "' + b"a" * 41 + b'"}', "application/json", 422, "at most 40"),
                                           (b'{"text": "a", "n": 1}', "application/json", 422, "n: Extra")):
            r = c.post("/v1/toy/echo", content=body, headers={"content-type": ctype})
            assert r.status_code == status and words in r.json()["detail"], r.text
        r = c.post("/v1/toy/decode", json={"text": "a red circle"})         # the tiny model has no decoder
        assert r.status_code == 409 and "toy decoding needs a model with a sentence decoder" in r.json()["detail"]
        assert toy.batches == [1]


def test_a_new_operation_is_admitted_and_shed_at_capacity(tiny_model_path, tiny_index_dir):
    toy = Toy()
    app = create_app(_settings(tiny_model_path, tiny_index_dir, max_queue=1, deadline_ms=0), operations=_table(toy))

    async def work(c):
        state = app.state.service
        toy.hold.clear()
        first = asyncio.create_task(c.post("/v1/toy/echo", json={"text": "a red circle"}))
        while state.inflight["toy"] == 0:
            await asyncio.sleep(0.01)
        second = await c.post("/v1/toy/echo", json={"text": "a blue square"})      # one request is in: at capacity
        toy.hold.set()
        return await first, second, (await c.get("/metrics")).text

    first, second, metrics = asyncio.run(serve_app(app, work))
    assert first.status_code == 200 and first.json()["counted"] == 1
    assert second.status_code == 503 and "capacity" in second.json()["detail"] and second.headers["retry-after"]
    assert toy.batches == [1]
    assert re.search(r'jointspace_shed_total{batcher="admission",reason="queue_full"} 1\.0', metrics), metrics
    assert re.search(r"^jointspace_in_flight 0\.0$", metrics, re.M)


def test_the_architecture_doc_shows_the_table():
    """docs/architecture.md's table of operations is the table the service serves."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| `POST (\S+)` \| [^|]+ \| `(\w+)`[^|]* \| `(\w+)` \|$", text, re.M)
    table = [(op.name, route.path, op.run.__name__, op.queue) for route in OPERATIONS for op in route.operations]
    assert sorted(rows) == sorted(table) and len(rows) == 7
