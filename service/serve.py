"""``jointspace serve`` — load the model and the index (failing fast with a clear error), then run uvicorn."""
from __future__ import annotations

import argparse
import errno
import logging
import os
import socket
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .settings import Settings
    from .workers import Worker


def add_commands(sub: argparse._SubParsersAction) -> None:
    from training.inference.names import BACKEND_HELP, BACKENDS   # torch-free: the parser is built without the model code

    p = sub.add_parser("serve", help="serve text→image and image→caption search over HTTP",
                       description="Settings not given as flags come from JOINTSPACE_* environment variables "
                                   "(see service/settings.py and docs/service.md).")
    p.add_argument("--model", help="model.pt (env JOINTSPACE_MODEL; default: the shipped real-photo model)")
    p.add_argument("--index", help="index directory (env JOINTSPACE_INDEX)")
    p.add_argument("--host", help="bind address (env JOINTSPACE_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (env JOINTSPACE_PORT, default 8000)")
    p.add_argument("--device", help="auto | cpu | cuda (env JOINTSPACE_DEVICE)")
    p.add_argument("--workers", type=int, help="processes serving the one port, each with the model, as one service "
                                               "(shared admission count, metrics of the whole service); 0 = what "
                                               "the device wants: 1 on a CPU, one a core up to 8 on CUDA (env "
                                               "JOINTSPACE_WORKERS, default 0)")
    p.add_argument("--backend", choices=BACKENDS, help=BACKEND_HELP)
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
    from index.generations import read_manifest
    from training.inference.pretrained import model_file

    from .settings import Settings

    given = {k: v for k, v in vars(args).items()
             if k in Settings.model_fields and v is not None}
    settings = Settings(**given)
    if not settings.index:
        raise ValueError("serve needs an index: --index or JOINTSPACE_INDEX (and the model it was built with: "
                         "--model, JOINTSPACE_MODEL, or the shipped model by default)")
    settings.model = str(model_file(settings.model))
    read_manifest(settings.index)                # a wrong index is said before the model loads
    with bind_socket(settings.host, settings.port) as listening:  # a busy port is said at once, before torch and the model
        workers = _workers(settings)
        if workers == 1:
            return _serve(settings, listening, args.log_level)
        from .workers import Supervisor

        logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return Supervisor(settings, listening, args.log_level, workers, _worker_main).run()


def _workers(settings: Settings) -> int:
    """The worker processes to run: ``settings.workers``, or for 0 what the device wants
    (service/workers.py ``auto_workers``)."""
    if settings.workers:
        return settings.workers
    from training.data.features import usable_cores
    from training.inference.device import resolve_device

    from .workers import auto_workers

    return auto_workers(resolve_device(settings.device).type, usable_cores())


def _worker_main(index: int, count: int, settings: Settings, listening: socket.socket, log_level: str, slots,
                 parent: int) -> None:
    """One worker process of ``serve --workers`` (service/workers.py): serves ``settings`` on the inherited socket
    ``listening`` until stopped, or until its parent is gone."""
    import threading

    from tqdm import tqdm

    from .workers import START_FAILED, SharedAdmission, Worker, watch_parent, worker_device

    threading.Thread(target=watch_parent, args=(parent,), daemon=True, name="jointspace-parent").start()
    # tqdm's default lock is a multiprocessing semaphore, which a worker (ended by os._exit, as multiprocessing ends
    # its processes) never unlinks: the resource tracker would warn of it at every stop. A thread lock is enough.
    tqdm.set_lock(threading.RLock())
    settings = settings.model_copy(update={"device": worker_device(settings.device, index)})
    try:
        code = _serve(settings, listening, log_level, worker=Worker(index, count, SharedAdmission(slots, index)))
    except (ValueError, OSError, KeyError, RuntimeError) as err:    # loading failed: it would fail again
        print(f"jointspace serve: worker {index}: error: {err}", file=sys.stderr, flush=True)
        code = START_FAILED
    raise SystemExit(code)


def _serve(settings: Settings, listening: socket.socket, log_level: str, worker: Worker | None = None) -> int:
    """Loads the model and the index, then serves them on the bound socket ``listening`` until stopped;
    ``worker``: this process is one of ``serve --workers N``'s (service/workers.py)."""
    import uvicorn

    from index.gallery import Gallery
    from training.models.checkpoint import load_model
    from training.inference.device import resolve_device

    from .app import create_app
    from .connection import http_protocol

    name = "%(name)s" if worker is None else f"%(name)s[worker {worker.index}]"
    logging.basicConfig(level=log_level.upper(), format=f"%(asctime)s %(levelname)s {name}: %(message)s")
    device = resolve_device(settings.device)
    model = load_model(settings.model, device)
    gallery = Gallery.load(settings.index, model=model, device=device,     # refuses another model's index
                           mmap=settings.index_mmap, backend=settings.search_backend)
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    host = f"[{host}]" if ":" in host else host
    if worker is None or worker.index == 0:
        workers = "" if worker is None else f"; {worker.count} workers"
        print(f"search page: http://{host}:{settings.port}/  ({gallery.images.ntotal} images, "
              f"{gallery.captions.ntotal} captions; API docs: /docs{workers})", flush=True)
    app = create_app(settings, model=model, gallery=gallery, worker=worker)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=log_level, access_log=False,
                            http=http_protocol(settings.header_timeout_s))
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[listening])
    except KeyboardInterrupt:
        pass
    except SystemExit:                  # uvicorn's answer to a failed start-up: a worker's loading failed
        if worker is None:
            raise
    if worker is not None and not server.started and app.state.service.error is not None:
        raise RuntimeError(app.state.service.error)      # a worker that could not load: not worth a restart
    return 0 if server.started else 1


def bind_socket(host: str, port: int) -> socket.socket:
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
