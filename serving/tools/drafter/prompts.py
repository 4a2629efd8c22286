"""Training prompts available offline, and the held-out set.

Three kinds, interleaved so any prefix of the list mixes them: questions built from this
Python's standard-library docstrings, code tasks, and prose questions. The benchmark's own
prompts (serving.tools.prompt_sets) are held out: never a training prompt, only the held-out
tau is measured on them, so that figure shows generalisation to what the bench asks.
"""

from __future__ import annotations

import importlib
import inspect
import random
import warnings

# Modules whose public, documented functions and classes become questions (fixed order).
MODULES = (
    "json", "textwrap", "itertools", "collections", "functools", "re", "string", "math", "statistics",
    "random", "datetime", "shutil", "pathlib", "heapq", "bisect", "operator", "csv", "base64", "hashlib",
    "difflib", "fnmatch", "glob", "copy", "secrets", "uuid", "fractions", "decimal", "zlib", "calendar",
    "urllib.parse", "html", "shlex", "time", "struct", "tempfile", "argparse", "logging", "subprocess",
    "threading", "queue", "enum", "dataclasses", "typing", "contextlib", "io", "pickle", "sqlite3", "gzip",
    "zipfile", "unicodedata", "platform", "array", "weakref", "pprint", "timeit", "ast", "inspect", "abc",
)

DOC_QUESTIONS = (
    "What does `{name}` do in Python? Give a short example.",
    "Write a short Python example that uses `{name}`, and explain it.",
    "Explain this Python documentation in plain words: \"{doc}\"",
)

CODE_TASKS = (
    "reverses a string", "counts the vowels in a string", "returns the largest of three numbers",
    "checks whether a number is prime", "computes the factorial of n recursively", "merges two sorted lists",
    "removes duplicates from a list while keeping order", "flattens a nested list", "finds the median of a list",
    "converts Celsius to Fahrenheit", "counts word frequencies in a text", "checks whether two strings are anagrams",
    "returns the n-th triangular number", "transposes a matrix given as a list of lists", "validates an email address",
    "sorts a list of dictionaries by a key", "computes the greatest common divisor of two numbers",
    "finds the second largest number in a list", "capitalises the first letter of every word",
    "reads a text file and returns its number of lines", "writes a list of rows to a CSV file",
    "returns the binary representation of an integer", "implements binary search on a sorted list",
    "implements bubble sort", "checks whether brackets in a string are balanced", "computes a running average",
    "parses a date string in ISO format", "returns all prime numbers below n", "rotates a list by k positions",
    "chunks a list into pieces of size n", "counts the lines of a file that contain a word",
    "converts a Roman numeral to an integer", "computes the dot product of two vectors",
    "returns the most common element of a list", "splits a sentence into words without punctuation",
    "retries a function call three times on error", "measures how long a function takes",
    "loads a JSON file and prints its keys", "generates a random password", "computes compound interest",
)

CODE_FORMS = (
    "Write a Python function that {task}.",
    "Write a Python function that {task}, with a docstring.",
    "Write a Python function that {task}, and show how to call it.",
)

CLASS_TASKS = (
    "Queue with enqueue, dequeue and is_empty methods", "BankAccount with deposit, withdraw and balance",
    "Point with x and y and a distance method", "Counter that counts calls to increment",
    "Rectangle with area and perimeter methods", "LinkedList with append and iteration",
    "Timer usable as a context manager", "Matrix with addition and multiplication",
    "Inventory that tracks item quantities", "Temperature that converts between scales",
)

TOPICS = (
    "how a rainbow forms", "why leaves change colour in autumn", "how vaccines work", "what gravity is",
    "how the internet works", "why the ocean is salty", "what photosynthesis is", "how a bicycle stays upright",
    "why we have seasons", "how a computer stores numbers", "what a black hole is", "how bees make honey",
    "what inflation means", "how an engine works", "why cats purr", "what DNA is", "how clouds form",
    "what recursion means in programming", "how a compiler differs from an interpreter", "what an API is",
    "why sleep matters", "how the moon affects tides", "what machine learning is", "how a battery stores energy",
)

PROSE_FORMS = (
    "Explain {topic} in simple terms.", "Describe {topic} in a short paragraph.",
    "Write a few sentences on {topic} for a beginner.",
)

ADVICE = (
    "staying focused while studying", "learning a new language", "keeping a garden healthy", "saving money",
    "writing a good email", "giving a short presentation", "reviewing someone else's code", "sleeping better",
    "naming variables in a program", "planning a small trip", "cooking for a group", "debugging a program",
)


def api_questions() -> list[str]:
    """One question per documented public function or class of MODULES, forms in rotation."""
    out = []
    for module in MODULES:
        with warnings.catch_warnings():  # deprecated aliases (typing.io) warn when read
            warnings.simplefilter("ignore", DeprecationWarning)
            out += _questions(module, len(out))
    return out


def _questions(module: str, done: int) -> list[str]:
    """Questions on `module`'s own documented public names; forms continue the rotation at `done`."""
    out, mod = [], importlib.import_module(module)
    for attr in sorted(a for a in dir(mod) if not a.startswith("_")):
        obj = getattr(mod, attr)
        doc = inspect.getdoc(obj) if callable(obj) else None
        if not doc or getattr(obj, "__module__", None) != mod.__name__:
            continue
        first = doc.strip().splitlines()[0].strip()
        form = DOC_QUESTIONS[(done + len(out)) % len(DOC_QUESTIONS)]
        out.append(form.format(name=f"{module}.{attr}", doc=first[:160]))
    return out


def code_tasks() -> list[str]:
    tasks = [form.format(task=t) for t in CODE_TASKS for form in CODE_FORMS]
    tasks += [f"Write a Python class {c}." for c in CLASS_TASKS]
    return tasks


def prose_questions() -> list[str]:
    from serving.tools.train_draft import CHAT_QUESTIONS

    out = [form.format(topic=t) for t in TOPICS for form in PROSE_FORMS]
    out += [f"Give three tips for {a}." for a in ADVICE]
    return out + list(CHAT_QUESTIONS)


def held_out_prompts() -> list[str]:
    from serving.tools.prompt_sets import DEFAULT_PROMPTS

    return list(DEFAULT_PROMPTS)


def training_prompts(count: int, seed: int = 0) -> list[str]:
    """The first `count` training prompts: each kind shuffled (seeded), then taken in turn
    (docstring question, code task, prose question, ...); never a held-out prompt."""
    kinds = [api_questions(), code_tasks(), prose_questions()]
    rng = random.Random(seed)
    for kind in kinds:
        rng.shuffle(kind)
    held = set(held_out_prompts())
    out, turn = [], 0
    while len(out) < count and any(kinds):
        kind = kinds[turn % len(kinds)]
        turn += 1
        if kind:
            prompt = kind.pop()
            if prompt not in held:
                out.append(prompt)
    return out
