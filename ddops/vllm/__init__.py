"""What ddops knows of vLLM: the flags, choices and speculative methods of each release, read
from the released wheel's own argument parser (`parser_facts.py`, run with vLLM's interpreter,
never imported here), tabulated per version (`versions.py`)."""
