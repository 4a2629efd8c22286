"""Train a DFlash drafter on what its target says: `python -m serving.tools.drafter`.

prompts.py (offline questions; the bench prompts held out) -> responses.py (the target's
chat-templated answers with their features and greedy picks, cached) -> objective.py (block
loss over the reduced draft vocabulary; held-out accepted length) -> loop.py (resumable
training) -> progress.py (Rich bar, JSON-lines log) -> plot.py (held-out tau vs minutes).
"""
