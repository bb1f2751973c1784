"""``jointspace serve`` — load the model and the index (failing fast with a clear error), then run uvicorn."""
from __future__ import annotations

import argparse
import errno
import logging
import os
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .settings import Settings


def add_commands(sub: argparse._SubParsersAction) -> None:
    from training.inference.names import BACKENDS   # torch-free: the parser is built without the model code

    p = sub.add_parser("serve", help="serve text→image and image→caption search over HTTP",
                       description="Settings not given as flags come from JOINTSPACE_* environment variables "
                                   "(see service/settings.py and docs/service.md).")
    p.add_argument("--model", help="model.pt (env JOINTSPACE_MODEL; default: the shipped real-photo model)")
    p.add_argument("--index", help="index directory (env JOINTSPACE_INDEX)")
    p.add_argument("--host", help="bind address (env JOINTSPACE_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (env JOINTSPACE_PORT, default 8000)")
    p.add_argument("--device", help="auto | cpu | cuda (env JOINTSPACE_DEVICE)")
    p.add_argument("--backend", choices=BACKENDS, help="what runs the image backbones: auto (OpenVINO, else ONNX "
                                                       "Runtime, on a CPU; cuda on a CUDA device), eager, openvino, "
                                                       "openvino-bf16, onnxruntime or cuda (env JOINTSPACE_BACKEND)")
    p.add_argument("--no-batching", dest="batching", action="store_const", const=False,
                   help="encode every request on its own (env JOINTSPACE_BATCHING=false)")
    p.add_argument("--max-batch", type=int, help="env JOINTSPACE_MAX_BATCH (default 64)")
    p.add_argument("--max-wait-ms", type=float, help="env JOINTSPACE_MAX_WAIT_MS (default 2)")
    p.add_argument("--max-queue", type=int, help="most requests the model holds at once; one more is answered "
                                                 "503 + Retry-After (env JOINTSPACE_MAX_QUEUE, default 256)")
    p.add_argument("--deadline-ms", type=float, help="a request whose batch has not begun this long after its "
                                                     "body was complete is answered 503 + Retry-After, not "
                                                     "computed; 0 = none (env JOINTSPACE_DEADLINE_MS, default 5000)")
    p.add_argument("--header-timeout-s", type=float, help="seconds a request's line and headers get; 408 and the "
                                                          "connection closed after (env JOINTSPACE_HEADER_TIMEOUT_S, "
                                                          "default 10)")
    p.add_argument("--body-timeout-s", type=float, help="seconds a request body gets, plus 1 s per --body-min-rate "
                                                        "bytes sent; 408 after (env JOINTSPACE_BODY_TIMEOUT_S, "
                                                        "default 10)")
    p.add_argument("--body-min-rate", type=int, help="bytes/s a request body must keep up (env "
                                                     "JOINTSPACE_BODY_MIN_RATE, default 16384)")
    p.add_argument("--batch-sizes", help="the batch sizes forward passes run at: auto (powers of two up to "
                                         "--max-batch) or e.g. 1,4,16,64 (env JOINTSPACE_BATCH_SIZES)")
    p.add_argument("--bucket-mode", choices=["auto", "pad", "split", "off"],
                   help="how batches reach those sizes (env JOINTSPACE_BUCKET_MODE, default auto: pad on CUDA, "
                        "off on the CPU)")
    p.add_argument("--warmup", choices=["auto", "all", "smallest", "off"],
                   help="batch sizes run before /readyz says ready (env JOINTSPACE_WARMUP, default auto: all on "
                        "CUDA, the smallest on the CPU)")
    p.add_argument("--search-backend", choices=["auto", "faiss", "torch"],
                   help="what searches the index (env JOINTSPACE_SEARCH_BACKEND, default auto)")
    p.add_argument("--allowed-hosts", help="Host names served besides the loopback names and the bound address, "
                                           "comma-separated (env JOINTSPACE_ALLOWED_HOSTS); others get 421")
    p.add_argument("--cors-origins", help="origins allowed to read the API cross-site, comma-separated "
                                          "(env JOINTSPACE_CORS_ORIGINS; default none)")
    p.add_argument("--index-mmap", dest="index_mmap", action="store_const", const=True,
                   help="memory-map the index files instead of reading them into RAM (env JOINTSPACE_INDEX_MMAP)")
    p.add_argument("--log-level", default=os.environ.get("JOINTSPACE_LOG_LEVEL", "info"),
                   choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=cmd_serve)


def cmd_serve(args) -> int:
    from index.cli import model_file, read_index

    from .settings import Settings

    given = {k: v for k, v in vars(args).items()
             if k in Settings.model_fields and v is not None}
    settings = Settings(**given)
    if not settings.index:
        raise ValueError("serve needs an index: --index or JOINTSPACE_INDEX (and the model it was built with: "
                         "--model, JOINTSPACE_MODEL, or the shipped model by default)")
    settings.model = str(model_file(settings.model))
    read_index(settings.index)
    with bind(settings.host, settings.port) as listening:  # a busy port is said at once, before torch and the model
        return _serve(settings, listening, args.log_level)


def _serve(settings: Settings, listening: socket.socket, log_level: str) -> int:
    """Loads the model and the index, then serves them on the bound socket ``listening`` until stopped."""
    import uvicorn

    from index.gallery import Gallery
    from training.models.checkpoint import load_model
    from training.inference.device import resolve_device

    from .app import create_app
    from .protocol import http_protocol

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    device = resolve_device(settings.device)
    model = load_model(settings.model, device)
    gallery = Gallery.load(settings.index, model=model, device=device,     # refuses another model's index
                           mmap=settings.index_mmap, backend=settings.search_backend)
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    host = f"[{host}]" if ":" in host else host
    print(f"search page: http://{host}:{settings.port}/  ({gallery.images.ntotal} images, "
          f"{gallery.captions.ntotal} captions; API docs: /docs)", flush=True)
    config = uvicorn.Config(create_app(settings, model=model, gallery=gallery), host=settings.host,
                            port=settings.port, log_level=log_level, access_log=False,
                            http=http_protocol(settings.header_timeout_s))
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[listening])
    except KeyboardInterrupt:
        pass
    return 0 if server.started else 1


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (as uvicorn binds one: SO_REUSEADDR, so a port in TIME_WAIT is
    taken); OSError saying what to do when the port is taken or the address is not this machine's."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as err:
        raise OSError(f"cannot listen on {host}: {err.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        hint = (" (another server is listening there: stop it, or choose another port with --port, or PORT=… "
                "for make demo)" if err.errno == errno.EADDRINUSE else "")
        raise OSError(f"cannot listen on {host}:{port}: {err.strerror}{hint}") from None
    sock.set_inheritable(True)
    return sock
