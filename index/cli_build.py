"""``jointspace index build`` and ``index samples``: finding what a new index holds, the query bank, the engine
(in-process or Ray), and the build's report (the parser: index/cli.py)."""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from training.inference.pretrained import model_file

from .cli_common import (ModelChoice, batch_size_for, counted, load_chosen_model, prepare_text_search, read_lines,
                         report_outside, report_skipped, split_media)
from .tta import DEFAULT_TTA

if TYPE_CHECKING:
    from training.models.protocol import EmbeddingModel


def _ocr_config(wanted: bool | None, lang: str):
    """The build's OCR configuration (``--ocr``/``--no-ocr``: ``wanted`` True/False, None by default;
    ``--ocr-lang``): None with --no-ocr, or by default when Tesseract is missing (said on stderr)."""
    from .ocr import OcrConfig, OcrUnavailableError, check_engine

    if wanted is False:
        return None
    try:
        check_engine(lang)
    except OcrUnavailableError as err:
        if wanted:
            raise
        print(f"jointspace index build: not reading text in photos (--no-ocr to silence this): {err}",
              file=sys.stderr)
        return None
    return OcrConfig(lang=lang)


@dataclass(frozen=True)
class ScanRules:
    """Which files a folder scan takes: ``exclude`` (``--exclude``), the default excludes (unless
    ``--no-default-excludes``) and videos (unless ``--no-videos``)."""
    exclude: tuple[str, ...] = ()
    default_excludes: bool = True
    videos: bool = True


@dataclass(frozen=True)
class Sources:
    """What ``index build`` indexes: ``images`` (``--images``: a folder, one photo or video, or a text file listing
    image files) or the
    ``split`` of a captioned data set (``--data``, ``--split``), and its caption corpus: ``captions`` (a text file)
    or ``caption_split`` (another split of the data set); by default the indexed split's captions."""
    images: str | None = None
    data: str | None = None
    split: str | None = None
    captions: str | None = None
    caption_split: str | None = None


@dataclass
class Found:
    """What :func:`_find_sources` found: the photos and videos to embed, the captions (each with the position of
    its image in ``photos``, or None), the folder filters are relative to (None: no one folder) and the symbolic
    links left out because they leave the folder."""
    photos: list
    videos: list
    captions: list[tuple[str, int | None]]
    image_root: str | None = None
    outside: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class BankChoice:
    """``index build``'s query bank: none when ``off`` (``--no-querybank``); ``source`` (``--querybank``: a text
    file of captions, or a captioned data set whose ``split`` is the bank, ``--querybank-split``); ``beta``
    (``--qb-beta``; None: the model bank's, else the default)."""
    source: str | None = None
    split: str = "train"
    beta: float | None = None
    off: bool = False


def _decode_early(payload: dict, paths: list, device, embedding, tta: str):
    """``index build``'s photos, decoding from before the model (whose file's ``payload`` is read) loads
    (``embed.decode_photos``, well ahead, as ``embedding`` says, on ``device``): the workers decode on the cores
    that building the model and loading its backend leave idle. None: in-process decoding as usual — no photos,
    or an ensemble, whose preprocessing is known once it is built."""
    from training.models.checkpoint import stored_preprocess

    from .embed import PhotoDecoding, decode_photos

    preprocess = stored_preprocess(payload)
    if not paths or preprocess is None:
        return None
    return decode_photos(preprocess, paths, embedding.batch_size, embedding.workers, device, tta=tta,
                         how=PhotoDecoding(ahead=True, decode=embedding.decode))


def _check_engine(engine: str, tta: str | None, ray_flags: dict) -> None:
    """``--engine`` against the options that need the other engine: ``ray_flags`` (the Ray options by flag, None
    when not given) need ``--engine ray``; ``--tta`` needs the in-process engine. Said before the model loads, as
    is an unreachable cluster."""
    if engine != "ray":
        given = [flag for flag, value in ray_flags.items() if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)} need(s) --engine ray")
        return
    if tta not in (None, "none"):
        raise ValueError(f"--tta {tta} needs --engine in-process (the Ray engine's shards embed one view per image)")
    for flag in ("--ray-workers", "--shard-size"):
        if ray_flags[flag] is not None and ray_flags[flag] < 1:
            raise ValueError(f"{flag} must be at least 1")
    if ray_flags["--ray-address"]:
        from .ray_embed import check_address

        check_address(ray_flags["--ray-address"])      # before the model loads: an unreachable cluster fails at once


def _find_sources(sources: Sources, rules: ScanRules) -> Found:
    """The photos, videos and captions ``index build`` indexes (:class:`Sources`), a folder scanned by ``rules``."""
    from training.data.datasets import load_dataset
    from training.data.media import file_head, sniff_image, sniff_video

    from .scan import scan_media

    if sources.data:
        if not sources.split:
            raise ValueError("--data needs --split (the split whose images are indexed)")
        dataset = load_dataset(sources.data)
        records = dataset.split(sources.split).images
        captions: list[tuple[str, int | None]]
        if sources.captions:
            captions = [(t, None) for t in read_lines(sources.captions)]
        elif sources.caption_split and sources.caption_split != sources.split:
            captions = [(c, None) for r in dataset.split(sources.caption_split).images for c in r.captions]
        else:
            captions = [(c, pos) for pos, r in enumerate(records) for c in r.captions]
        return Found([r.path for r in records], [], captions)
    if sources.caption_split:
        raise ValueError("--caption-split needs --data")
    captions = [(t, None) for t in read_lines(sources.captions)] if sources.captions else []
    if not sources.images:
        raise ValueError("give --images or --data")
    listing = Path(sources.images)
    head = file_head(listing) if listing.is_file() else b""
    if sniff_image(head) or sniff_video(head):            # one photo or video
        return Found(*split_media([listing], rules.videos), captions)
    if listing.is_file():
        listed = [p if p.is_absolute() else listing.parent / p for p in map(Path, read_lines(listing))]
        return Found(*split_media(listed, rules.videos), captions)
    scan = scan_media(sources.images, rules.exclude, rules.default_excludes, photos=True, videos=rules.videos)
    return Found(*scan.by_kind(), captions, sources.images, scan.outside)


def cmd_build(args) -> int:
    started = time.perf_counter()
    from training.inference.backend import backend_choice
    from training.inference.device import resolve_device
    from training.models.checkpoint import load_checkpoint

    from .changes import BuildOptions
    from .gallery import EmbedOptions, build
    from .moments import Sampling

    max_memory = _memory_budget(args.max_index_memory, args.factory)
    _check_engine(args.engine, args.tta, {"--ray-address": args.ray_address, "--ray-workers": args.ray_workers,
                                          "--ray-cpus-per-worker": args.ray_cpus_per_worker,
                                          "--ray-gpus-per-worker": args.ray_gpus_per_worker,
                                          "--shard-dir": args.shard_dir, "--shard-size": args.shard_size})
    ocr = _ocr_config(args.ocr, args.ocr_lang)   # before the model loads: a missing engine or language fails at once
    backend_choice(args.backend)                           # an unknown JOINTSPACE_BACKEND, too
    path = model_file(args.model)
    payload = load_checkpoint(path)                        # and a missing or refused model file, before the scan
    sampling = Sampling(args.video_rate, args.video_max_frames, args.video_window, args.video_cut)
    found = _find_sources(Sources(args.images, args.data, args.split, args.captions, args.caption_split),
                          ScanRules(tuple(args.exclude), not args.no_default_excludes, not args.no_videos))
    paths, video_paths = found.photos, found.videos
    steps = {"photos found": time.perf_counter()}          # the start-up's steps (timing_line)
    report_outside(found.outside)
    if not paths and not video_paths:
        raise ValueError("no images or videos to index")
    if video_paths and args.engine == "ray":
        raise ValueError("--engine ray embeds photos only: index videos in-process (or give --no-videos)")
    tta = args.tta or ("none" if args.engine == "ray" else DEFAULT_TTA)
    if not args.quiet:                 # something at once: the model takes seconds to load before the bar shows
        videos_found = f" and {counted(len(video_paths), 'video')}" if video_paths else ""
        print(f"indexing {counted(len(paths), 'photo')}{videos_found}; loading the model…", file=sys.stderr)
    device = resolve_device(args.device)
    embedding = EmbedOptions(batch_size_for(args.batch_size, device), args.workers, not args.quiet, sampling,
                             args.decode)
    decoding = None if args.engine == "ray" else _decode_early(payload, paths, device, embedding, tta)
    try:
        model, _ = load_chosen_model(ModelChoice(args.model, args.device, args.backend, prepare="throughput"), payload)
        steps["model loaded"] = time.perf_counter()
        bank = _querybank(model, BankChoice(args.querybank, args.querybank_split, args.qb_beta, args.no_querybank),
                          args.workers, not args.quiet)
        steps["query bank ready"] = time.perf_counter()
        options = BuildOptions(factory=args.factory, caption_factory=args.caption_factory,
                               image_root=found.image_root, max_memory=max_memory, querybank=bank, tta=tta, ocr=ocr)
        if args.engine == "ray":
            from .ray_embed import DEFAULT_SHARD_SIZE, RayOptions

            ray = RayOptions(shard_size=args.shard_size or DEFAULT_SHARD_SIZE, address=args.ray_address,
                             workers=2 if args.ray_workers is None else args.ray_workers,
                             cpus_per_worker=args.ray_cpus_per_worker or 1,
                             gpus_per_worker=args.ray_gpus_per_worker or 0, batch_size=embedding.batch_size,
                             progress=not args.quiet, decode=args.decode)
            shard_dir = args.shard_dir or str(Path(args.out)) + ".shards"
            report = _build_on_ray(args.out, model, path, paths, found.captions, options, ray, shard_dir)
        else:
            report = build(args.out, model, paths, found.captions, video_paths, options, embedding, decoding)
    finally:
        if decoding is not None:
            decoding.close()
    report_skipped(report.skipped)
    videos = f", {len(report.video_ids)} videos ({report.moments} moments)" if video_paths else ""
    print(f"indexed {counted(len(report.image_ids) - report.moments, 'image')}{videos} and "
          f"{counted(len(report.caption_ids), 'caption')} "
          f"into {args.out} ({report.generation}); {_correction_line(bank)}")
    if report.timeline is not None:
        report.timeline.events.update(steps)
    print(timing_line(report.timeline, started, time.perf_counter()))
    prepare_text_search(args.model, model, not args.quiet)
    return 0


def timing_line(timeline, started: float, ended: float) -> str:
    """``index build``'s speed, its start-up (the model, its backend and the first batch) apart from its steady
    rate (the photos after the first batch, over the time they took): what a bigger build's time follows."""
    total = f"{ended - started:.1f} s in all"
    startup = timeline.startup(started) if timeline is not None else None
    if startup is None:
        return f"timing: {total} (no photo embedded in-process)"
    steady = timeline.steady()
    rate = (f"then {steady:.1f} photos/s steady over {timeline.marks[-1][1] - timeline.marks[0][1]} photos"
            if steady is not None else "one batch, no steady rate")
    line = f"timing: start-up {startup:.1f} s to the first batch of {timeline.marks[0][1]} photos, {rate}; {total}"
    if timeline.events:                 # the start-up's steps, in the order they happened, from the command's start
        line += " (start-up: " + ", ".join(f"{name} {at - started:.1f} s" for name, at in
                                           sorted(timeline.events.items(), key=lambda e: e[1])) + ")"
    if steady is not None and timeline.phases:      # where the steady batches' time went, on the host
        line += " (after the first batch: " + ", ".join(f"{name} {seconds:.1f} s"
                                                        for name, seconds in timeline.phases.items()) + ")"
    return line


def _correction_line(bank) -> str:
    if bank is None:
        return "no hubness correction"
    sides = [name for name, n in (("text→image", bank.captions), ("image→text", bank.images)) if n is not None]
    counts = ", ".join(f"{len(n)} {what}" for what, n in (("captions", bank.captions), ("images", bank.images))
                       if n is not None)
    return f"hubness-corrected ({' and '.join(sides)}; {bank.origin} query bank: {counts}; beta {bank.beta:g})"


def _querybank(model: EmbeddingModel, choice: BankChoice, workers: int | None, progress: bool):
    """The query bank of ``index build`` (:class:`BankChoice`): none when off; with a source, embedded captions
    (a text file) or captions + images (the chosen split of a captioned data set, decoded by ``workers``
    processes); else the bank the model carries (training/inference/querybank.py), if any."""
    from dataclasses import replace

    from training.data.datasets import load_dataset
    from training.inference.embedding import device_of, embed_split

    from .embed import embed_sentences
    from .qbnorm import DEFAULT_BETA, QueryBank, model_bank

    if choice.off:
        return None
    if not choice.source:
        bank = model_bank(model, progress=progress)
        return replace(bank, beta=choice.beta) if bank is not None and choice.beta is not None else bank
    beta = DEFAULT_BETA if choice.beta is None else choice.beta
    source = Path(choice.source)
    if source.is_file():
        texts = read_lines(source)
        if not texts:
            raise ValueError(f"--querybank: {source} holds no captions")
        return QueryBank(captions=embed_sentences(model, texts, progress=progress), beta=beta, origin=str(source))
    if not source.is_dir():
        raise FileNotFoundError(f"--querybank: no such file or data set: {source}")
    split = load_dataset(source).split(choice.split)
    if not any(r.captions for r in split.images):
        raise ValueError(f"--querybank: {source} holds no captions")
    # as evaluation embeds a split: a frozen backbone's features come from (and go to) the feature cache, so
    # rebuilding with the same bank does not run the CNN over the training images again
    images, captions, _ = embed_split(model, split, device=device_of(model), workers=workers, progress=progress)
    return QueryBank(captions=captions.numpy(), images=images.numpy(), beta=beta,
                     origin=f"{source} ({choice.split})")


def _memory_budget(text: str | None, factory: str | None) -> int | None:
    from .faiss_index import parse_bytes

    if text is None:
        return None
    if factory:
        raise ValueError("--max-index-memory chooses the index type: give it or --factory, not both")
    try:
        return parse_bytes(text)
    except ValueError as err:
        raise ValueError(f"--max-index-memory: {err}") from None


def _build_on_ray(out: str, model: EmbeddingModel, model_path: Path, paths: list, captions: list, options, ray,
                  shard_dir: str):
    """A new index at ``out`` of the photos of ``paths`` and ``captions``, the photos embedded on Ray actors
    (``ray``: ``index.ray_embed.RayOptions``) into ``shard_dir`` by ``model`` (its file: ``model_path``)."""
    from .gallery import build_from_embeddings
    from .ray_embed import embed_with_ray

    log = (lambda line: print(line, file=sys.stderr)) if ray.progress else (lambda _: None)
    run = embed_with_ray(model, model_path.read_bytes(), paths, shard_dir, ray, log=log)
    print(f"ray: {len(run.embedded)} shard(s) embedded, {len(run.reused)} reused from {run.shard_dir}",
          file=sys.stderr)
    return build_from_embeddings(out, model, paths, run.embeddings, captions, options, progress=ray.progress)


def cmd_samples(args) -> int:
    from .samples import write_samples

    photos = write_samples(args.out, near_duplicate=args.near_duplicate)
    print(json.dumps({"photos": str(photos), "captions": str(Path(args.out) / "captions.txt"),
                      "images": sum(p.is_file() for p in photos.iterdir()),
                      "videos": len(list((photos / "videos").glob("*.mp4")))}))
    return 0
