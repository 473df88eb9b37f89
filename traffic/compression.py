"""Light gradient compression for use inside a ring allreduce (Pipe-SGD Section 3.2).

Pipe-SGD compresses at every "transmit-and-reduce" step of the ring: the sender encodes the
block it transmits, the receiver decodes it before summing it into its own block. Only light,
element-wise codecs keep that cheap; the paper uses two:

* :class:`Truncation` (16-bit truncation, "T"): drop the low 16 mantissa bits of each float32,
  i.e. keep the sign, the 8 exponent bits and the top 7 mantissa bits (the bfloat16 layout,
  rounded toward zero). On the wire: 2 bytes per element (an ``int16`` tensor holding the
  float32's upper half).
* :class:`Quantization` (8-bit scalar quantization, "Q"): ``q = round(x / s)`` in
  ``[-127, 127]`` with ``s = max|x| / 127`` (the quantization range from the largest
  magnitude of the vector, as the paper says), decoded as ``q * s``. On the wire: 1 byte per
  element plus the 4-byte float32 scale, in one ``uint8`` tensor.

Every codec maps a contiguous 1-D float32 tensor of ``n`` elements to a payload whose size
depends on ``n`` only (:meth:`Codec.payload_numel`), so a receiver can post its receive buffer
before the data arrives, and back. :class:`Identity` sends the float32 values unchanged.

The element-wise error bounds (``|decode(encode(x)) - x| <= error_bound(x)``) are in each
class's docstring and :meth:`Codec.error_bound`; ``tests/unit/test_pipe_sgd.py`` checks them.
"""

from __future__ import annotations

import sys

import torch

from common.errors import SpecError
from common.validation import one_of

__all__ = ["Codec", "Identity", "Truncation", "Quantization", "CODECS", "make_codec"]


class Codec:
    """Interface of an element-wise codec for float32 vectors.

    Attributes:
        name: registry name (``workload.options.compression`` of ``pipe_sgd``).
        payload_dtype: dtype of the payload tensor sent on the wire.
    """

    name = ""
    payload_dtype = torch.float32

    def payload_numel(self, n: int) -> int:
        """Elements (of ``payload_dtype``) of the payload of an ``n``-element vector."""
        raise NotImplementedError

    def payload_bytes(self, n: int) -> int:
        """Bytes on the wire for an ``n``-element float32 vector."""
        return self.payload_numel(n) * torch.empty((), dtype=self.payload_dtype).element_size()

    def empty_payload(self, n: int) -> torch.Tensor:
        """A receive buffer for the payload of an ``n``-element vector."""
        return torch.empty(self.payload_numel(n), dtype=self.payload_dtype)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Payload of ``x`` (1-D contiguous float32, ``n`` elements): a new 1-D tensor of
        ``payload_numel(n)`` elements of ``payload_dtype``."""
        raise NotImplementedError

    def decode(self, payload: torch.Tensor, n: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """The float32 vector (``n`` elements) a payload stands for: written into ``out`` (a
        float32 tensor of ``n`` elements, returned) or, with ``out`` None, a new tensor. A ring
        decodes a block straight into its place, without a temporary as large."""
        raise NotImplementedError

    def error_bound(self, x: torch.Tensor) -> torch.Tensor:
        """Element-wise upper bound of ``|decode(encode(x)) - x|`` (float32, shape of ``x``)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Identity(Codec):
    """No compression: the float32 values themselves (4 bytes per element); error 0."""

    name = "none"
    payload_dtype = torch.float32

    def payload_numel(self, n: int) -> int:
        return n

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    def decode(self, payload: torch.Tensor, n: int, out: torch.Tensor | None = None) -> torch.Tensor:
        return payload[:n] if out is None else out.copy_(payload[:n])

    def error_bound(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


class Truncation(Codec):
    """16-bit truncation (Pipe-SGD §3.2, "T"): keep the upper 16 bits of each float32.

    ``encode``: the float32 bit pattern shifted right by 16 (arithmetic), as ``int16``
    (2 bytes per element): the bit pattern of a ``bfloat16``. ``decode``: shifted back, the
    low 16 bits zero, which is exactly how torch widens a ``bfloat16`` to float32 (one
    vectorized pass, no zeroed temporary). The result keeps
    sign and exponent and is rounded toward zero: ``|T(x)| <= |x|``, ``sign(T(x)) = sign(x)``.

    Error bound, element-wise: for normal ``x`` the 7 kept mantissa bits leave an error below
    one unit of the 7th bit, ``|x - T(x)| < 2^(e-7) <= |x| * 2^-7`` (``e`` = the exponent of
    ``x``); for subnormal ``x`` the dropped bits are worth less than ``2^16 * 2^-149``. So
    ``|x - T(x)| <= |x| * 2^-7 + 2^-133``. Infinities are kept; NaN stays NaN.
    """

    name = "truncation"
    payload_dtype = torch.int16
    REL_ERROR = 2.0**-7
    ABS_ERROR = 2.0**-133

    def payload_numel(self, n: int) -> int:
        return n

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.numel(), dtype=torch.int16)  # a new tensor, even for one element
        if _LITTLE_ENDIAN:  # the upper half of each float32 is its second int16: one strided copy
            return out.copy_(x.contiguous().view(torch.int16)[1::2])
        return out.copy_(x.contiguous().view(torch.int32) >> 16)

    def decode(self, payload: torch.Tensor, n: int, out: torch.Tensor | None = None) -> torch.Tensor:
        upper = payload[:n].view(torch.bfloat16)
        return upper.to(torch.float32) if out is None else out.copy_(upper)

    def error_bound(self, x: torch.Tensor) -> torch.Tensor:
        return x.abs() * self.REL_ERROR + self.ABS_ERROR


class Quantization(Codec):
    """8-bit scalar quantization (Pipe-SGD §3.2, "Q"), range from the largest magnitude.

    ``s = max|x| / 127``; ``q = round(x / s)`` (round half to even), an ``int8`` in
    ``[-127, 127]``; decoded ``q * s``. A zero vector has ``s = 0`` and decodes to zeros.
    Payload: one ``uint8`` tensor of ``n + 4`` bytes, the ``n`` codes (two's complement) and
    the scale's 4 float32 bytes.

    Error bound, element-wise: rounding to the nearest multiple of ``s`` errs by at most
    ``s / 2 = max|x| / 254``; the float32 rounding of ``s``, of ``x / s`` (at most
    ``127 * 2^-24`` in units of ``s``) and of ``q * s`` add at most a few units in the last
    place of ``max|x|``, so ``|x - Q(x)| <= max|x| * (1/254 + 2^-21)``. The bound is the same
    for every element of the vector (it depends on the vector's largest magnitude).
    """

    name = "quantization"
    payload_dtype = torch.uint8
    LEVELS = 127
    ROUNDING = 2.0**-21

    def payload_numel(self, n: int) -> int:
        return n + 4

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        n = x.numel()
        out = torch.empty(n + 4, dtype=torch.uint8)
        amax = _amax(x)
        scale = torch.tensor([amax / self.LEVELS], dtype=torch.float32)
        if amax > 0:
            q = torch.div(x, scale).round_().clamp_(-self.LEVELS, self.LEVELS)
            out[:n].view(torch.int8).copy_(q)
        else:
            out[:n] = 0
        out[n:] = scale.view(torch.uint8)
        return out

    def decode(self, payload: torch.Tensor, n: int, out: torch.Tensor | None = None) -> torch.Tensor:
        scale = payload[n : n + 4].clone().view(torch.float32)
        codes = payload[:n].view(torch.int8)
        return codes.to(torch.float32).mul_(scale) if out is None else torch.mul(codes, scale, out=out)

    def error_bound(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full_like(x, _amax(x) * (1 / (2 * self.LEVELS) + self.ROUNDING))


_LITTLE_ENDIAN = sys.byteorder == "little"


def _amax(x: torch.Tensor) -> float:
    """``max|x|`` (0 for an empty tensor); ``aminmax`` is one fused pass, ``abs().max()`` two."""
    if not x.numel():
        return 0.0
    lo, hi = torch.aminmax(x)
    return max(-float(lo), float(hi))


CODECS: dict[str, type[Codec]] = {c.name: c for c in (Identity, Truncation, Quantization)}


def make_codec(name: str, field: str = "workload.options.compression") -> Codec:
    """The codec registered as ``name`` (``none``, ``truncation``, ``quantization``).

    Raises:
        SpecError: unknown ``name`` (naming ``field`` and the names allowed).
    """
    if name not in CODECS:
        raise SpecError(field, name, one_of(name, CODECS))
    return CODECS[name]()
