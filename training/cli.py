"""``jointspace synth | train | evaluate | score-generations | caption | paraphrase | zoo | compose`` — the
training package's commands (assembled in service/cli.py)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("synth", help="generate the embedded synthetic captioned-image data set")
    p.add_argument("--out", required=True, help="output directory (images/ and dataset.json)")
    p.add_argument("--images", type=int, default=3000, help="number of images (default 3000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--image-size", type=int, default=128, help="side of the square images in pixels")
    p.add_argument("--pair-fraction", type=float, default=0.4,
                   help="share of the two-object images generated as minimal pairs (default 0.4)")
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("train", help="train a joint image-sentence embedding from a YAML config")
    p.add_argument("--config", help="YAML config (see configs/); not with --resume")
    p.add_argument("--data", required=True, help="Karpathy JSON / Flickr8k folder / COCO captions json")
    p.add_argument("--out", required=True, help="run directory: model.pt, log.jsonl, config.yaml, last.pt")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key by dotted path, e.g. --set train.epochs=1 (repeatable)")
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted run in --out from its last.pt (its own config; --set may "
                        "change it, e.g. train.epochs to train longer)")
    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="train with N processes on this host (DistributedDataParallel: gloo on CPU, nccl with one "
                        "GPU per process); train.batch_size is the global batch (docs/scale.md)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("evaluate", help="retrieval metrics of a model on a data split")
    p.add_argument("--model", required=True, help="model.pt")
    p.add_argument("--data", required=True)
    p.add_argument("--split", default="test", choices=["train", "val", "test"])
    p.add_argument("--out", help="write the metrics as JSON here")
    p.add_argument("--plot", help="write a Recall@K plot (PNG) here")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--no-generation", action="store_true",
                   help="skip captioning/paraphrasing scores of a model with a decoder")
    p.add_argument("--no-meteor", action="store_true", help="skip METEOR (it starts a Java process)")
    p.add_argument("--beam-size", type=int, help="decoding for the captioning/paraphrasing scores "
                                                 "(default: the model's decoder.beam_size)")
    p.add_argument("--length-penalty", type=float, help="default: the model's decoder.length_penalty")
    p.add_argument("--no-repeat-ngram", type=int, metavar="M",
                   help="no M-gram twice in a sentence, 0 = off (default: the model's decoder.no_repeat_ngram)")
    p.add_argument("--generations", metavar="FILE",
                   help="write the generated captions and paraphrases with their references as JSON here, "
                        "to re-score them with `jointspace score-generations` (e.g. where Java is)")
    p.add_argument("--querybank-norm", action="store_true",
                   help="also report the metrics under querybank normalisation (hubness correction) with the train "
                        "split of --data as the query bank")
    p.add_argument("--qb-beta", type=float, default=20.0, help="inverse temperature of the inverted softmax (20)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("score-generations", help="captioning/paraphrasing scores (BLEU, METEOR, CIDEr) of a file "
                                                 "written by `jointspace evaluate --generations`")
    p.add_argument("file", metavar="FILE", help="the --generations JSON file")
    p.add_argument("--out", help="write the scores as JSON here")
    p.add_argument("--no-meteor", action="store_true", help="skip METEOR (it starts a Java process)")
    p.set_defaults(func=cmd_score_generations)

    for name, what, target in (("caption", "caption images with an STT model (STT eq. 10)", "IMAGE"),
                               ("paraphrase", "paraphrase sentences with an STT model (STT eq. 11)", "SENTENCE")):
        p = sub.add_parser(name, help=what)
        p.add_argument("--model", required=True, help="model.pt trained with a decoder")
        p.add_argument("inputs", nargs="+", metavar=target)
        p.add_argument("-n", type=int, default=1, help="results per input (default 1)")
        p.add_argument("--beam-size", type=int, help="default: the model's decoder.beam_size")
        p.add_argument("--max-len", type=int, help="default: the model's decoder.max_len")
        p.add_argument("--no-repeat-ngram", type=int, metavar="M",
                       help="no M-gram twice in a sentence, 0 = off (default: the model's decoder.no_repeat_ngram)")
        p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
        p.add_argument("--json", action="store_true", help="print JSON instead of text")
        p.set_defaults(func=cmd_generate, task=name)
    p = sub.add_parser("ensemble", help="combine trained models into one model.pt (weighted concatenation of their "
                                        "normalised embeddings) that evaluate, index and serve take as any model")
    p.add_argument("--models", nargs="+", required=True, metavar="MODEL", help="two or more model.pt files")
    p.add_argument("--weights", nargs="+", type=float, metavar="W", help="one positive weight per model (default 1)")
    p.add_argument("--out", required=True, help="the ensemble's model.pt")
    p.add_argument("--querybank", metavar="DATA", help="carry a query bank sampled from the train split of this "
                   "data set (sizes, beta and seed from the first member's config), embedded with the ensemble; "
                   "without it the ensemble carries the first member's bank captions (text), and no images")
    p.set_defaults(func=cmd_ensemble)
    p = sub.add_parser("querybank", help="attach a query bank to a model.pt (in place): captions and images sampled "
                                         "from a data set's train split, which index build then uses by default")
    p.add_argument("--model", required=True, help="a trained model.pt (a cosine one)")
    p.add_argument("--data", help="the data set the model was trained on: its train split is sampled (train and val "
                                  "for a final fit, train.fit_on)")
    p.add_argument("--captions", type=int, help="captions kept as text (default: the model's querybank.captions)")
    p.add_argument("--images", type=int, help="images kept as the model's embeddings (default: querybank.images)")
    p.add_argument("--beta", type=float, help="the inverted softmax's inverse temperature (default: querybank.beta)")
    p.add_argument("--seed", type=int, help="the sample's seed (default: the model's train.seed)")
    p.add_argument("--remove", action="store_true", help="remove the bank the model carries instead")
    p.add_argument("--caption-vectors", action="store_true",
                   help="instead: store the vectors of the captions of the bank the model carries (as this model "
                        "embeds them), so that a first index build need not embed them")
    p.set_defaults(func=cmd_querybank)
    p = sub.add_parser("slim", help="write a small model.pt that keeps only the trained tensors; the pretrained "
                                    "ones are reloaded from their PyPI packages (checked by sha256) when it loads")
    p.add_argument("--model", required=True, help="a trained model.pt")
    p.add_argument("--out", required=True, help="the slim model.pt")
    p.add_argument("--half", action="store_true", help="store the kept tensors as float16 (about half the size)")
    p.set_defaults(func=cmd_slim)
    p = sub.add_parser("concepts", help="fit a model's concept head (what its image backbones know, ConSE) on a data "
                                        "set's train split, giving it one when it has none; redraws its query bank")
    p.add_argument("--model", required=True, help="a trained model.pt (frozen EfficientNet-Lite backbones, cosine)")
    p.add_argument("--data", required=True, help="the data set it was trained on: the photos of its train split "
                                                 "(train and val for a final fit, train.fit_on)")
    p.add_argument("--out", help="the model.pt written (default: --model, in place)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a concepts.* key, e.g. --set concepts.weight=0.5 (repeatable)")
    p.add_argument("--half", action="store_true", help="a slim model's kept tensors as float16")
    p.set_defaults(func=cmd_concepts)
    add_zoo_commands(sub)


def add_zoo_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("zoo", help="train and evaluate several configs; write a Markdown/CSV table and a plot")
    p.add_argument("--data", required=True)
    p.add_argument("--configs", nargs="+", required=True, help="YAML configs, e.g. configs/zoo/*.yaml")
    p.add_argument("--out", required=True, help="directory: one run per config, zoo.md, zoo.csv, zoo.png")
    p.add_argument("--split", default="val", choices=["train", "val", "test"], help="evaluation split")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override applied to every config, e.g. --set train.epochs=1 (repeatable)")
    p.add_argument("--fresh", action="store_true", help="retrain runs that already have metrics")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_zoo)

    p = sub.add_parser("compose", help="multimodal query: an image plus/minus words (W2VV §IV-C), "
                                       "ranked against a data split's images")
    p.add_argument("--model", required=True)
    p.add_argument("--image", required=True, help="query image file")
    p.add_argument("--add", action="append", default=[], metavar="WORDS", help="words to add (repeatable)")
    p.add_argument("--subtract", action="append", default=[], metavar="WORDS", help="words to subtract")
    p.add_argument("--data", required=True, help="data set whose images are searched")
    p.add_argument("--split", default="val", choices=["train", "val", "test"])
    p.add_argument("--top", type=int, default=5)
    p.add_argument("--out", help="write the ranking as JSON here")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_compose)


def cmd_zoo(args) -> int:
    from .zoo import markdown_table, run_zoo

    rows = run_zoo(args.data, args.configs, args.out, overrides=args.overrides, split=args.split,
                   progress=not args.quiet, fresh=args.fresh)
    print(markdown_table(rows))
    print(f"wrote {Path(args.out) / 'zoo.md'}, zoo.csv, zoo.png")
    return 0


def cmd_compose(args) -> int:
    from training.data.datasets import load_dataset
    from training.data.features import Compute
    from training.data.fileio import write_json
    from training.data.sources import image_source
    from training.inference.compose import compose_query, image_features_of
    from training.inference.embedding import embed_image_source
    from training.models.checkpoint import load_model

    model = load_model(args.model)
    dataset = load_dataset(args.data, split=args.split).split(args.split)
    if dataset.n_images == 0:
        print(f"error: {args.data} has no '{args.split}' split", file=sys.stderr)
        return 2
    query = compose_query(model, image_features_of(model, args.image), args.add, args.subtract)
    gallery = embed_image_source(model, image_source(model, [r.path for r in dataset.images],
                                                     compute=Compute(progress=not args.quiet)))
    scores = model.score(gallery, query.view(1, -1)).view(-1)
    top = scores.topk(min(args.top, len(scores)))
    ranking = [{"rank": i + 1, "score": round(float(s), 5), "image": str(dataset.images[j].path),
                "caption": dataset.images[j].captions[0] if dataset.images[j].captions else ""}
               for i, (s, j) in enumerate(zip(top.values.tolist(), top.indices.tolist()))]
    for r in ranking:
        print(f"{r['rank']:3d}  {r['score']:.4f}  {r['image']}  {r['caption']}")
    if args.out:
        write_json(args.out, {"image": args.image, "add": args.add, "subtract": args.subtract, "ranking": ranking})
    return 0


def cmd_synth(args) -> int:
    from training.data.synth import generate

    path = generate(args.out, n_images=args.images, seed=args.seed, image_size=args.image_size,
                    pair_fraction=args.pair_fraction)
    print(f"wrote {path}")
    return 0


def cmd_train(args) -> int:
    from .config import build_config, load_config

    if args.resume and args.config:
        raise ValueError("--resume continues with the run's own config (in its last.pt); drop --config "
                         "(--set still overrides keys)")
    if not args.resume and not args.config:
        raise ValueError("--config is required (unless --resume)")
    if args.nproc < 1:
        raise ValueError(f"--nproc must be at least 1, got {args.nproc}")
    if args.resume:
        from .run_state import load_train_state

        cfg = build_config(load_train_state(args.out)["config"], args.overrides)
    else:
        cfg = load_config(args.config, args.overrides)
    if args.nproc > 1:      # this process launches the others and waits for them
        from .distributed import check_config, env_world_size, launch

        if env_world_size() > 1:
            raise ValueError("--nproc: this process is already one of several (WORLD_SIZE is set by a launcher)")
        check_config(cfg, args.nproc)
        argv = ["train", "--data", str(args.data), "--out", str(args.out)]
        argv += ["--resume"] if args.resume else ["--config", str(args.config)]
        argv += [a for item in args.overrides for a in ("--set", item)] + (["--quiet"] if args.quiet else [])
        return launch(args.nproc, argv)
    from .train import train

    train(cfg, args.data, args.out, progress=not args.quiet, resume=args.resume)
    return 0


def cmd_evaluate(args) -> int:
    from training.data.datasets import load_dataset
    from training.data.fileio import write_json
    from training.inference.device import resolve_device
    from training.models.protocol import has_decoder
    from training.models.checkpoint import load_model
    from .evaluate import EvalOptions, evaluate_model, format_table, plot_recall, public

    if args.generations and args.no_generation:
        print("error: --generations needs the captioning/paraphrasing run that --no-generation turns off",
              file=sys.stderr)
        return 2
    device = resolve_device(args.device)
    model = load_model(args.model, device)
    if args.generations and not has_decoder(model):
        print(f"error: --generations: {args.model} has no sentence decoder (a retrieval-only model generates "
              f"no captions)", file=sys.stderr)
        return 2
    dataset = load_dataset(args.data, split=args.split).split(args.split)
    if dataset.n_images == 0:
        print(f"error: {args.data} has no '{args.split}' split", file=sys.stderr)
        return 2
    # train.fit_on of the model, or of each member of an ensemble
    trains = [m.cfg.train for m in getattr(model, "members", None) or [model]]
    seen = any(args.split in t.fit_splits for t in trains)
    if seen:
        print(f"warning: {args.model} was trained on the {args.split} split (train.fit_on: "
              f"{', '.join(sorted({t.fit_on for t in trains}))}): its numbers there measure nothing", file=sys.stderr)
    bank = None
    if args.querybank_norm:
        bank = load_dataset(args.data, split="train").split("train")
        if bank.n_images == 0 or args.split == "train":
            print(f"error: --querybank-norm needs a train split of {args.data} other than the evaluated one",
                  file=sys.stderr)
            return 2
    options = EvalOptions(generation=not args.no_generation, meteor=not args.no_meteor,
                          decode={"beam_size": args.beam_size, "length_penalty": args.length_penalty,
                                  "no_repeat_ngram": args.no_repeat_ngram},
                          querybank=bank, qb_beta=args.qb_beta)
    result = evaluate_model(model, dataset, device=device, workers=args.workers, progress=not args.quiet,
                            amp=device.type == "cuda", options=options)
    print(format_table(result))
    out = public(result)
    out.update({"split": args.split, "data": str(args.data), "model": str(args.model),
                "model_fingerprint": model.fingerprint, **({"trained_on_split": True} if seen else {})})
    if args.out:
        write_json(args.out, out)
        print(f"wrote {args.out}")
    if args.generations:
        write_json(args.generations, {"model": str(args.model), "data": str(args.data), "split": args.split,
                                       "decoding": result["decoding"], **result["_generations"]})
        print(f"wrote {args.generations}")
    if args.plot:
        plot_recall(result, args.plot, title=f"{Path(args.model).parent.name} on {args.split}")
        print(f"wrote {args.plot}")
    return 0


def cmd_score_generations(args) -> int:
    from training.data.fileio import write_json
    from .caption_eval import format_generation, load_generations, score_generations

    try:
        generations = load_generations(args.file)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    scores = score_generations(generations, meteor=not args.no_meteor)
    print(format_generation(scores))
    if args.out:
        write_json(args.out, {**scores, "source": str(args.file)})
        print(f"wrote {args.out}")
    return 0


def cmd_generate(args) -> int:
    from training.inference.device import resolve_device
    from training.inference.generate import caption_images, paraphrase_texts
    from training.models.checkpoint import load_model

    if args.n < 1:
        print(f"error: -n must be at least 1, got {args.n}", file=sys.stderr)
        return 2
    model = load_model(args.model, resolve_device(args.device))
    if args.task == "caption":
        missing = [p for p in args.inputs if not Path(p).is_file()]
        if missing:
            print(f"error: no such image file: {', '.join(missing)}", file=sys.stderr)
            return 2
        results = caption_images(model, args.inputs, n=args.n, beam_size=args.beam_size, max_len=args.max_len,
                                 no_repeat_ngram=args.no_repeat_ngram)
    else:
        results = paraphrase_texts(model, args.inputs, n=args.n, beam_size=args.beam_size, max_len=args.max_len,
                                   no_repeat_ngram=args.no_repeat_ngram)
    if args.json:
        print(json.dumps([{"input": inp, "results": [{"text": t, "score": round(s, 4)} for t, s in res]}
                          for inp, res in zip(args.inputs, results)], indent=2))
        return 0
    for inp, res in zip(args.inputs, results):
        print(inp)
        for text, score in res:
            print(f"  {score:8.3f}  {text}")
    return 0


def cmd_ensemble(args) -> int:
    from training.inference.querybank import KEY as QB_KEY, describe
    from training.models.ensemble import EnsembleEmbedding
    from training.models.checkpoint import load_model, save_model

    if args.weights is not None and len(args.weights) != len(args.models):
        print(f"error: --weights needs one weight per model ({len(args.models)}), got {len(args.weights)}",
              file=sys.stderr)
        return 2
    for path in args.models:
        if not Path(path).is_file():
            print(f"error: no model file {path}", file=sys.stderr)
            return 2
    try:
        members = [load_model(path) for path in args.models]
        if any(isinstance(m, EnsembleEmbedding) for m in members):
            raise ValueError("a member is itself an ensemble: list its members instead")
        ensemble = EnsembleEmbedding(members, args.weights or [1.0] * len(members), [Path(p).name for p in args.models])
        bank = _ensemble_bank(ensemble, members[0], args.querybank)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    extra: dict = {"members": [str(p) for p in args.models]}
    if bank is not None:
        extra[QB_KEY] = bank
    fp = save_model(ensemble, args.out, extra=extra)
    print(json.dumps({"out": args.out, "members": args.models, "weights": ensemble.weights,
                      "embed_dim": ensemble.cfg.model.embed_dim, "fingerprint": fp,
                      "querybank": describe(bank) if bank else None}))
    return 0


def _ensemble_bank(ensemble, first, data: str | None) -> dict | None:
    """The query bank an ensemble carries: sampled from ``data``'s train split as ``jointspace train`` samples
    (the first member's ``querybank`` section and seed) with the images embedded by the ensemble; without
    ``data``, the captions of the first member's carried bank (text, embedded by whatever model builds an index)
    and no images, since a member's image vectors are its own."""
    from training.inference.querybank import carried

    if data is None:
        own = carried(first)
        if not own or not own.get("captions"):
            return None
        return {"captions": list(own["captions"]), "images": None, "beta": own["beta"],
                "source": f"{own.get('source', '')}; captions only (the images were a member's embeddings)"}
    from training.inference.querybank import BankDraw, make_bank

    section, seed = first.cfg.querybank, first.cfg.train.seed
    return make_bank(ensemble, _train_split(data, "--querybank: ", first.cfg.train.fit_splits),
                     BankDraw(section.captions, section.images, section.beta, seed=seed))


def _train_split(data: str, prefix: str = "", splits: tuple[str, ...] = ("train",)):
    """The photos a model was trained on, in the data set at ``data`` (a query bank's sample): its train split, and
    val too for a final fit (``splits``: the model's ``train.fit_splits``); ValueError when it has no train split."""
    from training.data.datasets import load_dataset

    train_set = load_dataset(data).splits(splits)
    if not any(r.split == "train" for r in train_set.images):
        raise ValueError(f"{prefix}{data} has no train split")
    return train_set


def cmd_querybank(args) -> int:
    from training.inference.querybank import attach, describe
    from training.models.checkpoint import load_model
    from training.models.ensemble import EnsembleEmbedding
    from training.data.features import Compute
    from training.inference.backend import extraction_tower
    from training.inference.querybank import BankDraw, make_bank

    if not Path(args.model).is_file():
        print(f"error: no model file {args.model}", file=sys.stderr)
        return 2
    if args.remove:
        attach(args.model, None)
        print(f"removed the query bank of {args.model}")
        return 0
    if args.caption_vectors:
        from training.inference.querybank import carried
        from training.inference.querybank import with_caption_vectors

        model = load_model(args.model)
        own = carried(model)
        if own is None or not own.get("captions"):
            print(f"error: {args.model} carries no query bank captions (jointspace querybank --data ... first)",
                  file=sys.stderr)
            return 2
        attach(args.model, with_caption_vectors(own, model, progress=True))
        print(f"querybank: the vectors of {len(own['captions'])} captions stored in {args.model}")
        return 0
    if not args.data:
        print("error: --data is needed (or --remove, or --caption-vectors)", file=sys.stderr)
        return 2
    model = load_model(args.model)
    if isinstance(model, EnsembleEmbedding):
        print("error: give an ensemble its bank when it is made: jointspace ensemble ... --querybank DATA",
              file=sys.stderr)
        return 2
    section = model.cfg.querybank
    try:
        for flag, value in (("--captions", args.captions), ("--images", args.images)):
            if value is not None and value < 0:
                raise ValueError(f"{flag} is a count, 0 or more; got {value}")
        if args.beta is not None and not args.beta > 0:
            raise ValueError(f"--beta must be positive; got {args.beta}")
        draw = BankDraw(section.captions if args.captions is None else args.captions,
                        section.images if args.images is None else args.images,
                        section.beta if args.beta is None else args.beta,
                        seed=model.cfg.train.seed if args.seed is None else args.seed)
        bank = make_bank(model, _train_split(args.data, splits=model.cfg.train.fit_splits), draw,
                         Compute(progress=True, tower=extraction_tower))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    attach(args.model, bank)
    print(f"querybank: {describe(bank)} attached to {args.model}")
    return 0


def _no_model_file(path: str) -> bool:
    """True, having said so, when ``path`` is no file."""
    if Path(path).is_file():
        return False
    print(f"error: no model file {path}", file=sys.stderr)
    return True


def cmd_concepts(args) -> int:
    import yaml

    from training.fit_concepts import Written, fit_file

    if _no_model_file(args.model):
        return 2
    overrides = {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("concepts.") or key.count(".") != 1:
            print(f"error: --set takes concepts.KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        overrides[key.split(".", 1)[1]] = yaml.safe_load(value)
    try:
        from training.data.datasets import SPLITS

        # every split: fit_file keeps the photos the model was trained on (train.fit_splits)
        fit_file(args.model, _train_split(args.data, splits=SPLITS), overrides=overrides,
                 written=Written(out=args.out, half=True if args.half else None), progress=True)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"concepts fitted: {args.out or args.model}")
    return 0


def cmd_slim(args) -> int:
    from training.models.checkpoint import load_model, save_slim

    if _no_model_file(args.model):
        return 2
    try:
        report = save_slim(load_model(args.model), args.out, half=args.half)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps({"out": args.out, "bytes": Path(args.out).stat().st_size, **report}))
    return 0
