"""``jointspace index add | sync | remove | compact``: changing an index that exists (the parser: index/cli.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .choices import VIDEO_SUFFIXES
from .cli_common import (ModelChoice, batch_size_for, counted, joined, load_chosen_model, prepare_text_search,
                         read_lines, report_outside, report_skipped, split_media)
from .generations import read_manifest


def cmd_add(args) -> int:
    from .gallery import EmbedOptions, add
    from .moments import Sampling
    from .scan import IMAGE_SUFFIXES, scan_media

    paths, outside, missing, not_media = [], [], [], []
    for p in args.paths:
        if Path(p).is_dir():
            scan = scan_media(p, args.exclude, not args.no_default_excludes, photos=True, videos=True)
            paths += scan.found
            outside += scan.outside
        elif not Path(p).exists():
            missing.append(p)
        elif Path(p).suffix.lower() not in IMAGE_SUFFIXES | VIDEO_SUFFIXES:
            not_media.append(p)
        else:
            paths.append(Path(p))
    if missing:
        raise FileNotFoundError(f"nothing added: no such file or folder: {', '.join(missing)}")
    if not_media:
        raise ValueError(f"nothing added: not a photo or video file (by its name's suffix): {', '.join(not_media)}. "
                         f"Photos: {', '.join(sorted(IMAGE_SUFFIXES))}; videos: {', '.join(sorted(VIDEO_SUFFIXES))}")
    captions = read_lines(args.captions) if args.captions else []
    report_outside(outside)
    unique: dict[Path, Path] = {}           # a file given alone and inside a given folder: added once
    for path in paths:
        unique.setdefault(Path(path).resolve(), Path(path))
    paths, video_paths = split_media(list(unique.values()), not args.no_videos)
    sampling = Sampling(args.video_rate, args.video_max_frames, args.video_window, args.video_cut)
    if not paths and not video_paths and not captions:
        raise ValueError("nothing to add: give image or video paths and/or --captions")
    read_manifest(args.index)
    model, device = load_chosen_model(ModelChoice(args.model, args.device, args.backend, prepare="throughput"))
    report = add(args.index, model, paths, captions, video_paths,
                 EmbedOptions(batch_size_for(args.batch_size, device), args.workers, not args.quiet, sampling,
                              args.decode))
    prepare_text_search(args.model, model, not args.quiet)
    report_skipped(report.skipped)
    for already in report.already:
        print(f"already in the index, unchanged: {already}", file=sys.stderr)
    if not report.image_ids and not report.caption_ids:
        if report.already and not report.skipped:
            print(f"nothing added: {counted(len(report.already), 'file')} given {'is' if len(report.already) == 1 else 'are'} "
                  f"in the index already, as {'it is' if len(report.already) == 1 else 'they are'}; {args.index} is "
                  f"unchanged")
            return 0
        print(f"jointspace index add: nothing added (no file could be read); {args.index} is unchanged",
              file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"image_ids": report.image_ids, "caption_ids": report.caption_ids,
                          "video_ids": report.video_ids, "moments": report.moments,
                          "replaced": report.removed_images + report.removed_videos, "already": report.already,
                          "generation": report.generation}))
        return 0
    photos = len(report.image_ids) - report.moments
    parts = [counted(photos, "photo")] if photos or not report.video_ids else []
    parts += [f"{counted(len(report.video_ids), 'video')} ({counted(report.moments, 'moment')})"] \
        if report.video_ids else []
    parts += [counted(len(report.caption_ids), "caption")] if report.caption_ids else []
    notes = [f"{counted(report.removed_images + report.removed_videos, 'file')} changed since "
             f"{'it was' if report.removed_images + report.removed_videos == 1 else 'they were'} indexed: "
             f"embedded again"] if report.removed_images or report.removed_videos else []
    notes += [f"{counted(len(report.already), 'file')} already in the index"] if report.already else []
    print(f"added {joined(parts)} to {args.index} ({report.generation})" + "".join(f"; {n}" for n in notes))
    return 0


def cmd_sync(args) -> int:
    from .gallery import EmbedOptions, sync
    from .moments import Sampling

    sampling = Sampling(args.video_rate, args.video_max_frames, args.video_window, args.video_cut)
    if not Path(args.images).is_dir():                # said before the model loads, as a missing index is
        raise FileNotFoundError(f"no image directory at {args.images}")
    read_manifest(args.index)
    model, device = load_chosen_model(ModelChoice(args.model, args.device, args.backend, prepare="throughput"))
    report = sync(args.index, model, args.images, args.exclude, not args.no_default_excludes, not args.no_videos,
                  EmbedOptions(batch_size_for(args.batch_size, device), args.workers, not args.quiet, sampling,
                               args.decode))
    prepare_text_search(args.model, model, not args.quiet)
    report_skipped(report.skipped)
    report_outside(report.outside)
    videos = {"videos_added": len(report.video_ids), "videos_removed": report.removed_videos} \
        if report.videos_seen else {}
    if args.json:
        print(json.dumps({"added": len(report.image_ids), "changed": len(report.changed),
                          "removed": report.removed_images, **videos,
                          **({"doubles_removed": report.doubles} if report.doubles else {}), "unchanged": report.unchanged, "skipped": len(report.skipped),
                          "links_outside": len(report.outside), "generation": report.generation}))
        return 0
    done = [f"{n} {what}" for n, what in ((len(report.image_ids), "added"), (len(report.changed), "changed"),
                                          (report.removed_images, "removed")) if n]
    done += [f"{counted(n, 'video')} {what}" for n, what in ((len(report.video_ids), "added"),
                                                            (report.removed_videos, "removed")) if n]
    done += [f"{counted(report.doubles, 'double entry')} of one file removed"] if report.doubles else []
    rest = f"{report.unchanged} unchanged" + (f", {len(report.skipped)} unreadable skipped" if report.skipped
                                              else "")
    if done:
        print(f"synced {args.index} with {args.images}: {joined(done)}, {rest} ({report.generation})")
    else:
        print(f"{args.index} already matches {args.images}: {rest}; nothing to change")
    return 0


def cmd_remove(args) -> int:
    from .gallery import remove

    if not args.paths and not args.ids and not args.caption_ids:
        raise ValueError("nothing to remove: give paths, --ids and/or --caption-ids")
    report = remove(args.index, args.ids, args.caption_ids, args.paths)
    for what, given in (("id", report.missing), ("path", report.missing_paths)):
        if given:
            print(f"jointspace index remove: not in the index: {what} {', '.join(map(str, given))}", file=sys.stderr)
    removed = report.removed_images + report.removed_captions
    if removed and args.json:
        print(json.dumps({"removed_images": report.removed_images, "removed_videos": report.removed_videos,
                          "removed_captions": report.removed_captions, "generation": report.generation}))
    elif removed:
        parts = [counted(report.removed_images, "image") + (f" ({counted(report.removed_videos, 'video')} with their "
                                                             f"moments)" if report.removed_videos else "")]
        parts += [counted(report.removed_captions, "caption")] if report.removed_captions else []
        print(f"removed {joined(parts)} from {args.index} ({report.generation})")
    else:
        print(f"jointspace index remove: nothing removed; {args.index} is unchanged", file=sys.stderr)
    return 0 if removed and not report.missing and not report.missing_paths else 1


def cmd_compact(args) -> int:
    from .gallery import compact

    print(json.dumps(compact(args.index)))
    return 0
