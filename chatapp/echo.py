"""Bounded echoes: how an error message (or a log line) quotes what a client sent.

Quoting the client's input helps them find their mistake, but quoted whole it lets one
request grow the answer: a 1 MB model name made a 1 MB 404. Every message that repeats
client input goes through `quoted`, which keeps it short whatever it was given.
"""

from __future__ import annotations

import reprlib

ECHO_MAX_CHARS = 60

# reprlib elides long strings in the middle and stops inside large or deep containers
# without building their whole repr first.
_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = _repr.maxlong = ECHO_MAX_CHARS
_repr.maxlevel = 1
_repr.maxdict = _repr.maxlist = _repr.maxtuple = _repr.maxset = 2


def quoted(value: object) -> str:
    """`value`'s repr, cut to at most ECHO_MAX_CHARS + 3 characters ('abc...xyz')."""
    try:
        text = _repr.repr(value)
    except ValueError:  # an int too long to print (sys.get_int_max_str_digits)
        return f"a {type(value).__name__}"
    # A container's items are each cut already; the whole still gets the one bound.
    return text if len(text) <= ECHO_MAX_CHARS + 3 else text[:ECHO_MAX_CHARS] + "..."
