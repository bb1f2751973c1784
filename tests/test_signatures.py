"""No function of training/, index/ or service/ takes more than MAX_PARAMETERS parameters: options travel as typed
objects (``index.changes.BuildOptions``, ``index.gallery.EmbedOptions``, ``index.ray_embed.RayOptions``, a
``ChangeSet``; ``training.data.features.Compute``, ``training.evaluate.EvalOptions``,
``training.inference.generate.DecodeSettings``, ``training.inference.embedding.FileReading``,
``training.inference.querybank.BankDraw``, ``training.data.state_cache.StateSpec``), not as relays of keyword arguments handed from one function to the
next."""
import dataclasses
import importlib
import inspect
import pkgutil
from pathlib import Path

import index
import service
import training

MAX_PARAMETERS = 8
PACKAGES = (training, index, service)


def _functions(module) -> dict[str, object]:
    """Every function and method defined in ``module`` (by qualified name), classmethods and staticmethods too;
    not the ``__init__`` a dataclass generates (a record's fields: what the typed options are made of)."""
    out = {}
    for name, obj in vars(module).items():
        if inspect.isfunction(obj) and obj.__module__ == module.__name__:
            out[name] = obj
        elif inspect.isclass(obj) and obj.__module__ == module.__name__:
            for attr, member in vars(obj).items():
                if attr == "__init__" and dataclasses.is_dataclass(obj) and obj.__dataclass_params__.init:
                    continue
                func = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
                if inspect.isfunction(func):
                    out[f"{name}.{attr}"] = func
    return out


def _parameters(func) -> int:
    """Parameters a caller may pass (``self``/``cls`` not counted; ``*args``/``**kwargs`` count one each)."""
    names = list(inspect.signature(func).parameters)
    return len(names) - (1 if names and names[0] in ("self", "cls") else 0)


def _too_many(modules) -> dict[str, int]:
    return {f"{m.__name__}.{q}": n for m in modules for q, f in _functions(m).items()
            if (n := _parameters(f)) > MAX_PARAMETERS}


def _modules():
    """Every module of the three packages, subpackages' too (``training.models``, ``service.api``, ...)."""
    return [importlib.import_module(info.name) for package in PACKAGES
            for info in pkgutil.walk_packages([str(Path(package.__file__).parent)], f"{package.__name__}.")]


def test_no_function_takes_more_than_eight_parameters():
    modules = _modules()
    seen = {f"{m.__name__}.{q}" for m in modules for q in _functions(m)}
    # the walk reaches the update path, the model library, the training application and the service, and the
    # methods and classmethods of the modules' classes
    assert {"index.gallery.build", "index.gallery.sync", "index.changes.apply", "index.segments.SegmentedIndex.load",
            "index.ray_embed.embed_with_ray", "index.video_embed.embed_videos", "training.evaluate.evaluate_model",
            "training.data.features.extract_features", "training.inference.generate.caption_embeddings",
            "training.models.wordvec.train_skipgram", "training.trainer.Trainer.save_state",
            "training.inference.embedding.embed_image_files", "training.inference.querybank.make_bank",
            "training.data.state_cache.build_state_cache",
            "service.engine.Engine._decode", "service.app.create_app"} <= seen
    assert _too_many(modules) == {}


def test_the_check_catches_a_relay_of_parameters():
    import types

    module = types.ModuleType("relay")
    exec("import dataclasses\n"
         "def relay(a, b, c, d, e, f, g, h, i=1):\n    pass\n"
         "@dataclasses.dataclass\nclass Record:\n    a: int\n    b: int\n    c: int\n    d: int\n    e: int\n"
         "    f: int\n    g: int\n    h: int\n    i: int\n"
         "class Side:\n    @classmethod\n    def load(cls, a, b, c, d, e, f, g, h, *rest):\n        pass\n"
         "    def fine(self, a, b, c, d, e, f, g, h):\n        pass\n", module.__dict__)
    assert _too_many([module]) == {"relay.relay": 9, "relay.Side.load": 9}
