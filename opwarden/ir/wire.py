"""Zero-copy weights: find initializer payloads in the serialized model without parsing them.

Parsing a ModelProto copies every `raw_data` payload into the message, so a model file read into
memory and parsed is held twice at the peak. Here the protobuf wire format is walked just deep
enough (ModelProto.graph -> GraphProto.initializer -> TensorProto.raw_data) to record where each
large payload lies; the message handed to the protobuf parser is rebuilt without those payloads,
and the loader makes each weight a read-only NumPy view over the original buffer (a memory-mapped
file or the caller's bytes). Small payloads stay in the message: shape inference needs them.
"""

from __future__ import annotations

from dataclasses import dataclass

from opwarden.errors import ModelError

# ModelProto.graph, GraphProto.initializer, TensorProto.raw_data / name (onnx.proto field numbers)
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_RAW_DATA = 9
_TENSOR_NAME = 8
_LEN = 2  # wire type of length-delimited fields

MIN_SPLIT_BYTES = 64 * 1024  # payloads at least this big are left out of the parsed message


@dataclass(frozen=True)
class Payload:
    """Where one initializer's raw bytes lie in the source buffer."""

    offset: int
    length: int


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise ModelError("not a valid ONNX model (truncated varint in the protobuf)")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ModelError("not a valid ONNX model (varint longer than 10 bytes)")


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _fields(buf, start: int, end: int):
    """Yield (field number, wire type, field start, value start, value end) in [start, end)."""
    pos = start
    while pos < end:
        fstart = pos
        key, pos = _varint(buf, pos, end)
        num, wt = key >> 3, key & 7
        if wt == 0:
            _, vend = _varint(buf, pos, end)
            vstart = pos
        elif wt == 1:
            vstart, vend = pos, pos + 8
        elif wt == 5:
            vstart, vend = pos, pos + 4
        elif wt == _LEN:
            n, vstart = _varint(buf, pos, end)
            vend = vstart + n
        else:  # groups (3, 4) are not used by onnx.proto
            raise ModelError(f"not a valid ONNX model (protobuf wire type {wt} at byte {fstart})")
        if vend > end:
            raise ModelError("not a valid ONNX model (a protobuf field runs past its message)")
        yield num, wt, fstart, vstart, vend
        pos = vend


def _tensor(buf, start: int, end: int) -> tuple[bytes, str, Payload] | None:
    """The tensor message without its raw_data, its name and the payload; None if not split."""
    raw = None
    name = ""
    keep: list[tuple[int, int]] = []
    for num, wt, fstart, vstart, vend in _fields(buf, start, end):
        if num == _TENSOR_RAW_DATA and wt == _LEN:
            raw = Payload(vstart, vend - vstart)
            continue
        if num == _TENSOR_NAME and wt == _LEN:
            name = bytes(buf[vstart:vend]).decode("utf-8", "replace")
        keep.append((fstart, vend))
    if raw is None or raw.length < MIN_SPLIT_BYTES:
        return None
    return b"".join(bytes(buf[a:b]) for a, b in keep), name, raw


def split_payloads(buf) -> tuple[bytes, dict[str, Payload]] | None:
    """(model bytes without large main-graph initializer payloads, name -> payload location).

    Returns None when nothing is worth splitting (then parse `buf` as it is). Initializers
    whose name repeats are left in place (the loader reports the duplicate).
    """
    end = len(buf)
    spans = [
        (vstart, vend)
        for num, wt, _fstart, vstart, vend in _fields(buf, 0, end)
        if num == _MODEL_GRAPH and wt == _LEN
    ]
    if len(spans) != 1:  # repeated message fields merge when parsed: leave those to protobuf
        return None
    graph_span = spans[0]
    payloads: dict[str, Payload] = {}
    graph_parts: list[bytes] = []
    gstart, gend = graph_span
    changed = False
    seen: set[str] = set()
    tag = _encode_varint((_GRAPH_INITIALIZER << 3) | _LEN)
    for num, wt, fstart, vstart, vend in _fields(buf, gstart, gend):
        if num == _GRAPH_INITIALIZER and wt == _LEN:
            split = _tensor(buf, vstart, vend)
            if split is not None and split[1] and split[1] not in seen:
                body, name, pl = split
                seen.add(name)
                payloads[name] = pl
                graph_parts.append(tag + _encode_varint(len(body)) + body)
                changed = True
                continue
        graph_parts.append(bytes(buf[fstart:vend]))
    if not changed:
        return None
    graph = b"".join(graph_parts)
    model_parts: list[bytes] = []
    gtag = _encode_varint((_MODEL_GRAPH << 3) | _LEN)
    for num, wt, fstart, _vstart, vend in _fields(buf, 0, end):
        if num == _MODEL_GRAPH and wt == _LEN:
            model_parts.append(gtag + _encode_varint(len(graph)) + graph)
            continue
        model_parts.append(bytes(buf[fstart:vend]))
    return b"".join(model_parts), payloads
