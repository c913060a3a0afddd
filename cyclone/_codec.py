"""msgspec encoding of inputs, outputs and error records as canonical JSON for ``jsonb``.

Inputs are encoded with sorted keys and fields, so a Struct, a dataclass and a dict with
the same content give the same bytes; the database compares them as ``jsonb`` anyway.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import msgspec

from cyclone import errors

_encoder = msgspec.json.Encoder(order="sorted")
_nul_escape = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


@functools.lru_cache(maxsize=512)
def decoder(type_: Any) -> msgspec.json.Decoder[Any]:
    """Return a cached decoder for ``type_``."""
    return msgspec.json.Decoder(type=type_)


def encode(value: object, *, what: str, type_: Any = Any) -> str:
    """Encode ``value`` as canonical JSON text, checking it round-trips as ``type_``.

    Raises:
        InputError: msgspec cannot encode the value, it holds a NUL character (which
            ``jsonb`` rejects), or it does not decode back as ``type_``.
    """
    try:
        data = _encoder.encode(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise errors.InputError(what=what, reason=f"cannot be encoded as JSON ({exc})") from None
    if _nul_escape.search(data):
        raise errors.InputError(what=what, reason="contains a NUL character, which jsonb rejects")
    if type_ is not Any:
        try:
            decoder(type_).decode(data)
        except msgspec.ValidationError as exc:
            raise errors.InputError(
                what=what, reason=f"does not match the declared type {_type_name(type_)} ({exc})"
            ) from None
    return data.decode("utf-8")


def decode(data: str | bytes, type_: Any = Any) -> Any:
    """Decode JSON text read from the database as ``type_``."""
    return decoder(type_).decode(data)


def _type_name(type_: Any) -> str:
    return getattr(type_, "__qualname__", None) or repr(type_)
