"""msgspec encoding of inputs, outputs and error records as canonical JSON for ``jsonb``.

Inputs are encoded with sorted keys and fields, so a Struct, a dataclass and a dict with
the same content give the same bytes; the database compares them as ``jsonb`` anyway.
"""

from __future__ import annotations

import functools
import math
import re
import sys
from typing import Any

import msgspec

from cyclone import errors

_encoder = msgspec.json.Encoder(order="sorted")
_nul_escape = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")

MAX_BYTES = 64 * 1024 * 1024
"""The largest encoded input, argument or output cyclone stores (``jsonb`` itself stops
short of 256 MiB, and a value this large is better kept outside the queue)."""


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
    except RecursionError:
        raise errors.InputError(what=what, reason=_too_deep()) from None
    except (TypeError, ValueError, OverflowError) as exc:
        raise errors.InputError(what=what, reason=f"cannot be encoded as JSON ({exc})") from None
    if len(data) > MAX_BYTES:
        raise errors.InputError(
            what=what, reason=f"is {len(data)} bytes as JSON, at most {MAX_BYTES} allowed"
        )
    # Fast pre-checks: a NUL is always escaped as \u0000, and a NaN or infinity (which
    # msgspec writes as null) can only be there if null is.
    if b"\\u0000" in data and _nul_escape.search(data):
        raise errors.InputError(what=what, reason="contains a NUL character, which jsonb rejects")
    if b"null" in data and _has_non_finite(value):
        raise errors.InputError(
            what=what,
            reason="contains NaN or an infinity, which JSON has no value for "
            "(msgspec would store null): use None or a string",
        )
    if type_ is not Any:
        try:
            decoder(type_).decode(data)
        except RecursionError:
            raise errors.InputError(what=what, reason=_too_deep()) from None
        except msgspec.ValidationError as exc:
            raise errors.InputError(
                what=what, reason=f"does not match the declared type {_type_name(type_)} ({exc})"
            ) from None
    return data.decode("utf-8")


def _too_deep() -> str:
    return (
        "is nested too deeply to encode as JSON (the limit is Python's recursion limit, "
        f"{sys.getrecursionlimit()} levels including the caller's stack)"
    )


def _has_non_finite(value: object) -> bool:
    """Whether a float NaN or infinity is anywhere in ``value`` (walked without recursion)."""
    # A msgspec.Raw is JSON text already (no Python float in it): kept, not walked.
    stack = [msgspec.to_builtins(value, order="sorted", builtin_types=(msgspec.Raw,))]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def decode(data: str | bytes, type_: Any = Any) -> Any:
    """Decode JSON text read from the database as ``type_``."""
    return decoder(type_).decode(data)


def _type_name(type_: Any) -> str:
    return getattr(type_, "__qualname__", None) or repr(type_)
