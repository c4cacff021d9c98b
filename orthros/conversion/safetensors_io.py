"""Minimal streaming reader/writer for the safetensors format.

The format is ``<u64 little-endian header length N> <N bytes of JSON header> <data>``; each
header entry gives a tensor's dtype, shape and ``[begin, end)`` byte range within the data.

Why not ``safetensors.torch.save_file``: it needs every tensor of a file in memory at once
(and serialises them into one more buffer). Here the header is computed from shapes and
dtypes alone, then tensors are read, converted and written one at a time, so converting a
shard holds roughly one tensor in memory, never the whole shard or model. Headers are fully
validated before any tensor is read, so a corrupt or truncated file is refused up front.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import torch

# safetensors dtype code <-> torch dtype
_CODES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
for _code, _name in (("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2")):
    if hasattr(torch, _name):
        _CODES[_code] = getattr(torch, _name)
DTYPE_TO_CODE = {v: k for k, v in _CODES.items()}
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors reference implementation's own limit


class SafetensorsError(ValueError):
    """A safetensors file is corrupt, truncated or not a safetensors file."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: torch.dtype
    shape: tuple
    begin: int  # byte offsets within the data section
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class SafetensorsHeader:
    path: str
    data_start: int  # absolute file offset of the data section
    tensors: dict  # name -> TensorInfo, in data order
    metadata: dict


def read_header(path) -> SafetensorsHeader:
    """Read and validate a safetensors header (and that the file holds all the bytes it names)."""
    path = os.fspath(path)
    size = os.path.getsize(path)
    where = f"{path}: "
    if size < 8:
        raise SafetensorsError(f"{where}not a safetensors file (only {size} bytes; truncated?)")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n <= 0 or n > _MAX_HEADER or 8 + n > size:
            raise SafetensorsError(f"{where}corrupt or truncated safetensors file (header length {n}, "
                                   f"file size {size})")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{where}corrupt safetensors header (not valid JSON: {e})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{where}corrupt safetensors header (not a JSON object)")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise SafetensorsError(f"{where}corrupt safetensors header (__metadata__ is not a JSON object: {metadata!r})")
    tensors = []
    for name, entry in header.items():
        try:
            code, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            shape = tuple(int(s) for s in shape)
            begin, end = int(begin), int(end)
        except (TypeError, KeyError, ValueError):
            raise SafetensorsError(f"{where}corrupt header entry for tensor {name!r}: {entry!r}") from None
        if not isinstance(code, str) or code not in _CODES:
            raise SafetensorsError(f"{where}tensor {name!r} has unsupported dtype {code!r}")
        dtype = _CODES[code]
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if any(s < 0 for s in shape) or begin < 0 or end - begin != nbytes:
            raise SafetensorsError(f"{where}corrupt header entry for tensor {name!r}: shape {list(shape)} "
                                   f"({code}) needs {nbytes} bytes, offsets give [{begin}, {end})")
        tensors.append(TensorInfo(name, dtype, shape, begin, end))
    tensors.sort(key=lambda t: (t.begin, t.end))
    pos = 0
    for t in tensors:
        if t.begin != pos:
            raise SafetensorsError(f"{where}corrupt safetensors file: tensor {t.name!r} starts at byte {t.begin}, "
                                   f"expected {pos} (overlapping or gapped data)")
        pos = t.end
    if 8 + n + pos != size:
        kind = "truncated" if 8 + n + pos > size else "corrupt (trailing bytes)"
        raise SafetensorsError(f"{where}{kind} safetensors file: header describes {8 + n + pos} bytes, "
                               f"file has {size}")
    return SafetensorsHeader(path, 8 + n, {t.name: t for t in tensors}, dict(metadata))


class TensorReader:
    """Reads single tensors of a validated file, one at a time (no mmap of the whole file)."""

    def __init__(self, header: SafetensorsHeader):
        self.header = header
        self._f = open(header.path, "rb")

    def get(self, name: str) -> torch.Tensor:
        info = self.header.tensors[name]
        return self._read(name, 0, info.nbytes, info.shape)

    def get_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` of the first dimension (a slice of a large tensor, read alone)."""
        info = self.header.tensors[name]
        n = info.shape[0]
        start = min(start, n)
        stop = max(start, min(stop, n))  # as t[start:stop]
        row = info.nbytes // max(n, 1)
        return self._read(name, start * row, (stop - start) * row, (stop - start, *info.shape[1:]))

    def _read(self, name: str, offset: int, nbytes: int, shape) -> torch.Tensor:
        info = self.header.tensors[name]
        if nbytes == 0:
            return torch.empty(shape, dtype=info.dtype)
        buf = bytearray(nbytes)
        self._f.seek(self.header.data_start + info.begin + offset)
        got = self._f.readinto(buf)
        if got != nbytes:
            raise SafetensorsError(f"{self.header.path}: truncated while reading tensor {name!r}")
        return torch.frombuffer(buf, dtype=info.dtype).reshape(shape)

    def close(self):
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _nbytes(dtype: torch.dtype, shape) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


class StreamingWriter:
    """Write a safetensors file whose header is known up front, one tensor at a time.

    ``entries``: ``[(name, dtype, shape)]`` in the order the tensors will be written. Every
    ``write(name, tensor)`` must follow that order; ``close()`` checks all were written.
    """

    def __init__(self, path, entries, metadata: dict | None = None):
        self.path = os.fspath(path)
        header, pos = {}, 0
        self._order = []
        for name, dtype, shape in entries:
            if dtype not in DTYPE_TO_CODE:
                raise SafetensorsError(f"cannot write tensor {name!r} of dtype {dtype} to safetensors")
            nb = _nbytes(dtype, shape)
            header[name] = {"dtype": DTYPE_TO_CODE[dtype], "shape": list(shape), "data_offsets": [pos, pos + nb]}
            self._order.append((name, dtype, tuple(shape)))
            pos += nb
        self.nbytes = pos
        header = {"__metadata__": {"format": "pt", **(metadata or {})}, **header}
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-len(raw) % 8)  # align the data section to 8 bytes, as safetensors does
        self._f = open(self.path, "wb")
        self._f.write(len(raw).to_bytes(8, "little"))
        self._f.write(raw)
        self._next = 0

    def write(self, name: str, tensor: torch.Tensor):
        exp_name, dtype, shape = self._order[self._next]
        if name != exp_name or tensor.dtype != dtype or tuple(tensor.shape) != shape:
            raise RuntimeError(f"StreamingWriter: expected {exp_name} {dtype} {list(shape)}, got {name} "
                               f"{tensor.dtype} {list(tensor.shape)}")
        t = tensor.detach().to("cpu").contiguous().reshape(-1)
        if t.numel():
            self._f.write(t.view(torch.uint8).numpy().data)
        self._next += 1

    def close(self):
        self._f.close()
        if self._next != len(self._order):
            missing = [n for n, _, _ in self._order[self._next:]]
            raise RuntimeError(f"StreamingWriter: {self.path} closed before writing {missing[:5]}")

    def abort(self):
        self._f.close()
