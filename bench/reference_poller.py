"""The documentation's reference poller: the CPU baseline for ``bench/cpu.py``.

This is the loop of Microsoft's Python sample for Scheduled Events ("Query for events"): once a
second ``requests.get`` the document with the ``Metadata: true`` header and
``api-version=2020-07-01``, ``resp.json()`` it and compare ``DocumentIncarnation`` with the last
one. (The sample sleeps 1 s after each poll; this one keeps a monotonic 1 s cadence so that it
makes exactly as many requests as the exporter it is compared with.)

Usage: ``python bench/reference_poller.py http://127.0.0.1:PORT [--interval 1]``; runs until
killed. Prints one line per incarnation change on stderr.
"""

from __future__ import annotations

import argparse
import sys
import time

import requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("endpoint", help="IMDS base URL, e.g. http://169.254.169.254")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
    args = parser.parse_args()
    url = f"{args.endpoint}/metadata/scheduledevents"
    headers = {"Metadata": "true"}
    params = {"api-version": "2020-07-01"}
    last_incarnation = None
    due = time.monotonic()
    while True:
        resp = requests.get(url, headers=headers, params=params)
        doc = resp.json()
        if doc["DocumentIncarnation"] != last_incarnation:
            last_incarnation = doc["DocumentIncarnation"]
            print(
                f"incarnation {last_incarnation}: {len(doc['Events'])} events",
                file=sys.stderr,
                flush=True,
            )
        due += args.interval
        time.sleep(max(0.0, due - time.monotonic()))


if __name__ == "__main__":
    main()
