"""Delivery: the path on which no record is lost (docs/semantics.md#reliability).

Everything between "the poll committed these records" and "the sink acknowledged them" lives
here, so one package shows the whole guarantee:

* :mod:`.spool`: each sink's durable queue (an fsynced append-only log and an ack cursor);
  a torn last line is cut off at load, before anything is appended after it;
* :mod:`.worker`: one :class:`~.worker.DeliveryWorker` per sink drains its spool into the
  sink's ``deliver`` in order, retries what may pass later (after the peer's requested pause,
  :mod:`.pause`), halves a request refused for its size, and acknowledges what was delivered;
* :mod:`.dead_letter`: what a sink refused for good, or what this release cannot read, kept
  in ``dead-letter.jsonl`` instead of being retried forever or dropped;
* :mod:`.outcome`: the words the worker and the protocol adapters (``sinks/``) share: how a
  delivery failed (:class:`~.outcome.FailureKind`) and a sink's health.

The protocol adapters (console, OTLP, Event Hubs) stay in ``sinks/``: they turn records into
requests and answers into outcomes, and know nothing of files.
"""
