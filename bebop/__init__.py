"""bebop: speculative rollouts with a trained draft (EAGLE-3 or MTP) and lossless rejection sampling.

The Python API, one import away (each name loads its module on first use, so `import bebop` stays torch-free):

    model = bebop.load_model("tiny-llama")              # a registry name, a model directory or a cached HF id
    draft = bebop.new_draft(model)                       # or load_draft(path), default_draft(model)
    out = bebop.generate(model, [[1, 2, 3]], 8, bebop.SamplingParams(), draft=draft, mode="spec")

See docs/reference/python-api.md for every name in `__all__`.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.1.0"

# public name -> the module that defines it; resolved on first attribute access (module __getattr__, PEP 562)
API = {
    "load_model": "bebop.models.registry",
    "load_draft": "bebop.drafts.registry",
    "new_draft": "bebop.drafts.registry",
    "default_draft": "bebop.drafts.registry",
    "export_eagle3": "bebop.drafts.formats",
    "generate": "bebop.engine.generation",
    "SamplingParams": "bebop.sampling",
    "SpecStats": "bebop.engine.stats",
    "TrainConfig": "bebop.training.config",
    "train_draft": "bebop.training.train",
    "e2e_tv_loss": "bebop.training.losses",
    "RLConfig": "bebop.rl.config",
    "run_rl": "bebop.rl.loop",
    "BebopRollout": "bebop.integrations.trl",
    "check_exactness": "bebop.studies.exactness",
}

__all__ = ["__version__", *API]


# old public names -> their module, kept for one release out of __all__ (each warns when called)
RENAMED = {"train_mtp": "bebop.training.train"}


def __getattr__(name):
    module = API.get(name) or RENAMED.get(name)
    if module is None:
        raise AttributeError(f"module 'bebop' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(API))

# Module names from before the stages became folders, still importable for one release (with a warning).
MOVED_MODULES = {
    "bebop.mtp": "bebop.drafts.registry",
    "bebop.eagle3": "bebop.drafts.eagle3",
    "bebop.export": "bebop.drafts.formats",
    "bebop.autodraft": "bebop.engine.draft_len",
    "bebop.memory": "bebop.engine.memory",
    "bebop.data": "bebop.training.data",
    "bebop.features": "bebop.training.features",
    "bebop.losses": "bebop.training.losses",
    "bebop.train_mtp": "bebop.training.train",
    "bebop.bench": "bebop.studies.bench",
    "bebop.compare": "bebop.studies.compare_losses",
    "bebop.analysis": "bebop.studies",
    "bebop.analysis.entropy": "bebop.studies.entropy",
    "bebop.analysis.exactness": "bebop.studies.exactness",
    "bebop.rl.report": "bebop.studies.rl_report",
    "bebop.rl.pipeline": "bebop.rl.loop",
    "bebop.rl.ray_workers": "bebop.rl.workers.ray",
    "bebop.rl.vllm_worker": "bebop.backends.vllm.worker",
    "bebop.integrations.vllm": "bebop.backends.vllm.engine",
    "bebop.integrations.vllm_plugin": "bebop.backends.vllm.plugin",
    "bebop.checkpoint": "bebop.io",
    "bebop.models.dtype": "bebop.models.tuning",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import bebop.mtp` gives the module now at `bebop.drafts.mtp` (the same module object)."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED_MODULES else None

    def create_module(self, spec):
        warnings.warn(f"{spec.name} moved to {MOVED_MODULES[spec.name]}; the old name goes in the next release",
                      DeprecationWarning, stacklevel=3)
        return importlib.import_module(MOVED_MODULES[spec.name])

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _MovedModuleFinder())
