"""Generation: the interface the rollout loop uses, its engines (vLLM, or transformers where vLLM
is absent) and the refit probe."""

from nemo_opd.generation.interface import GenerationInterface, GenerationOutput
from nemo_opd.generation.probe import logprob_mismatch
from nemo_opd.generation.vllm_generation import VllmGeneration

__all__ = ["GenerationInterface", "GenerationOutput", "VllmGeneration", "logprob_mismatch"]
