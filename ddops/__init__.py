"""ddops: deploy speculative-decoding LLM servers from YAML hardware profiles.

Imports nothing of `serving` but `serving.contract` (stdlib only: method capabilities and the
draft/target rules); the rest of the contract is the unit's command line and HTTP
(see docs/contracts.md).
"""

__version__ = "0.1.0"
