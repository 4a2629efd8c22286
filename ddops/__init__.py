"""ddops: deploy speculative-decoding LLM servers from YAML hardware profiles.

Never imports `serving`; the contract between them is the unit's command line and HTTP
(see docs/contracts.md).
"""

__version__ = "0.1.0"
