"""What the RL tests share: a toy task whose reward varies within a group even on a random model. Test modules
import it by name (pytest puts this folder on sys.path)."""

from dataclasses import dataclass


@dataclass
class ToyTask:
    """Reward: the fraction of the letter-like bytes in a completion (varies within a group on a random model)."""
    prompt: str

    def reward(self, completion: str) -> float:
        return sum(c.isalpha() for c in completion) / max(len(completion), 1)


TRAIN = [ToyTask(p) for p in ("add 2 and 3", "name a fruit", "say hi", "count to 4", "spell cat", "pick a colour")]
EVAL = [ToyTask(p) for p in ("say bye", "name a tree")]
