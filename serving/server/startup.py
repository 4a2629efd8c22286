"""Start the server: check the checkpoint, listen, load the model in the background.

Order matters for operators: everything that can be checked from headers (config, tokenizer,
tensor names and shapes, flags) fails before the port opens, with one line naming the file;
the weights then load while /health answers 503, and a failure there stops the process. The
model loads and runs in the engine process (serving.engine.process), so parsing requests here
never holds up a decode step; if that process dies, this one stops too.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import signal
import sys
import threading
import time
from functools import partial
from pathlib import Path

import torch
import uvicorn

from serving.config import FlagError, ServerArgs, resolve
from serving.device_memory import device_memory
from serving.engine.build import load_engine
from serving.engine.process import EngineProcess
from serving.memory import resolve_pool
from serving.models import ModelError, inspect_checkpoint
from serving.models.tokenizer import Tokenizer
from serving.server.app import AppState, create_app, request_counter
from serving.server.connections import guarded_protocol, raise_open_files_limit
from serving.server.faults import from_environment

log = logging.getLogger("serving")


def serve(args: ServerArgs) -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)   # kill -USR1 PID: every thread's stack to stderr
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        checkpoint = inspect_checkpoint(args.model_path)
        tokenizer = Tokenizer.from_dir(args.model_path)
        args = resolve(args, checkpoint.config, torch.cuda.is_available())
        args = resolve_pool(args, device_memory(args.device))   # the pool rule, once, before the port opens
        faults = from_environment()
    except (ModelError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, FlagError) else 1
    state = AppState(args, tokenizer, eos_ids=eos_ids(args.model_path, checkpoint.config, tokenizer),
                     vocab_size=checkpoint.config.vocab_size, faults=faults)
    raise_open_files_limit()
    server = uvicorn.Server(uvicorn_config(create_app(state), args, request_counter(state)))
    failure: list[str] = []
    loader = threading.Thread(target=_load, args=(state, server, failure), daemon=True)
    loader.start()
    server.run()
    if state.engine is not None:
        state.engine.stop()
    if failure:
        print(f"error: {failure[0]}", file=sys.stderr)
        return 1
    return 0


def uvicorn_config(app, args: ServerArgs, count=None) -> uvicorn.Config:
    """count(path, status) is called for requests refused for their framing (serving.server.request_heads)."""
    return uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                          timeout_graceful_shutdown=5, timeout_keep_alive=args.timeout_keep_alive,
                          http=guarded_protocol(args.timeout_request_headers, args.timeout_request_body, count))


def _load(state: AppState, server: uvicorn.Server, failure: list[str]) -> None:
    args = state.args

    def stop(reason: str) -> None:
        failure.append(reason)
        server.should_exit = True

    try:
        began = time.perf_counter()
        queued = args.max_queued_requests or args.max_running_requests or 256
        engine = EngineProcess(partial(load_engine, args), max_queued=queued,
                               on_exit=lambda: stop("the engine process exited")).start()
        log.info("loaded %s (%s, %s) in %.1fs", args.model_path, args.dtype, args.device,
                 time.perf_counter() - began)
        state.engine = engine
    except Exception as e:  # report any load failure as one line and stop listening
        log.debug("load failed", exc_info=True)
        stop(str(e) or type(e).__name__)


def eos_ids(model_dir, config, tokenizer) -> frozenset[int]:
    """EOS ids from config.json, generation_config.json and the tokenizer's eos_token, together."""
    ids = set(config.eos_token_ids) | tokenizer.eos_ids
    generation = Path(model_dir) / "generation_config.json"
    if generation.is_file():
        value = json.loads(generation.read_text()).get("eos_token_id")
        ids |= {value} if isinstance(value, int) else set(value or ())
    return frozenset(ids)
