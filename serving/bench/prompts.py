"""The default benchmark prompts: half code, half prose, as chat user turns."""

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
