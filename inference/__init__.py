"""The LLM engine: paged KV cache, prefix caching, continuous batching."""

from inference.async_engine import AsyncEngine
from inference.config import EngineConfig
from inference.llm_engine import LLMEngine
from inference.outputs import RequestOutput
from inference.sampling_params import InvalidRequestError, SamplingParams

__all__ = [
    "AsyncEngine",
    "EngineConfig",
    "InvalidRequestError",
    "LLMEngine",
    "RequestOutput",
    "SamplingParams",
]
