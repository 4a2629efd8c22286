"""Which runner serves a hybrid: the batch runner cannot (recurrent state is not a KV view), so the
runtime builds the one-sequence Decoder and the engine serves requests one at a time."""

from types import SimpleNamespace

from serving.engine import Engine, Finished, StopRule
from serving.engine.build import build_decoder_factory
from serving.engine.serial import SerialRunner
from serving.models import batched
from serving.sampling import SamplingParams


class Ids:
    def decode(self, ids):
        return " ".join(map(str, ids))


def test_a_hybrid_is_served_one_request_at_a_time(hf_pairs):
    model = hf_pairs["lllf-lllf"][1]
    assert not batched.supports(model)
    args = SimpleNamespace(speculative_algorithm=None, speculative_draft_model_path=None,
                           speculative_num_draft_tokens=None, speculative_ddtree_budget=None,
                           speculative_adaptive="on", context_length=128, random_seed=0,
                           max_running_requests=None, max_total_tokens=None)
    engine = Engine(build_decoder_factory(args, model, None), Ids()).start()
    try:
        assert isinstance(engine.scheduler.runner, SerialRunner)
        result = engine.generate([5, 6, 7], SamplingParams(temperature=0), StopRule(4))
        assert isinstance(result, Finished) and len(result.token_ids) == 4
    finally:
        engine.stop()
