"""The delay an HTTP ``Retry-After`` header asks for, in every form RFC 9110 gives it (pure).

``Retry-After`` is ``HTTP-date / delay-seconds`` (RFC 9110, 10.2.3). An HTTP-date has three
forms, and a recipient MUST accept all of them (5.6.7): the IMF-fixdate
``Sun, 06 Nov 1994 08:49:37 GMT``, the obsolete RFC 850 form ``Sunday, 06-Nov-94 08:49:37 GMT``
and C's asctime ``Sun Nov  6 08:49:37 1994``. The standard library's
:func:`email.utils.parsedate_to_datetime` reads the three (and the looser dates of the
Internet Message Format, which 5.6.7 encourages recipients to take), but it gives the asctime
form, which carries no zone, as a naive time, and maps a two-digit year with its own pivot
(1969-2068) where RFC 9110 says: a year more than 50 years in the future is the most recent
past year with those two digits. Both are put right here. Every HTTP-date is UTC.

A date is a point on the *server's* clock, so it is compared with the response's own ``Date``
header when the response has a readable one (the delay the server meant, whatever the skew
between the two clocks), else with the local clock. A date already past means now.

Hostile values: a negative or non-numeric delay, a date that is no date (February 30, hour
25), a year beyond 9999: unreadable, ``None`` (the caller falls back to its own backoff). A
huge delay is believed up to 2^31 seconds, as RFC 9111 (1.2.2) tells caches to read an
overflowing delta-seconds; the one cap that matters is the delivery worker's
(``delivery.pause.RETRY_AFTER_CAP``).
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Callable
from datetime import datetime, timezone

#: The largest delay believed, in seconds (RFC 9111 1.2.2's 2^31 for delta-seconds).
MOST = float(2**31)
_DELTA = re.compile(r"\d+(?:\.\d+)?")  # delta-seconds; a fraction tolerated, as before
#: The RFC 850 form's date: ``06-Nov-94`` (its year is two digits).
_RFC850 = re.compile(r"^[A-Za-z]+,\s*\d{1,2}-[A-Za-z]{3}-(\d{2})\s")
#: How far ahead a two-digit year may point before it means the century before (5.6.7).
_FIFTY_YEARS = 50


def http_date(value: str, reference: float | None = None) -> float | None:
    """An HTTP-date in any of its three forms as POSIX seconds; ``None`` if it is none.
    ``reference`` (POSIX seconds, default now) places an RFC 850 two-digit year."""
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # asctime: no zone written, UTC by definition
        when = when.replace(tzinfo=timezone.utc)
    two_digits = _RFC850.match(value)
    if two_digits:
        now = datetime.fromtimestamp(time.time() if reference is None else reference,
                                     timezone.utc)
        year = now.year - now.year % 100 + int(two_digits.group(1))
        if year > now.year + _FIFTY_YEARS:
            year -= 100
        try:
            when = when.replace(year=year)
        except ValueError:  # 29 February of a year that has none
            return None
    return when.timestamp()


def retry_after(value: str | None, now: Callable[[], float] = time.time,
                date: str | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks for; ``None`` when absent or unreadable.

    ``date`` is the response's ``Date`` header: an HTTP-date is measured from it when it is
    readable, else from ``now()`` (POSIX seconds)."""
    if not value:
        return None
    value = value.strip()
    if _DELTA.fullmatch(value):
        return min(float(value), MOST)
    local = now()
    sent = http_date(date, local) if date else None
    reference = local if sent is None else sent
    when = http_date(value, reference)
    if when is None:
        return None
    return min(max(0.0, when - reference), MOST)
