"""The few Flight SQL protobuf messages the transport anchor speaks, encoded by hand.

Flight SQL commands and action bodies are `google.protobuf.Any` messages whose type URL is
`type.googleapis.com/arrow.flight.protocol.sql.<Message>`. Only the fields the anchor reads or
writes are handled; field numbers are those of Arrow's `format/FlightSql.proto`. Unknown fields
are skipped, as protobuf requires.
"""

from __future__ import annotations

from typing import Dict, List, Tuple, Union

TYPE_URL_PREFIX = "type.googleapis.com/arrow.flight.protocol.sql."

Value = Union[int, bytes]

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 on the wire: two's complement, ten bytes
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> Tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated protobuf varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("protobuf varint longer than 10 bytes")


def decode(data: bytes) -> Dict[int, List[Value]]:
    """Field number -> values in order: ints for varints, bytes for length-delimited fields.
    Fixed-width fields are skipped (none of the handled messages has one)."""
    fields: Dict[int, List[Value]] = {}
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _read_varint(data, pos)
            fields.setdefault(number, []).append(value)
        elif wire == _LENGTH:
            length, pos = _read_varint(data, pos)
            if pos + length > len(data):
                raise ValueError("truncated protobuf field")
            fields.setdefault(number, []).append(bytes(data[pos:pos + length]))
            pos += length
        elif wire == _FIXED64:
            pos += 8
        elif wire == _FIXED32:
            pos += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
    return fields


def field_bytes(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | _LENGTH) + _varint(len(value)) + value


def field_varint(number: int, value: int) -> bytes:
    return _varint(number << 3 | _VARINT) + _varint(value)


def first_bytes(fields: Dict[int, List[Value]], number: int) -> bytes:
    values = fields.get(number) or [b""]
    value = values[-1]  # protobuf: the last occurrence of a scalar wins
    if not isinstance(value, bytes):
        raise ValueError(f"protobuf field {number} is not length-delimited")
    return value


def first_int(fields: Dict[int, List[Value]], number: int) -> int:
    values = fields.get(number) or [0]
    value = values[-1]
    if not isinstance(value, int):
        raise ValueError(f"protobuf field {number} is not a varint")
    return value


def pack_any(message: str, body: bytes) -> bytes:
    """`google.protobuf.Any { type_url = 1; value = 2 }` around a Flight SQL message."""
    return field_bytes(1, (TYPE_URL_PREFIX + message).encode()) + field_bytes(2, body)


def unpack_any(data: bytes) -> Tuple[str, Dict[int, List[Value]]]:
    """The Flight SQL message name (e.g. `CommandStatementIngest`) and its decoded fields."""
    fields = decode(data)
    type_url = first_bytes(fields, 1).decode("utf-8", errors="replace")
    if not type_url.startswith(TYPE_URL_PREFIX):
        raise ValueError(f"not a Flight SQL command: type URL {type_url!r}")
    return type_url[len(TYPE_URL_PREFIX):], decode(first_bytes(fields, 2))


# The messages the anchor answers with.

def create_prepared_statement_result(handle: bytes, dataset_schema: bytes) -> bytes:
    """`ActionCreatePreparedStatementResult`, Any-packed as Flight SQL action results are."""
    body = field_bytes(1, handle) + field_bytes(2, dataset_schema)
    return pack_any("ActionCreatePreparedStatementResult", body)


def begin_transaction_result(transaction_id: bytes) -> bytes:
    return pack_any("ActionBeginTransactionResult", field_bytes(1, transaction_id))


def do_put_update_result(record_count: int) -> bytes:
    """`DoPutUpdateResult`, plain (not Any-packed), as the PutResult's app metadata."""
    return field_varint(1, record_count)


# `CloseSessionResult { status: CLOSED }`, plain, as moraine answers it.
CLOSE_SESSION_RESULT = field_varint(1, 1)
