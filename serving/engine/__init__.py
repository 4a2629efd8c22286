"""The generation engine: request queue, worker, decoders (plain AR here; speculative in serving.speculative)."""

from serving.engine.decoder import ARDecoder, Decoder
from serving.engine.engine import Delta, Engine, EngineBusy, Failed, Finished, GenerationRequest, RequestTooLarge
from serving.engine.stats import EngineStats, Usage
from serving.engine.stops import StopRule, TextAssembler

__all__ = ["ARDecoder", "Decoder", "Delta", "Engine", "EngineBusy", "EngineStats", "Failed", "Finished",
           "GenerationRequest", "RequestTooLarge", "StopRule", "TextAssembler", "Usage"]
