"""Open-ended chat prompts (no reward): explanations, poems, tips, comparisons."""

import itertools
import random

from bebop.tasks.base import Task, register_kind


_CONCEPTS = [
    "photosynthesis", "how a rainbow forms", "gravity", "the water cycle", "how vaccines work", "inflation",
    "compound interest", "how the internet works", "machine learning", "black holes", "why the sky is blue",
    "how bees make honey", "the greenhouse effect", "how a bicycle stays upright", "supply and demand",
    "the immune system", "plate tectonics", "how batteries work", "the phases of the moon", "recycling",
    "how airplanes fly", "DNA", "volcanoes", "electricity", "why we have seasons", "democracy",
    "how a compiler works", "encryption", "ocean tides", "earthquakes", "how sleep affects memory",
    "the food chain", "how a refrigerator works", "the stock market", "evolution", "how clouds form",
    "magnets", "the solar system", "how GPS works", "sound waves",
]
_CONCEPT_TEMPLATES = [
    "Explain {} in simple terms.",
    "Summarize {} in two sentences.",
    "Describe {} to a ten-year-old.",
]
_SUBJECTS = [
    "the ocean", "autumn leaves", "a rainy morning", "a lost cat", "the city at night", "friendship",
    "a cup of coffee", "mountains", "the first snow", "an old library", "a lighthouse", "the moon",
    "a garden in spring", "a long train ride", "the desert", "a thunderstorm", "a sleepy dog", "the stars",
    "a river", "homework", "a birthday party", "the wind", "a forest path", "a robot learning to dance",
    "the sunrise", "a quiet lake", "a busy kitchen", "an empty beach", "a paper boat", "a fox in winter",
]
_SUBJECT_TEMPLATES = [
    "Write a short poem about {}.",
    "Write a haiku about {}.",
    "Write a four-line rhyming poem about {}.",
    "Write a two-sentence story about {}.",
]
_ACTIVITIES = [
    "learning a new language", "staying focused while studying", "sleeping better", "saving money",
    "starting to run", "keeping houseplants alive", "writing clear emails", "public speaking",
    "cooking on a budget", "making friends in a new city", "preparing for a job interview",
    "reducing screen time", "learning to code", "traveling light", "drinking enough water",
    "organizing a small apartment", "taking better photos with a phone", "managing stress", "reading more books",
    "giving constructive feedback", "planning a road trip", "keeping a journal", "learning to play guitar",
    "working from home", "teaching a child to ride a bike", "hosting a dinner party", "getting up early",
    "remembering names", "writing a good essay", "staying safe online",
]
_ACTIVITY_TEMPLATES = [
    "Give three tips for {}.",
    "What are the main benefits of {}?",
    "What are common mistakes people make when {}?",
    "Give a short step-by-step plan for {}.",
]
_PAIRS = [
    ("cats", "dogs"), ("tea", "coffee"), ("Python", "JavaScript"), ("trains", "planes"), ("books", "movies"),
    ("summer", "winter"), ("renting a home", "buying a home"), ("the Sun", "the Moon"),
    ("electric cars", "gasoline cars"), ("city life", "country life"), ("email", "phone calls"),
    ("running", "swimming"), ("paper books", "e-readers"), ("chess", "checkers"), ("oceans", "lakes"),
    ("solar power", "wind power"), ("viruses", "bacteria"), ("weather", "climate"), ("frogs", "toads"),
    ("baking", "frying"), ("laptops", "desktop computers"), ("working alone", "working in a team"),
    ("the violin", "the cello"), ("sharks", "dolphins"), ("breakfast", "dinner"),
]
_PAIR_TEMPLATES = [
    "Compare {} and {}.",
    "What are the main differences between {} and {}?",
    "Give one advantage of {0} over {1} and one advantage of {1} over {0}.",
]


def _chat_prompts() -> list[str]:
    # fixed order (no sets), so shuffling it with a seeded rng is reproducible
    out = [t.format(x) for t in _CONCEPT_TEMPLATES for x in _CONCEPTS]
    out += [t.format(x) for t in _SUBJECT_TEMPLATES for x in _SUBJECTS]
    out += [t.format(x) for t in _ACTIVITY_TEMPLATES for x in _ACTIVITIES]
    out += [t.format(a, b) for t in _PAIR_TEMPLATES for a, b in _PAIRS]
    return out


@register_kind("chat")
def _chat_stream(rng):
    # the pool is finite (a few hundred), so walk it in shuffled epochs rather
    # than drawing with replacement: no repeats until every prompt has been used
    prompts = _chat_prompts()
    while True:
        rng.shuffle(prompts)
        for p in prompts:
            yield Task("chat", p)


def chat_tasks(n: int, seed: int) -> list[Task]:
    return list(itertools.islice(_chat_stream(random.Random(seed)), n))
