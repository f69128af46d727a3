"""Writes a safetensors file by hand (Debian's python3 has torch but no safetensors package) so
that the C++ reader is checked against bytes it did not produce itself.

Usage: write_safetensors_fixture.py OUT_PATH

Values follow simple formulas that tests/safetensors_test.cpp recomputes; the float8 tensors
come with "<name>_expected" float32 tensors decoded here, independently of the C++ decoder.
The header is deliberately unpadded and out of order, and one gap separates two tensors, since
a reader must not rely on the conventions of its own writer.
"""
import json
import math
import struct
import sys

import numpy as np
import torch


def raw(tensor):
    """Row-major little-endian bytes of a torch tensor (bfloat16 via its bits)."""
    t = tensor.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()


def decode_e4m3(code):
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return math.nan
    if exponent == 0:
        return sign * math.ldexp(mantissa / 8.0, -6)
    return sign * math.ldexp(1.0 + mantissa / 8.0, exponent - 7)


def decode_e5m2(code):
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 2) & 0x1F, code & 0x3
    if exponent == 0x1F:
        return sign * math.inf if mantissa == 0 else math.nan
    if exponent == 0:
        return sign * math.ldexp(mantissa / 4.0, -14)
    return sign * math.ldexp(1.0 + mantissa / 4.0, exponent - 15)


def main(out_path):
    codes = np.arange(256, dtype=np.uint8)
    # (name, safetensors dtype, shape, bytes)
    tensors = [
        ("f32", "F32", [3, 4], raw(torch.arange(12, dtype=torch.float32).reshape(3, 4) * 0.5 - 2)),
        ("f64", "F64", [6], raw(torch.arange(6, dtype=torch.float64) / 3)),
        ("f16", "F16", [8], raw(torch.arange(8, dtype=torch.float16) * 0.25 - 1)),
        ("bf16", "BF16", [2, 4],
         raw((torch.arange(8, dtype=torch.float32) * 0.5 - 2).to(torch.bfloat16).reshape(2, 4))),
        ("i64", "I64", [5], raw(torch.arange(5, dtype=torch.int64) * 1000000000007 - 3)),
        ("i32", "I32", [6], raw(torch.arange(-3, 3, dtype=torch.int32))),
        ("i16", "I16", [8], raw(torch.arange(-4, 4, dtype=torch.int16) * 1000)),
        ("i8", "I8", [8], raw(torch.arange(-128, 128, 32, dtype=torch.int32).to(torch.int8))),
        ("u8", "U8", [16, 16], codes.tobytes()),
        ("bool", "BOOL", [7], raw(torch.arange(7) % 3 == 0)),
        ("u16", "U16", [7], np.array([0, 1, 255, 256, 32767, 32768, 65535], dtype="<u2").tobytes()),
        ("u32", "U32", [4], np.array([0, 1, 2**31, 2**32 - 1], dtype="<u4").tobytes()),
        ("u64", "U64", [3], np.array([0, 1, 2**63 - 1], dtype="<u8").tobytes()),
        ("scalar", "F64", [], struct.pack("<d", 3.5)),
        ("empty", "F32", [0, 3], b""),
        ("f8_e4m3", "F8_E4M3", [256], codes.tobytes()),
        ("f8_e4m3_expected", "F32", [256],
         np.array([decode_e4m3(c) for c in range(256)], dtype="<f4").tobytes()),
        ("f8_e5m2", "F8_E5M2", [16, 16], codes.tobytes()),
        ("f8_e5m2_expected", "F32", [16, 16],
         np.array([decode_e5m2(c) for c in range(256)], dtype="<f4").tobytes()),
    ]

    header = {}
    data = bytearray()
    for name, dtype, shape, payload in tensors:
        if name == "u8":
            data += b"\0\0\0"  # a gap: allowed by the format, produced by aligning writers
        offsets = [len(data), len(data) + len(payload)]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": offsets}
        data += payload
    header["__metadata__"] = {"format": "pt", "source": "write_safetensors_fixture.py"}
    # Reverse order, and no padding, so nothing depends on key order or header alignment.
    text = json.dumps(dict(reversed(list(header.items())))).encode("utf-8")
    with open(out_path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(bytes(data))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
