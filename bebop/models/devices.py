"""Where a model runs: `--device auto|cpu|cuda|cuda:N` (`device=` in the Python API). Everything else (caches,
drafts, samplers, trainers) follows the model's device, read from its weights.

auto is CUDA where torch sees a GPU, else the CPU. On a GPU the weights default to bfloat16, and neither the CPU
probes nor the CPU kernels (bebop.models.tuning, bebop.models.kernels) run.
"""

import torch

from bebop.errors import BebopError

DEVICE_CHOICES = "auto, cpu, cuda, cuda:N"


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    """The torch device `name` asks for, refused with one clear line where this machine has none."""
    if name is None or name == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise BebopError(f"unknown device '{name}' (choose from {DEVICE_CHOICES})") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise BebopError(f"device '{name}' is not supported (choose from {DEVICE_CHOICES})")
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA"
        raise BebopError(f"--device {name}: torch sees no CUDA GPU on this machine (torch {torch.__version__}, "
                         f"built with {build}); use --device cpu")
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise BebopError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA GPU(s), "
                         f"cuda:0..cuda:{torch.cuda.device_count() - 1}")
    return torch.device("cuda", index)


def device_of(module: torch.nn.Module) -> torch.device:
    """The device a model's (or draft's) weights are on."""
    return next(module.parameters()).device


def describe(device: torch.device) -> str:
    """The device's name for a speed figure: the GPU's model, or 'cpu' (models.cpu describes the CPU)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
