"""The benchmark prompt sets, as chat user turns (serving.bench replays them; the drafter holds
them out of its training prompts): `default` (half code, half prose: what a
drafter can learn to predict), `random-words` (continue a list of random words: what no
drafter can predict, where speculation must cost next to nothing) and `unseen` (unlike every
training prompt of the drafter: other programming and natural languages, lists of numbers,
long-form answers; serving/data/unseen_prompts.txt)."""

import random
from pathlib import Path

UNSEEN_FILE = Path(__file__).resolve().parent.parent / "data" / "unseen_prompts.txt"

DEFAULT_PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "Write a Python class Stack with push, pop, peek and is_empty methods.",
    "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
    "Write a Python function that reads a CSV file and returns the sum of the second column.",
    "Explain in a few sentences why the sky is blue.",
    "Give three tips for writing clear technical documentation.",
    "Describe the water cycle for a ten-year-old.",
    "What is the difference between a list and a tuple in Python?",
]

def numbered(serial: int, index: int, prompts: list[str] = DEFAULT_PROMPTS) -> str:
    """Prompt `index` (cycling) made unique by a leading request number: a server's prefix cache
    can then only reuse the chat template's shared system prompt, as in real traffic, not a
    whole prompt the benchmark already sent."""
    return f"Request {serial}. {prompts[index % len(prompts)]}"


WORDS = ("apple river candle orbit velvet hammer puzzle glacier lantern cobalt meadow quartz "
         "saddle thunder violin walnut zephyr basket cactus dragon ember falcon garnet harbor "
         "igloo jasmine kettle lemon marble nectar oyster pepper quiver raven silver tulip "
         "umbrella vortex willow yonder zinc anchor bramble cinder dune fable gravel hazel").split()


def random_word_prompts(count: int = 8, words: int = 12, seed: int = 0) -> list[str]:
    """`count` prompts asking to continue a list of `words` random words (seeded)."""
    rng = random.Random(seed)
    return [f"Continue this list of random words with twenty more: {', '.join(rng.sample(WORDS, words))},"
            for _ in range(count)]


def unseen_prompts() -> list[str]:
    """The `unseen` set, one prompt per line, kinds in turn (any prefix mixes them)."""
    return [line for line in UNSEEN_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]


PROMPT_SETS = {"default": lambda: DEFAULT_PROMPTS, "random-words": random_word_prompts, "unseen": unseen_prompts}
