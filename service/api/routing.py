"""What a table of operations is made of, and how every reader of it reads it (the table: service/operations.py).

An :class:`Operation` is one body a model route takes and what the model does with it: its request body (JSON,
or a multipart form with an image: service/contract.py ``Json``/``Upload``), its handler (body → the item its
engine method takes → the response), the engine method that runs a batch of such items, and its admission class
— the batcher (queue) its requests wait in, or ``DIRECT`` for one that runs alone on the compute thread — and
whether it needs the model's sentence decoder. A :class:`Route` is one ``POST`` path with its operations, told
apart by the body's content type (and a JSON body by its keys), and its documentation.

Read by:

* the app (:class:`ServedTable`): one route per :class:`Route`, its bodies bound to the app's limits, its request
  body stated in the OpenAPI document from those bodies (``openapi_extra``; the models in ``components``);
* admission and in-flight counting (:meth:`ServedTable.admission`, service/middleware.py): which class a request
  is counted under, from its path and whether its body is multipart (the body is not parsed there);
* the state (:func:`queues`, service/state.py): one batcher per queue, running its engine method.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, ClassVar, Sequence

import torch
from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import BaseModel

from ..contract import Form, Json, Limits, Upload, Uploaded, error_responses
from ..engine import Engine
from ..settings import Settings
from ..state import DIRECT, BatcherSpec, ServiceState
from .bodies import body_kind, json_value, read_form, validated
from .deps import POST_ERRORS, check_deadline, service, submit, upload_pixels

DECODER_NOTE = ("Needs a model with a sentence decoder (Show, Translate and Tell; `/readyz` says `\"decoder\": "
                "true`); with any other model this route answers 409 and says why.")


@dataclass(frozen=True)
class Operation:
    """One body of a model route and what the model does with it.

    ``handle(call, body)`` turns the validated body into the item ``run`` takes (``await call.run(item)``) and the
    result into the response. ``run(engine, items)``: the engine method over a batch, one result per item. ``queue``:
    the admission class and batcher name (operations that share one share its ``run``); ``DIRECT``: no batcher,
    each request alone on the compute thread. ``decoder``: the operation needs the model's sentence decoder (409
    without one)."""
    name: str
    body: Json | Upload
    queue: str
    run: Callable[[Engine, Sequence[Any]], Sequence[Any]]
    handle: Callable[[Call, Any], Awaitable[Any]]
    decoder: bool = False

    @property
    def words(self) -> str:
        """The operation's name in words, for messages."""
        return self.name.replace("_", " ")


@dataclass(frozen=True)
class Route:
    """A ``POST`` model route: its operations (at most one multipart form, and JSON bodies told apart by their
    ``when`` keys) and its documentation. ``send``: the 415's words for a request of another content type;
    ``errors``: its error responses besides those of every POST route (and the 409 of a decoder operation)."""
    name: str
    path: str
    operations: tuple[Operation, ...]
    response_model: type[BaseModel]
    summary: str
    send: str
    description: str | None = None
    errors: tuple[int, ...] = ()
    method: ClassVar[str] = "POST"

    def __post_init__(self) -> None:
        forms = [op for op in self.operations if op.body.kind == "form"]
        keys = [op.body.when for op in self.operations if isinstance(op.body, Json)]
        if not self.operations or len(forms) > 1 or len(keys) != len(set(keys)):
            raise ValueError(f"{self.path}: a route takes at least one body, at most one form and JSON bodies with "
                             f"distinct 'when' keys (at most one without)")

    @property
    def form(self) -> Operation | None:
        return next((op for op in self.operations if op.body.kind == "form"), None)

    @property
    def json(self) -> list[Operation]:
        return [op for op in self.operations if op.body.kind == "json"]

    @property
    def decoder(self) -> bool:
        """Every operation of the route needs the decoder: the route answers 409 without one, whatever the body."""
        return all(op.decoder for op in self.operations)

    def admitted(self, multipart: bool) -> str:
        """The admission class of a request with (or without) a multipart body: its operation's queue; for JSON
        the first JSON operation's (the keys are not read at admission); ``DIRECT`` for a body no operation takes
        (it will be refused for its content type)."""
        form, json = self.form, self.json
        if multipart:
            return form.queue if form is not None else DIRECT
        return json[0].queue if json else DIRECT


@dataclass(frozen=True)
class Call:
    """One request of an operation, as its handler sees it: the request, the ready service, the operation and its
    validated body (a :class:`~service.contract.Uploaded` for a form)."""
    request: Request
    state: ServiceState
    operation: Operation
    body: Any

    @property
    def root(self) -> str:
        """The path the app is mounted under (``root_path``), for the URIs of an answer."""
        return self.request.scope.get("root_path", "")

    async def pixels(self, data: bytes) -> torch.Tensor:
        """An uploaded image → preprocessed pixels, off the event loop (its deadline checked first)."""
        return await upload_pixels(data, self.state, self.request, self.operation.queue)

    async def run(self, item: Any) -> Any:
        """``item`` through the operation's batcher, with the request's deadline (503 + Retry-After when shed); a
        ``DIRECT`` operation runs it alone on the compute thread once its deadline is checked."""
        op, state = self.operation, self.state
        if op.queue != DIRECT:
            return await submit(state.batchers[op.queue], item, state, self.request)
        check_deadline(self.request, state, DIRECT)
        loop = asyncio.get_running_loop()
        return (await loop.run_in_executor(state.compute_pool, op.run, state.loaded.engine, [item]))[0]


def queues(routes: Sequence[Route]) -> list[BatcherSpec]:
    """The batchers the table's operations use, each once; operations that share a queue must share its engine
    method and decoder need."""
    out: dict[str, BatcherSpec] = {}
    for op in (op for route in routes for op in route.operations if op.queue != DIRECT):
        queue = BatcherSpec(op.queue, op.run, op.decoder)
        if out.setdefault(op.queue, queue) != queue:
            raise ValueError(f"operation {op.name!r} shares queue {op.queue!r} with another operation but not its "
                             f"engine method or decoder need")
    return list(out.values())


def _need_decoder(state: ServiceState, op: Operation) -> None:
    if op.decoder and (not state.has_decoder or (op.queue != DIRECT and op.queue not in state.batchers)):
        raise HTTPException(409, f"{op.words} needs a model with a sentence decoder (Show, Translate and Tell); the "
                                 f"loaded model '{state.loaded.model.cfg.name}' was trained without one "
                                 f"(decoder.enabled: false): serve an STT model, e.g. one trained with "
                                 f"configs/stt.yaml")


class ServedTable:
    """A table of operations as one app serves it: each body bound to the app's limits (and the served model's
    similarity, which bounds ``min_score``)."""

    def __init__(self, routes: Sequence[Route], settings: Settings, similarity: str = "cosine"):
        limits = Limits.of(settings, similarity)
        self.routes = tuple(routes)
        self.max_upload_bytes = settings.max_upload_bytes
        # each operation's body bound to the app's limits, by (path, operation name)
        self.models: dict[tuple[str, str], type[BaseModel]] = {}
        self.forms: dict[tuple[str, str], Form] = {}
        for route in self.routes:
            for op in route.operations:
                if isinstance(op.body, Json):
                    self.models[route.path, op.name] = op.body.bind(limits)
                else:
                    self.forms[route.path, op.name] = op.body.bind(limits)
        paths = [route.path for route in self.routes]
        if len(set(paths)) != len(paths):
            raise ValueError(f"a path twice in the table of operations: {paths}")
        self._admission = {(route.method, route.path): route for route in self.routes}

    def admission(self, method: str, path: str) -> Callable[[bool], str] | None:
        """The admission of a request to ``path`` (which may carry the prefix the app is mounted under): its
        route's :meth:`Route.admitted`, which names its class from whether the body is multipart; None for a path
        that is not a model route."""
        route = self._admission.get((method, path))
        if route is None:
            route = next((r for (m, p), r in self._admission.items() if m == method and path.endswith(p)), None)
        return route.admitted if route is not None else None

    @property
    def schemas(self) -> dict[str, dict]:
        """The JSON bodies' schemas, for the OpenAPI document's ``components`` (the routes refer to them)."""
        return {model.__name__: model.model_json_schema(ref_template="#/components/schemas/{model}")
                for model in self.models.values()}

    def _request_body(self, route: Route) -> dict:
        """The route's request body in the OpenAPI document: its JSON models (``oneOf`` when several) and its
        form."""
        content: dict[str, dict] = {}
        refs = [{"$ref": f"#/components/schemas/{self.models[route.path, op.name].__name__}"} for op in route.json]
        if refs:
            content["application/json"] = {"schema": refs[0] if len(refs) == 1 else {"oneOf": refs}}
        if route.form is not None:
            content["multipart/form-data"] = self.forms[route.path, route.form.name].openapi(self.max_upload_bytes)
        return {"required": True, "content": content}

    def router(self, **include: Any) -> APIRouter:
        """An ``APIRouter`` with one route per :class:`Route` of the table (``include``: ``APIRouter`` arguments,
        e.g. the API key's dependency)."""
        router = APIRouter(**include)
        for route in self.routes:
            decoder = route.decoder or any(op.decoder for op in route.operations)
            extra: dict[str, Any] = {"requestBody": self._request_body(route)}
            if route.decoder:
                extra["x-requires-decoder"] = True
            description = "\n\n".join(d for d in (route.description, DECODER_NOTE if route.decoder else None) if d)
            router.add_api_route(route.path, self._endpoint(route), methods=[route.method], name=route.name,
                                 response_model=route.response_model, summary=route.summary,
                                 description=description or None, openapi_extra=extra,
                                 responses=error_responses(*POST_ERRORS, *route.errors, *((409,) if decoder else ())))
        return router

    def _endpoint(self, route: Route) -> Callable[..., Awaitable[Any]]:
        form, models = route.form, self.models
        parser = self.forms[route.path, form.name] if form is not None else None
        json = {op.body.when: op for op in route.json if isinstance(op.body, Json)}
        kinds = tuple(dict.fromkeys(op.body.kind for op in route.operations))

        async def read(request: Request, state: ServiceState = Depends(service)) -> Call:
            """The request's operation and its validated body: 409 first when the route needs the decoder, then
            415 for a content type no operation takes, then the body's own 4xx."""
            if route.decoder:
                _need_decoder(state, route.operations[0])
            kind = body_kind(request, kinds, route.send)
            body: Any
            if kind == "form" and form is not None and parser is not None:
                data, fields = await read_form(request, state, parser)
                op, body = form, Uploaded(data, fields)
            else:                       # JSON: the operation whose key the object has, else the default
                value = await json_value(request)
                op = next((o for key, o in json.items() if key is not None and isinstance(value, dict)
                           and key in value), json.get(None) or next(iter(json.values())))
                body = validated(value, models[route.path, op.name])
            _need_decoder(state, op)
            return Call(request, state, op, body)

        async def endpoint(call: Call = Depends(read)) -> Any:
            return await call.operation.handle(call, call.body)

        return endpoint
