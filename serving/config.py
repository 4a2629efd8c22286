"""ServerArgs: the runtime's command line (SGLang spellings, docs/contracts.md section 1).

Parsed once into a frozen object; contradictions exit with status 2 and one line naming the
flag. Facts that need the checkpoint (context length, dtype for "auto", device) are filled in
by `resolve`, which returns a new object, or refuses a flag the checkpoint contradicts
(--max-total-tokens on a target served one sequence at a time) the same way.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass, replace

from serving import speculative
from serving.contract.runtime import auto_dtype, max_total_tokens_problem
from serving.device_memory import host_cpu_flags

DTYPES = ("auto", "float32", "bfloat16", "float16")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# Request bodies (request_bytes_bound): English runs about 4 bytes a token; text sent with every
# non-ASCII character \u-escaped (json.dumps' default) about 6 bytes a character, so 32 bytes a
# token holds 5 escaped characters a token; the slack holds the request's other fields.
BODY_BYTES_PER_TOKEN = 32
BODY_SLACK_BYTES = 256 * 1024


@dataclass(frozen=True)
class ServerArgs:
    model_path: str
    served_model_name: str
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    context_length: int | None = None
    dtype: str = "auto"
    device: str | None = None
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    max_queued_requests: int | None = None
    disable_cuda_graph: bool = False
    disable_radix_cache: bool = False
    cuda_graph_max_bs: int | None = None
    random_seed: int = 0
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_num_draft_tokens: int | None = None
    speculative_ddtree_budget: int | None = None
    speculative_adaptive: str = "on"
    log_level: str = "info"
    max_request_bytes: int | None = None   # None: request_bytes_bound(context), filled by resolve
    health_generate_timeout: float = 30.0
    health_generate_interval: float = 5.0
    metrics_require_api_key: bool = False
    enable_mirror: bool = False
    timeout_keep_alive: float = 5.0
    timeout_request_headers: float = 10.0
    timeout_request_body: float = 30.0

    def public(self) -> dict:
        """Resolved arguments as /server_info reports them (never the API key)."""
        out = asdict(self)
        out.pop("api_key")
        out["speculative_algorithm"] = speculative.resolve(self.speculative_algorithm).server_name
        return out


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit status 2 (argparse's own convention)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m serving", description="The ddops bundled serving runtime (OpenAI-compatible).",
                allow_abbrev=False)
    p.add_argument("--model-path", required=True, help="HF checkpoint directory")
    p.add_argument("--served-model-name", help="name clients send as `model` (default: directory name)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--api-key", help="bearer token (default: $DDOPS_API_KEY)")
    p.add_argument("--context-length", type=_positive_int)
    p.add_argument("--dtype", choices=DTYPES, default="auto")
    p.add_argument("--device", choices=("cpu", "cuda"))
    p.add_argument("--mem-fraction-static", type=_fraction,
                   help="share of the device's memory for weights and preallocated K/V when the pool is "
                        "sized at start (default 0.5 on CPU, 0.85 on CUDA)")
    p.add_argument("--max-running-requests", type=_positive_int, help="most sequences decoding at once (default 32)")
    p.add_argument("--max-total-tokens", type=_positive_int,
                   help="cap on the KV pool rows shared by running sequences (default: --max-running-requests "
                        "x (context length + verify rows), within the memory share, at least one sequence)")
    p.add_argument("--chunked-prefill-size", type=_positive_int, help="prompt tokens per prefill chunk (default 512)")
    p.add_argument("--max-queued-requests", type=_positive_int,
                   help="waiting requests before 503 server_busy (default: --max-running-requests if set, else 256)")
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--disable-radix-cache", action="store_true",
                   help="no prefix cache: no store of earlier prompts' blocks is allocated, every prompt is computed")
    p.add_argument("--cuda-graph-max-bs", type=_positive_int)
    p.add_argument("--random-seed", type=int, default=0)
    p.add_argument("--speculative-algorithm", type=str.upper)
    p.add_argument("--speculative-draft-model-path", "--speculative-draft-model")
    p.add_argument("--speculative-num-draft-tokens", "--speculative-dflash-block-size", type=_positive_int)
    p.add_argument("--speculative-ddtree-budget", type=_positive_int)
    p.add_argument("--speculative-adaptive", choices=("on", "off"), default="on",
                   help="on: per round, plain decoding or a verify width up to the budget/block, whichever "
                        "measures fastest; off: always the given budget/block")
    p.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS, default="info")
    p.add_argument("--max-request-bytes", type=_positive_int,
                   help="larger request bodies get 413 before they are read (default: "
                        f"{BODY_BYTES_PER_TOKEN} bytes a token of context + {BODY_SLACK_BYTES // 1024} KiB)")
    p.add_argument("--health-generate-timeout", type=_positive_float, default=30.0)
    p.add_argument("--health-generate-interval", type=_non_negative_float, default=5.0,
                   help="/health_generate probes run one at a time, the next at least this many seconds "
                        "after the last; callers share them, so unkeyed probes cannot crowd out requests")
    p.add_argument("--metrics-require-api-key", action="store_true",
                   help="/metrics needs the API key too (default: open, for scrapers)")
    p.add_argument("--enable-mirror", action="store_true",
                   help="allow PUT /mirror to copy finished requests to a shadow (docs/mirror.md)")
    p.add_argument("--timeout-keep-alive", type=_positive_float, default=5.0,
                   help="close a keep-alive connection idle this many seconds")
    p.add_argument("--timeout-request-headers", type=_positive_float, default=10.0,
                   help="close a connection whose request headers are not complete in this many seconds")
    p.add_argument("--timeout-request-body", type=_positive_float, default=30.0,
                   help="close a connection whose request body is not complete in this many seconds")
    return p


def parse_args(argv=None, environ=os.environ) -> ServerArgs:
    parser = build_parser()
    ns = parser.parse_args(argv)
    problem = _contradiction(ns)
    if problem:
        parser.error(problem)
    name = ns.served_model_name or os.path.basename(os.path.normpath(ns.model_path))
    values = {k: v for k, v in vars(ns).items() if k != "served_model_name"}
    values["api_key"] = ns.api_key or environ.get("DDOPS_API_KEY") or None
    return ServerArgs(served_model_name=name, **values)


def _contradiction(ns) -> str | None:
    try:
        method = speculative.resolve(ns.speculative_algorithm)
    except ValueError as e:
        return f"argument --speculative-algorithm: {e}"
    draft_flags = {"--speculative-draft-model-path": ns.speculative_draft_model_path,
                   "--speculative-num-draft-tokens": ns.speculative_num_draft_tokens,
                   "--speculative-ddtree-budget": ns.speculative_ddtree_budget}
    if not method.speculative:
        for flag, value in draft_flags.items():
            if value is not None:
                return f"argument {flag}: needs --speculative-algorithm (a speculative method)"
        return None
    if not ns.speculative_draft_model_path:
        return f"argument --speculative-draft-model-path: required with --speculative-algorithm {ns.speculative_algorithm}"
    if ns.speculative_ddtree_budget is not None and not method.takes_budget:
        return (f"argument --speculative-ddtree-budget: {ns.speculative_algorithm} "
                f"verifies a chain and takes no tree budget")
    return None


class FlagError(ValueError):
    """A flag the checkpoint makes contradictory (exit status 2, like argparse's)."""


def resolve(args: ServerArgs, model_config, cuda_available: bool) -> ServerArgs:
    """Fill defaults that depend on the checkpoint and the machine; refuse a flag the checkpoint
    leaves nothing to apply to (FlagError)."""
    speculates = speculative.resolve(args.speculative_algorithm).speculative
    problem = max_total_tokens_problem(model_config.hybrid, speculates, args.max_total_tokens)
    if problem:
        raise FlagError(f"argument {problem}")
    device = args.device or ("cuda" if cuda_available else "cpu")
    if device == "cuda" and not cuda_available:
        raise ValueError("--device cuda: CUDA is not available on this machine")
    dtype = args.dtype
    if dtype == "auto":
        declared = model_config.torch_dtype if model_config.torch_dtype in DTYPES else "bfloat16"
        dtype = auto_dtype(device, declared, host_cpu_flags() if device == "cpu" else frozenset())
    context = args.context_length or model_config.max_position_embeddings
    return replace(args, device=device, dtype=dtype, context_length=context,
                   max_request_bytes=args.max_request_bytes or request_bytes_bound(context))


def request_bytes_bound(context: int) -> int:
    """The largest request body worth reading for a model of `context` tokens: no prompt that fits
    comes near it, and a body past it is refused (413) from its Content-Length, before any of it
    is parsed. A 1 MB body cost the runtime 8.9 ms of parsing to earn its context_length_exceeded,
    and 8 clients sending them held a normal request at 12.8x its time alone (tiny model, 2 CPUs,
    serving.bench.hostile); refused from the head, 0.8 ms and 2.2x. A fixed 1 MiB, the bound
    before, was also too small for long contexts: 262,144 tokens of English are about 1 MB."""
    return context * BODY_BYTES_PER_TOKEN + BODY_SLACK_BYTES


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a positive integer")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of seconds")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a non-negative number of seconds")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text} must be in (0, 1]")
    return value
