"""What a table of operations is made of, and how every reader of it reads it (the table: service/operations.py).

An :class:`Operation` is one body a model route takes and what the model does with it: its request body (JSON,
or a multipart form with an image: service/contract.py ``Json``/``Upload``), its handler (body → the item its
engine method takes → the response), the engine method that runs a batch of such items, and its admission class
— the batcher (queue) its requests wait in, or ``DIRECT`` for one that runs alone on the compute thread — and
whether it needs the model's sentence decoder. A :class:`Route` is one ``POST`` path with its operations, told
apart by the body's content type (and a JSON body by its keys), and its documentation.

Read by:

* the app (:class:`ServedTable`): one route per :class:`Route`, its bodies bound to the app's limits; its endpoint
  declares the JSON body (a union chosen by the ``when`` keys when several), which FastAPI reads, validates and
  states in the OpenAPI document, and its route class answers first what needs no body (503, 401, 409, 415) and
  reads a multipart form itself (the form reaches the document as ``openapi_extra``: FastAPI states one media type
  per operation);
* admission and in-flight counting (:meth:`ServedTable.admission`, service/middleware.py): which class a request
  is counted under, from its path and whether its body is multipart (the body is not parsed there);
* the state (:func:`queues`, service/state.py): one batcher per queue, running its engine method.
"""
from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from typing import Annotated, Any, Awaitable, Callable, ClassVar, Coroutine, Sequence, Union

import torch
from fastapi import APIRouter, Body, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, Discriminator, Tag

from ..contract import Form, Json, Limits, Upload, Uploaded, error_responses
from ..engine import Engine
from ..settings import Settings
from ..state import DIRECT, BatcherSpec, ServiceState
from .bodies import body_kind, json_value, read_form
from .deps import POST_ERRORS, check_deadline, require_api_key, service, submit, upload_pixels

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

    def json_body(self, route: Route) -> Any:
        """The route's JSON body as its endpoint declares it (None: the route takes no JSON): the bound model, or
        for several a union chosen by their ``when`` keys — the object's key picks the model that validates it, so
        a 422 names that model's fields — which the OpenAPI document states as ``oneOf``."""
        models = [(op, self.models[route.path, op.name]) for op in route.json]
        if not models:
            return None
        if len(models) == 1:
            return models[0][1]
        keys = {op.body.when: op.name for op, _ in models if isinstance(op.body, Json)}

        def pick(value: Any) -> str:
            found = next((key for key in keys if key is not None and isinstance(value, dict) and key in value), None)
            return keys[found] if found is not None or None in keys else next(iter(keys.values()))

        members = tuple(Annotated[model, Tag(op.name)] for op, model in models)
        return Annotated[Union[members], Discriminator(pick)]  # noqa: UP007 (the members are known at run time)

    def _form_body(self, route: Route) -> dict | None:
        """The route's multipart form in the OpenAPI document, from its bound model (service/contract.py
        ``Form.openapi``): FastAPI states one media type per operation — the declared JSON body's — so a route's
        form reaches the document as ``openapi_extra``."""
        if route.form is None:
            return None
        form = self.forms[route.path, route.form.name].openapi(self.max_upload_bytes)
        return {"content": {"multipart/form-data": form}, **({} if route.json else {"required": True})}

    def router(self, **include: Any) -> APIRouter:
        """An ``APIRouter`` with one route per :class:`Route` of the table (``include``: ``APIRouter`` arguments,
        e.g. the API key's dependency)."""
        router = APIRouter(**include)
        for route in self.routes:
            decoder = route.decoder or any(op.decoder for op in route.operations)
            extra: dict[str, Any] = {}
            form = self._form_body(route)
            if form is not None:
                extra["requestBody"] = form
            if route.decoder:
                extra["x-requires-decoder"] = True
            description = "\n\n".join(d for d in (route.description, DECODER_NOTE if route.decoder else None) if d)
            router.add_api_route(route.path, self._endpoint(route), methods=[route.method], name=route.name,
                                 response_model=route.response_model, summary=route.summary,
                                 description=description or None, openapi_extra=extra or None,
                                 route_class_override=self._route_class(route),
                                 responses=error_responses(*POST_ERRORS, *route.errors, *((409,) if decoder else ())))
        return router

    def _endpoint(self, route: Route) -> Callable[..., Awaitable[Any]]:
        """The route's endpoint for a JSON body, its signature the contract FastAPI reads, validates and documents:
        ``body`` is :meth:`json_body`. (A multipart form is read and answered before it, by the route's class.)"""
        ops = [(op, self.models[route.path, op.name]) for op in route.json]

        async def endpoint(request: Request, body: Any = None) -> Any:
            state: ServiceState = request.app.state.service
            op = next(op for op, model in ops if type(body) is model)
            _need_decoder(state, op)
            return await op.handle(Call(request, state, op, body), body)

        params = [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request)]
        declared = self.json_body(route)
        if declared is not None:
            params.append(inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                            annotation=Annotated[declared, Body()]))
        endpoint.__signature__ = inspect.Signature(params)      # type: ignore[attr-defined]
        return endpoint

    def _route_class(self, route: Route) -> type[APIRoute]:
        """The route's class: what must be known before the body is read runs first, on the raw request — the
        service ready (503), the API key (401, 429, 400), the decoder the route needs (409), a content type it takes
        (415) — then a multipart form is read and answered here (service/contract.py ``Form``), and a JSON body is
        read strictly (``bodies.json_value``: 422 for ``NaN`` or an integer of over 100 digits, 400 for bytes that
        are not JSON) into the request's JSON cache, which FastAPI reads (the body is parsed once) and validates
        as the endpoint declares. The API key is checked here only: the router states its schemes in the document
        (``deps.api_key_schemes``) without checking it. Admission and in-flight counting come earlier still, in
        middleware (service/middleware.py)."""
        form, kinds = route.form, tuple(dict.fromkeys(op.body.kind for op in route.operations))
        parser = self.forms[route.path, form.name] if form is not None else None
        keyed = len(route.json) > 1

        class OperationRoute(APIRoute):
            def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
                declared = super().get_route_handler()

                async def handler(request: Request) -> Response:
                    state = await service(request)
                    await require_api_key(request, None, None)
                    if route.decoder:
                        _need_decoder(state, route.operations[0])
                    if body_kind(request, kinds, route.send) == "form" and form is not None and parser is not None:
                        _need_decoder(state, form)          # 409 before an upload is read for nothing
                        data, fields = await read_form(request, state, parser)
                        body = Uploaded(data, fields)
                        return _response(await form.handle(Call(request, state, form, body), body))
                    request._json = await json_value(request)   # Starlette's own cache: FastAPI reads this value
                    try:
                        return await declared(request)
                    except RequestValidationError as err:
                        if keyed:
                            raise _untagged(err) from None
                        raise

                return handler

        return OperationRoute


def _response(answer: Any) -> Response:
    """A handler's answer as the response: a ``Response`` as it is, a response model serialised once."""
    if isinstance(answer, Response):
        return answer
    return Response(answer.model_dump_json(), media_type="application/json")


def _untagged(err: RequestValidationError) -> RequestValidationError:
    """The errors of a body chosen among several by :meth:`ServedTable.json_body`'s union, each located in the body
    as a single model's would be (``["body", field]``): without the union's tag."""
    return RequestValidationError([{**e, "loc": (e["loc"][0], *e["loc"][2:])} if e["loc"][:1] == ("body",)
                                   and len(e["loc"]) > 1 else e for e in err.errors()])
