"""User prompt files: JSONL, one {"prompt": "..."} object per line."""

import json
from pathlib import Path

from bebop.errors import BebopError


def load_prompts_file(path) -> list[str]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BebopError(f"{path}: prompts file not found") from None
    except IsADirectoryError:
        raise BebopError(f"{path}: is a directory, expected a JSONL prompts file") from None
    except UnicodeDecodeError:
        raise BebopError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise BebopError(f"{path}: cannot read prompts file ({e.strerror})") from None

    prompts = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise BebopError(f'{where}: invalid JSON ({e.msg}); expected {{"prompt": "..."}}') from None
        if not isinstance(obj, dict):
            raise BebopError(f'{where}: expected a JSON object like {{"prompt": "..."}}, got {type(obj).__name__}')
        if "prompt" not in obj:
            raise BebopError(f'{where}: missing "prompt" key')
        prompt = obj["prompt"]
        if not isinstance(prompt, str):
            raise BebopError(f'{where}: "prompt" must be a string, got {type(prompt).__name__}')
        if not prompt.strip():
            raise BebopError(f'{where}: "prompt" is empty')
        prompts.append(prompt)
    if not prompts:
        raise BebopError(f"{path}: no prompts found (expected one JSON object per line)")
    return prompts
