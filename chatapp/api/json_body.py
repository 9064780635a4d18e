"""The one decoder of untrusted JSON: HTTP bodies (/v1 and the conversations API) and
WebSocket frames alike.

Python's json builds whatever it is given: `[` x 100 000 raises RecursionError (a 500 on
HTTP, close 1011 on the socket), NaN and Infinity pass though JSON has neither, and a
key repeated in one object silently keeps its last value (a proxy that reads the first
one would check another request than the one we run). So `loads` refuses, with a
JSONBodyError (a ValueError) whose message is fit to show:

- a document larger than REQUEST_JSON_MAX_BYTES (checked before decoding);
- arrays/objects nested deeper than REQUEST_JSON_MAX_DEPTH;
- NaN, Infinity, -Infinity, and numbers too large for a float or too long for an int;
- a key that appears twice in one object;
- anything that is not JSON (bad UTF-8 included).

`JSONParser` is the same rule as a DRF parser (settings.REST_FRAMEWORK), so the
conversations API answers 400 (413 when too large) in its usual error shape.
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import IO

from django.conf import settings
from rest_framework import exceptions, parsers, status

from chatapp.echo import quoted


class JSONBodyError(ValueError):
    def __init__(self, message: str, *, too_large: bool = False):
        super().__init__(message)
        self.message = message
        self.too_large = too_large


def _refuse_constant(name: str) -> object:
    raise JSONBodyError(f"{name} is not a JSON value.")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 overflows to inf
        raise JSONBodyError("A number is too large.")
    return value


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise JSONBodyError(f"The key {quoted(key)} appears twice in one object.")
            seen.add(key)
    return obj


# Nesting is measured on the raw bytes before decoding, so a deep document costs a
# linear scan, never a recursive parse: strings are cut out (in valid JSON every '"'
# outside a string opens one), the brackets left count +1/-1, and the running sum's
# maximum is the depth.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256
for _ch in b"[{":
    _STEP[_ch] = 1
for _ch in b"]}":
    _STEP[_ch] = -1


def nesting_depth(data: bytes) -> int:
    """How deep arrays/objects nest in the UTF-8 JSON `data` (0 for a scalar)."""
    skeleton = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, skeleton)), default=0)


def loads(
    raw: bytes | str, *, max_bytes: int | None = None, max_depth: int | None = None
) -> object:
    """The decoded document, or JSONBodyError saying what is wrong with it. Bytes must
    be UTF-8 (RFC 8259); a str (a WebSocket text frame) is measured as UTF-8."""
    max_bytes = settings.REQUEST_JSON_MAX_BYTES if max_bytes is None else max_bytes
    max_depth = settings.REQUEST_JSON_MAX_DEPTH if max_depth is None else max_depth
    data = bytes(raw) if not isinstance(raw, str) else raw.encode("utf-8", "surrogatepass")
    if len(data) > max_bytes:
        raise JSONBodyError(f"The JSON is larger than {max_bytes} bytes.", too_large=True)
    if isinstance(raw, str):
        text = raw
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise JSONBodyError("The JSON is not valid UTF-8.") from None
    if not text.strip():
        raise JSONBodyError("The JSON is empty.")
    if nesting_depth(data) > max_depth:
        raise JSONBodyError(f"The JSON nests deeper than {max_depth} levels.")
    try:
        return json.loads(
            text, parse_constant=_refuse_constant, parse_float=_finite_float,
            object_pairs_hook=_unique_keys,
        )
    except JSONBodyError:
        raise
    except RecursionError:  # not reached after the scan above; kept as the last guard
        raise JSONBodyError(f"The JSON nests deeper than {max_depth} levels.") from None
    except json.JSONDecodeError as exc:
        # Position, not content: the message never quotes the document.
        raise JSONBodyError(
            f"The JSON is malformed: {exc.msg} (line {exc.lineno}, column {exc.colno})."
        ) from None
    except ValueError:  # an integer longer than sys.get_int_max_str_digits()
        raise JSONBodyError("A number has too many digits.") from None


class RequestTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "request_too_large"


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser (application/json), decoding through `loads`."""

    def parse(self, stream: IO[bytes] | None, media_type=None, parser_context=None) -> object:
        limit = settings.REQUEST_JSON_MAX_BYTES
        # DRF hands a JSON parser the body already read through Django's limit
        # (DATA_UPLOAD_MAX_MEMORY_SIZE, which follows ours); one byte past ours will do.
        raw = stream.read(limit + 1) if stream is not None else b""
        try:
            return loads(raw, max_bytes=limit)
        except JSONBodyError as exc:
            if exc.too_large:
                raise RequestTooLarge(exc.message) from None
            raise exceptions.ParseError(exc.message) from None
