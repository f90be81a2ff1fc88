"""flashsampler: Python client for flashsampler-server (exact fused LM-head sampling)."""
from flashsampler.client import (AsyncSamplerClient, SampleResult, SamplerClient, VerifyResult,
                                 make_request, make_verify_request, to_result, to_verify_results)
from flashsampler.local_channel import LocalChannel, LocalChannelError
from flashsampler.regions import CudaIpcTransport, SharedMemoryTransport
from flashsampler.tensors import bf16_bits_to_float32, float32_to_bf16_bits, to_wire_tensor

__all__ = [
    "AsyncSamplerClient", "SampleResult", "SamplerClient", "VerifyResult", "make_request",
    "make_verify_request", "to_result", "to_verify_results",
    "CudaIpcTransport", "SharedMemoryTransport", "LocalChannel", "LocalChannelError",
    "bf16_bits_to_float32", "float32_to_bf16_bits", "to_wire_tensor",
]
