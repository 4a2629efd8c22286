"""The bundled serving runtime: an OpenAI-compatible server with a DFlash/DDTree engine.

Never imports `ddops`; the contract between them is the command line and HTTP
(see docs/contracts.md).
"""

__version__ = "0.1.0"
