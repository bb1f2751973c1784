"""Service settings: command-line flags, else ``JOINTSPACE_*`` environment variables, else these defaults.

Every field reads the environment variable ``JOINTSPACE_<FIELD NAME IN CAPITALS>`` (e.g. ``JOINTSPACE_MAX_BATCH``,
``JOINTSPACE_API_KEY``); docs/service.md lists them.
"""
from __future__ import annotations

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from training.inference.names import BACKENDS, DECODES
from training.inference.shapes import bucket_sizes


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="JOINTSPACE_", extra="ignore")

    model: str = Field("", description="model.pt to serve (empty: the shipped real-photo model)")
    index: str = Field("", description="index directory built with that model (jointspace index build)")
    host: str = "127.0.0.1"
    port: int = 8000
    device: str = Field("auto", pattern="^(auto|cpu|cuda(:[0-9]+)?)$",
                        description="where the encoders and FAISS run; auto = cuda when available")
    backend: str = Field("auto", pattern=f"^({'|'.join(BACKENDS)})$",
                         description="what runs the image backbones (training/inference/backend.py): auto (OpenVINO, "
                                     "else ONNX Runtime, on a CPU; cuda on a CUDA device), eager, openvino, "
                                     "openvino-bf16, onnxruntime or cuda; one that fails to load falls back to eager")
    workers: int = Field(0, ge=0, le=64, description="processes serving the one port as one service (jointspace serve "
                                                     "--workers; service/workers.py): 0 = what the device wants, 1 on "
                                                     "a CPU, one a core up to 8 on CUDA")
    # dynamic batching
    batching: bool = Field(True, description="false: every request is its own forward pass (max_batch = 1)")
    max_batch: int = Field(64, ge=1, le=4096, description="most requests encoded in one forward pass")
    max_wait_ms: float = Field(2.0, ge=0, le=1000,
                               description="longest a request waits for others to join its batch")
    # shape discipline (training/inference/shapes.py): the encoders see only these batch sizes, each warmed before ready
    batch_sizes: str = Field("auto", description="the batch sizes forward passes run at: auto (1, 2, 4, … up to "
                                                 "max_batch, and max_batch) or comma-separated sizes including 1")
    bucket_mode: str = Field("auto", pattern="^(auto|pad|split|off)$",
                             description="how a batch reaches those sizes: pad (one pass at the next size up, the "
                                         "extra rows dropped), split (passes that add up exactly), off (any size), "
                                         "auto (pad on CUDA, off on the CPU)")
    warmup: str = Field("auto", pattern="^(auto|all|smallest|off)$",
                        description="batch sizes run once before /readyz says ready: all, the smallest, none, or "
                                    "auto (all on CUDA, where each new shape costs seconds on its first call; the "
                                    "smallest on the CPU)")
    search_backend: str = Field("auto", pattern="^(auto|faiss|torch)$",
                                description="what searches the index: auto (FAISS, on the GPU with faiss-gpu; a Flat "
                                            "index on a CUDA device without faiss-gpu: matmul + top-k in torch), "
                                            "faiss, or torch (Flat indexes only)")
    # load shedding
    max_queue: int = Field(256, ge=1, description="most requests the model holds at once (their body received: "
                                                  "being parsed and decoded, waiting for a batch, or computed); one "
                                                  "more is answered 503 + Retry-After at once")
    deadline_ms: float = Field(5000.0, ge=0, description="a request whose batch has not begun this long after its "
                                                         "body was complete is answered 503 + Retry-After without "
                                                         "being computed; 0 = no deadline")
    retry_after_s: int = Field(1, ge=1, description="Retry-After seconds sent with every 503")
    decode_workers: int = Field(0, ge=0, description="threads that decode and preprocess uploaded images (0 = 2 "
                                                     "when the model runs on the CPU, every core up to 32 on a GPU)")
    decode: str = Field("auto", pattern=f"^({'|'.join(DECODES)})$",
                        description="where an uploaded or gallery query photo is decoded and cut into views "
                                    "(training/inference/tensor_views.py): auto (torch on a CUDA device, else pil), "
                                    "pil, or torch (a plain JPEG on the model's device, other files by Pillow)")
    # request lines, headers, bodies and thumbnails
    header_timeout_s: float = Field(10.0, gt=0, description="seconds a request's line and headers get from the "
                                                            "connection opening (or the request's first byte on a "
                                                            "kept-alive connection); 408 and closed after")
    body_timeout_s: float = Field(10.0, gt=0, description="seconds a request body gets, plus 1 s for every "
                                                          "body_min_rate bytes it sends; 408 when it has not "
                                                          "arrived by then")
    body_min_rate: int = Field(16_384, ge=1, description="bytes per second a request body must keep up after its "
                                                         "first body_timeout_s seconds (408 below)")
    upload_buffer_bytes: int = Field(256 * 1024 * 1024, ge=1,
                                     description="most bytes of request bodies held at once, counted as they "
                                                 "arrive until each request is answered; an upload that would "
                                                 "overflow it is answered 503 + Retry-After (before it is read "
                                                 "when its Content-Length says so)")
    upload_peer_bytes: int = Field(64 * 1024 * 1024, ge=1,
                                   description="most bytes of request bodies one client address holds at once "
                                               "(counted as upload_buffer_bytes); beyond, its upload is answered "
                                               "503 + Retry-After")
    max_thumbnails: int = Field(16, ge=1, description="most frames and thumbnails (/v1/images/{id}?size=, "
                                                      "/v1/videos/{id}/frame, a video moment's image) being made or "
                                                      "waiting at once, at most half of them heavy; one more is "
                                                      "answered 503 + Retry-After at once")
    thumbnail_workers: int = Field(2, ge=1, description="threads that make frames and thumbnails (not the upload "
                                                        "decoding threads); heavy ones take at most all but one")
    media_memory_bytes: int = Field(512 * 1024 * 1024, ge=1,
                                    description="most memory the frames and thumbnails being made may take at once, "
                                                "each estimated from its file's size before it is decoded (one "
                                                "larger than this runs alone)")
    decode_memory_bytes: int = Field(512 * 1024 * 1024, ge=1,
                                     description="most memory the uploaded images being decoded at once may take, "
                                                 "each estimated from its header by format and mode before it is "
                                                 "decoded: an image estimated above it alone is answered 413, one "
                                                 "that does not fit beside those being decoded 503 + Retry-After")
    max_frame_pixels: int = Field(8 * 1024 * 1024, ge=16 * 16,
                                  description="largest video frame served without ?size=, width × height: a larger "
                                              "frame is scaled down to it while it is decoded")
    torch_threads: int = Field(0, ge=0, description="torch intra-op threads on CPU (0 = all cores but one)")
    # input limits
    max_upload_bytes: int = Field(20 * 1024 * 1024, ge=1, description="largest image upload (413 beyond)")
    max_pixels: int = Field(50_000_000, ge=1, description="largest image in pixels, width × height (413 beyond)")
    max_k: int = Field(100, ge=1, le=10_000, description="largest k a search may ask for (422 beyond)")
    max_text_chars: int = Field(1000, ge=1, description="longest query text, and longest add/subtract form field "
                                                         "(422 beyond)")
    max_terms: int = Field(16, ge=1, description="most words or phrases to add, and to subtract, in one composed "
                                                 "query (422 beyond)")
    max_generated: int = Field(10, ge=1, description="most sentences, and widest beam, one caption or paraphrase "
                                                     "request may ask for (422 beyond)")
    max_thumbnail: int = Field(1024, ge=16, description="largest ?size= of /v1/images/{id} (422 beyond)")
    # access and upkeep
    api_key: SecretStr | None = Field(None, description="when set, every /v1/* route needs it "
                                                        "(header X-API-Key or Authorization: Bearer)")
    allowed_hosts: str = Field("", description="Host names served besides localhost, 127.0.0.1, [::1] and the bound "
                                               "address, comma-separated (the port is not compared; '*.example.com' "
                                               "matches its subdomains, '*' any host); another Host is answered "
                                               "421, so a web page cannot read the service through DNS rebinding")
    cors_origins: str = Field("", description="origins whose web pages may read the API (CORS), comma-separated "
                                              "(e.g. https://photos.example; '*' = any); empty: none, no CORS "
                                              "headers are sent")
    allowed_origins: str = Field("", description="origins (scheme://host[:port]) besides the service's own whose web "
                                                 "pages may send it POSTs, comma-separated ('*' = any); the "
                                                 "cors_origins are allowed too. A POST (any method but GET, HEAD, "
                                                 "OPTIONS) whose Origin header names another origin is answered "
                                                 "403; one without Origin (not from a browser) passes")
    auth_failures_per_minute: int = Field(10, ge=0, description="wrong API keys one client address may send a "
                                                                "minute, in a burst of as many; beyond, its /v1 "
                                                                "requests are answered 429 + Retry-After, right key "
                                                                "or not, until it has waited (0 = no limit)")
    index_mmap: bool = Field(False, description="memory-map the index's FAISS files (IVF inverted lists, Flat "
                                                "vectors) instead of reading them into RAM: start-up reads no "
                                                "vectors, searches read pages from disk or the page cache")
    reload_interval_s: float = Field(2.0, ge=0, description="how often to look for a new index generation "
                                                             "(written by jointspace index add/remove); 0 = never")
    prepare_text_tower: bool = Field(True, description="once ready, prepare the served model's text encoder for "
                                                       "terminal searches (index search --text) in a low-priority "
                                                       "background process, unless the cache holds it (it "
                                                       "holds about 1.4 GB while it converts)")

    @model_validator(mode="after")
    def _batch_sizes_fit(self) -> Settings:
        bucket_sizes(self.batch_sizes, self.max_batch)       # ValueError naming what is wrong
        return self

    @field_validator("api_key", mode="before")
    @classmethod
    def _empty_key_is_none(cls, value):
        """``JOINTSPACE_API_KEY=`` (empty, as docker-compose passes an unset variable) means no key."""
        return None if value is None or (isinstance(value, str) and not value.strip()) else value
