"""User prompts written by the model itself (the Magpie recipe): the chat template up to the user's turn, then the
model samples what a user would ask, until its end-of-turn token. Self-distillation data on these prompts goes
beyond bebop's built-in task templates without a dataset download; `bebop make-data --prompts FILE` reads them.

    python examples/self_prompts.py --model smollm2-135m --num 2000 --out runs/prompts/self.jsonl

Prompts are deduplicated, kept between 4 and 400 characters, and mixed with the built-in tasks' training
prompts (`--builtin N`), so both kinds are in the file; the built-in held-out prompts are never included.
"""

import argparse
import json
import random
from pathlib import Path

from bebop.engine.generation import generate
from bebop.models.registry import load_model
from bebop.sampling import SamplingParams
from bebop.tasks import mixed_tasks


def user_turn_prefix(tokenizer) -> list[int]:
    """The template's tokens up to where the user's message starts (the system prompt included)."""
    marker = "\u2063"  # a character no template contains
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    return tokenizer(text[:text.index(marker)], add_special_tokens=False)["input_ids"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--num", type=int, default=2000, help="self-written prompts to keep")
    p.add_argument("--builtin", type=int, default=1000, help="built-in task prompts (training split) to add")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    model, tok = load_model(args.model, dtype="auto")
    prefix = user_turn_prefix(tok)
    kept, seen, seed = [], set(), args.seed
    while len(kept) < args.num:
        g = generate(model, [prefix] * args.batch_size, 96, SamplingParams(args.temperature), mode="ar", seed=seed)
        seed += 1
        for r in g.rollouts:
            text = tok.decode(r.tokens, skip_special_tokens=True).strip()
            if r.stop_reason == "eos" and 4 <= len(text) <= 400 and text not in seen:
                seen.add(text)
                kept.append({"prompt": text, "kind": "self"})
    builtin = [{"prompt": t.prompt, "kind": t.kind} for t in mixed_tasks(args.builtin, seed=args.seed, split="train")]
    rows = kept[:args.num] + builtin
    random.Random(args.seed).shuffle(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts ({args.num} self-written, {len(builtin)} built-in) to {out}")


if __name__ == "__main__":
    main()
