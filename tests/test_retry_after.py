"""``Retry-After`` as RFC 9110 reads it (sinks/retry_after.py, pure): delta-seconds and the
three HTTP-date forms a recipient MUST accept (5.6.7), measured from the response's ``Date``
when it has one (10.2.3), and hostile values. The process test against the scripted peer is
tests/test_otlp_conformance.py::test_a_throttled_request_is_retried_after_the_delay_the_collector_gave.
"""

from __future__ import annotations

import datetime

import pytest

from scheduled_events_exporter.sinks.retry_after import MOST, http_date, retry_after

UTC = datetime.timezone.utc
#: The local clock of these tests: 21 October 2026, 07:27:52 UTC.
NOW = datetime.datetime(2026, 10, 21, 7, 27, 52, tzinfo=UTC).timestamp()


def now() -> float:
    return NOW


@pytest.mark.parametrize("value", [
    "Wed, 21 Oct 2026 07:28:00 GMT",  # IMF-fixdate
    "Wednesday, 21-Oct-26 07:28:00 GMT",  # RFC 850
    "Wed Oct 21 07:28:00 2026",  # asctime
    "  Wed, 21 Oct 2026 07:28:00 GMT  ",  # surrounding whitespace (a field value's OWS)
])
def test_every_http_date_form_is_read(value: str) -> None:
    assert retry_after(value, now) == 8.0


def test_asctime_pads_a_one_digit_day_with_a_space() -> None:
    at = datetime.datetime(2026, 11, 6, 8, 49, 37, tzinfo=UTC).timestamp()
    assert http_date("Fri Nov  6 08:49:37 2026") == at
    assert retry_after("Fri Nov  6 08:49:45 2026", lambda: at) == 8.0


@pytest.mark.parametrize(("value", "expected"), [
    ("0", 0.0), ("8", 8.0), ("120", 120.0), (" 2.5 ", 2.5),
    ("9" * 40, MOST),  # beyond any clock: believed up to 2^31 s (the worker caps it anyway)
    ("9" * 5000, MOST),
])
def test_delta_seconds(value: str, expected: float) -> None:
    assert retry_after(value, now) == expected


@pytest.mark.parametrize("value", [
    "", None, "-3", "-0", "+5", "1.5e9", "inf", "nan", "0x10", "tomorrow", "8 s",
    "Wed, 30 Feb 2026 07:28:00 GMT",  # no such day
    "Wed, 21 Oct 2026 25:28:00 GMT",  # no such hour
    "Wed, 21 Oct 99999 07:28:00 GMT",  # beyond what a date holds
    "Wed, 21 Oct 2026 07:28:00 +9999",  # no such zone offset
    "Wed, 21 Foo 2026 07:28:00 GMT",
    "\x00\x01", "Wed,", ",,,,",
])
def test_an_unreadable_value_is_none(value: str | None) -> None:
    assert retry_after(value, now) is None


def test_a_date_in_the_past_means_now_and_one_far_ahead_is_believed_as_said() -> None:
    assert retry_after("Wed, 21 Oct 2026 07:27:00 GMT", now) == 0.0
    assert retry_after("Thu, 01 Jan 1970 00:00:00 GMT", now) == 0.0
    assert retry_after("Sun Nov  6 08:49:37 1994", now) == 0.0
    far = retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now)
    assert far == MOST  # the delivery worker's cap (60 s) is what it is waited for


def test_a_date_is_measured_from_the_responses_date_not_the_local_clock() -> None:
    # The server's clock is an hour behind ours: its Retry-After is 8 s after its own Date.
    # Against the local clock that date is long past; against the Date it is 8 s.
    for value in ("Wed, 21 Oct 2026 06:28:00 GMT", "Wednesday, 21-Oct-26 06:28:00 GMT",
                  "Wed Oct 21 06:28:00 2026"):
        assert retry_after(value, now, date="Wed, 21 Oct 2026 06:27:52 GMT") == 8.0, value
        assert retry_after(value, now) == 0.0, value
    # An hour ahead of ours: without the Date the wait would be an hour and 8 s.
    assert retry_after("Wed, 21 Oct 2026 08:28:00 GMT", now,
                       date="Wed, 21 Oct 2026 08:27:52 GMT") == 8.0
    # The Date in its other forms.
    assert retry_after("Wed, 21 Oct 2026 06:28:00 GMT", now,
                       date="Wed Oct 21 06:27:52 2026") == 8.0
    # delta-seconds do not depend on any clock.
    assert retry_after("8", now, date="Wed, 21 Oct 2026 06:27:52 GMT") == 8.0


@pytest.mark.parametrize("date", ["", "garbage", "Wed, 30 Feb 2026 07:28:00 GMT"])
def test_an_unreadable_date_header_falls_back_to_the_local_clock(date: str) -> None:
    assert retry_after("Wed, 21 Oct 2026 07:28:00 GMT", now, date=date) == 8.0


@pytest.mark.parametrize(("two_digits", "year"), [
    ("26", 2026), ("27", 2027),
    ("76", 2076),  # 50 years ahead: still this century (only more than 50 goes back)
    ("77", 1977),  # 51 years ahead: the most recent past year ending in 77
    ("94", 1994), ("00", 2000),
])
def test_an_rfc_850_two_digit_year_more_than_50_years_ahead_is_in_the_past(
        two_digits: str, year: int) -> None:
    # RFC 9110 5.6.7 (a MUST); the standard library alone would pivot at 1969/2068.
    at = http_date(f"Monday, 02-Mar-{two_digits} 10:00:00 GMT", NOW)
    assert at is not None
    assert datetime.datetime.fromtimestamp(at, UTC).year == year

