"""Packing hidden states into the wire `Tensor` (raw little-endian elements).

numpy has no bfloat16, so BF16 is carried as its 16 raw bits: fp32 arrays are
rounded to bf16 with round-to-nearest-even (as the server and a bf16 GEMM do),
and torch bf16 tensors are sent bit for bit, never through fp32 and back.
"""
from __future__ import annotations

import numpy as np

from flashsampler.v1 import sampler_pb2

_DTYPES = {
    "fp32": sampler_pb2.DTYPE_FP32,
    "fp16": sampler_pb2.DTYPE_FP16,
    "bf16": sampler_pb2.DTYPE_BF16,
}


def float32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns (uint16), round to nearest even; NaN stays NaN."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    # Adding 0x7FFF plus the lowest kept bit rounds to nearest, ties to even;
    # it cannot carry out of the exponent except into Inf, which is correct.
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) >> 16
    nan = np.isnan(values)
    out = rounded.astype(np.uint16)
    out[nan] = ((bits[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)  # quiet NaN
    return out


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _from_torch(tensor):
    """A torch tensor as (numpy array, wire dtype name); bf16 as raw uint16 bits."""
    import torch  # only when the caller passed a torch tensor

    # Contiguous where the tensor lives, then one device-to-host copy (none
    # for a CPU tensor that already is).
    t = tensor.detach().contiguous()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), "bf16"
    if t.dtype == torch.float16:
        return t.numpy(), "fp16"
    if t.dtype == torch.float32:
        return t.numpy(), "fp32"
    raise TypeError(f"hidden states must be float32, float16 or bfloat16, got {t.dtype}")


def to_wire_tensor(hidden, dtype: str | None = None) -> sampler_pb2.Tensor:
    """Packs H [B, D] (numpy array or torch tensor) into a wire Tensor.

    `dtype` picks the wire format ("fp32", "fp16", "bf16"); by default it is the
    array's own (torch bf16 -> bf16, numpy float16 -> fp16, otherwise fp32).
    A 1-D input is one row. The server rounds to the LM head's dtype anyway, so
    sending bf16 halves the bytes without changing the result for a bf16 head.
    """
    bf16_bits = None
    if type(hidden).__module__.startswith("torch"):
        array, native = _from_torch(hidden)
        if native == "bf16":
            bf16_bits = array
            array = bf16_bits_to_float32(array)
    else:
        array = np.asarray(hidden)
        native = "fp16" if array.dtype == np.float16 else "fp32"
    if array.ndim == 1:
        array = array.reshape(1, -1)
        if bf16_bits is not None:
            bf16_bits = bf16_bits.reshape(1, -1)
    if array.ndim != 2:
        raise ValueError(f"hidden states must be [B, D], got shape {array.shape}")
    wire = dtype or native
    if wire not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {wire!r}")
    if wire == "bf16":
        data = bf16_bits if bf16_bits is not None else float32_to_bf16_bits(array.astype(np.float32))
    elif wire == "fp16":
        data = array.astype("<f2")
    else:
        data = array.astype("<f4")
    return sampler_pb2.Tensor(
        dtype=_DTYPES[wire],
        shape=list(array.shape),
        data=np.ascontiguousarray(data).astype(data.dtype.newbyteorder("<")).tobytes(),
    )
