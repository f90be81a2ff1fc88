"""flashsampler: Python client for flashsampler-server (exact fused LM-head sampling)."""
from flashsampler.client import (AsyncSamplerClient, SampleResult, SamplerClient, make_request,
                                 to_result)
from flashsampler.tensors import bf16_bits_to_float32, float32_to_bf16_bits, to_wire_tensor

__all__ = [
    "AsyncSamplerClient", "SampleResult", "SamplerClient", "make_request", "to_result",
    "bf16_bits_to_float32", "float32_to_bf16_bits", "to_wire_tensor",
]
