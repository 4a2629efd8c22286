"""The bundled serving runtime: an OpenAI-compatible server with a DFlash/DDTree engine.

Never imports `ddops`; the contract between them is the command line and HTTP
(see docs/contracts.md) plus `serving.contract`, the stdlib-only package of shared rules
(method capabilities, draft/target pairing) that ddops imports and nothing else of serving.
"""

__version__ = "0.1.0"
