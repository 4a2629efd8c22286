"""The generation engine: request queue, worker, scheduler and the batch runner (speculative rounds in serving.speculative.lane)."""

from serving.engine.engine import Delta, Engine, EngineBusy, Failed, Finished, GenerationRequest, RequestTooLarge, run_alone
from serving.engine.runner import Runner, RunnerInfo
from serving.engine.stats import EngineStats, Usage
from serving.engine.stops import StopRule, TextAssembler

__all__ = ["Delta", "Engine", "EngineBusy", "EngineStats", "Failed", "Finished", "GenerationRequest",
           "RequestTooLarge", "Runner", "RunnerInfo", "StopRule", "TextAssembler", "Usage", "run_alone"]
