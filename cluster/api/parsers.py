"""The API's JSON parser: bodies nested too deeply are refused with a clear 400 instead of
exhausting the interpreter's recursion (a 500)."""

from __future__ import annotations

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


def _depth(value, limit: int) -> int:
    """How deeply ``value`` nests (a scalar is 0), stopping once past ``limit``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


class BoundedJSONParser(JSONParser):
    """JSON with at most ``MYRIAD_API_MAX_JSON_DEPTH`` levels of objects and arrays."""

    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.MYRIAD_API_MAX_JSON_DEPTH
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested deeper than {limit} levels") from None
        if _depth(data, limit) > limit:
            raise ParseError(f"JSON parse error - nested deeper than {limit} levels")
        if isinstance(data, dict):  # PostgreSQL refuses NUL bytes in text: name the field instead
            bad = [k for k, v in data.items() if "\x00" in str(k) or "\x00" in str(v)]
            if bad:
                from rest_framework.exceptions import ValidationError

                raise ValidationError({str(bad[0]).replace("\x00", ""): ["must not contain NUL bytes"]})
        return data
