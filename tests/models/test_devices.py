"""bebop.models.devices: --device auto picks CUDA only where torch sees a GPU; a device this machine lacks, or one
bebop does not run on, is one clear line (on the command line too), and a model loads where it is asked to."""

import pytest
import torch

from bebop.cli import main
from bebop.errors import BebopError
from bebop.models import devices
from bebop.models.registry import load_model


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_auto_is_the_cpu_where_torch_sees_no_gpu(no_gpu):
    assert devices.resolve_device("auto") == torch.device("cpu")
    assert devices.resolve_device(None) == devices.resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name, message", [("cuda", "torch sees no CUDA GPU"), ("cuda:1", "torch sees no CUDA GPU"),
                                           ("mps", "not supported"), ("tpu", "unknown device"), ("gpu please", "unknown device")])
def test_a_device_this_machine_lacks_is_one_clear_error(no_gpu, name, message):
    with pytest.raises(BebopError, match=message) as e:
        devices.resolve_device(name)
    assert "\n" not in str(e.value)


def test_a_gpu_index_beyond_the_machine_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(BebopError, match=r"has 1 CUDA GPU\(s\), cuda:0..cuda:0"):
        devices.resolve_device("cuda:3")


def test_a_model_loads_on_the_device_asked_for(no_gpu):
    model, _ = load_model("tiny-llama", dtype="float32", device="cpu")
    assert devices.device_of(model) == torch.device("cpu")
    assert model.new_cache(2, 8).k[0].device == torch.device("cpu")
    with pytest.raises(BebopError, match="--device cuda"):
        load_model("tiny-llama", dtype="float32", device="cuda")


def test_the_command_line_says_so_in_one_line(no_gpu, capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--model", "tiny-llama", "--prompt", "hi", "--mode", "ar", "--device", "cuda"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bebop: error: --device cuda: torch sees no CUDA GPU") and "\n" not in err
