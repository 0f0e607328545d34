"""A prometheus-client collector over runner snapshots (the server exposes it at /metrics)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from labserve.base.vocabulary import RUNNER_OUTCOMES
from labserve.metrics.snapshot import Snapshot

__all__ = ["SnapshotCollector"]

_LABELS = ["runner", "method"]
_BATCH_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class SnapshotCollector(Collector):
    """Exports labserve metrics from ``source()``, a callable returning current snapshots.

    Pulls a fresh snapshot per scrape; holds no state of its own. Register it with a
    ``prometheus_client.CollectorRegistry``.
    """

    def __init__(self, source: Callable[[], Iterable[Snapshot]]) -> None:
        self._source = source

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        """Yield one family per metric, one sample per runner method."""
        snaps = list(self._source())
        gauge = GaugeMetricFamily
        queue_req = gauge("labserve_queue_requests", "Requests waiting.", labels=_LABELS)
        queue_items = gauge("labserve_queue_items", "Items waiting.", labels=_LABELS)
        in_flight = gauge("labserve_batches_in_flight", "Batches running.", labels=_LABELS)
        cap = gauge("labserve_max_batch_size_items", "max_batch_size in force.", labels=_LABELS)
        wait_cap = gauge(
            "labserve_max_latency_seconds", "max_latency_ms in force, seconds.", labels=_LABELS
        )
        fit_a = gauge(
            "labserve_cost_model_fixed_seconds", "Fitted fixed cost per batch.", labels=_LABELS
        )
        fit_b = gauge(
            "labserve_cost_model_per_item_seconds", "Fitted cost per item.", labels=_LABELS
        )
        model_time = gauge(
            "labserve_model_seconds_per_request",
            "Model time per request served (window).",
            labels=_LABELS,
        )
        busy = gauge(
            "labserve_model_busy_ratio",
            "Model time / (window x max_concurrent_batches).",
            labels=_LABELS,
        )
        target = gauge(
            "labserve_latency_slo_seconds", "latency_slo_ms in force (0: none).", labels=_LABELS
        )
        met = gauge(
            "labserve_latency_slo_met_ratio",
            "Share of requests served within the latency target (window).",
            labels=_LABELS,
        )
        stuck = gauge(
            "labserve_stuck_batches", "Batches running past request_timeout_ms.", labels=_LABELS
        )
        requests = CounterMetricFamily(
            "labserve_requests", "Requests by outcome.", labels=[*_LABELS, "outcome"]
        )
        batches = CounterMetricFamily(
            "labserve_batches", "Batches fired, by reason.", labels=[*_LABELS, "reason"]
        )
        batch_size = HistogramMetricFamily(
            "labserve_batch_size_items", "Items per batch.", labels=_LABELS
        )
        latency = HistogramMetricFamily(
            "labserve_request_latency_seconds",
            "Admission to result, served requests.",
            labels=_LABELS,
        )
        wait = HistogramMetricFamily(
            "labserve_queue_wait_seconds",
            "Admission to the start of the request's batch, served requests.",
            labels=_LABELS,
        )
        for s in snaps:
            labels = [s.runner, s.method]
            queue_req.add_metric(labels, s.queue_requests)
            queue_items.add_metric(labels, s.queue_items)
            in_flight.add_metric(labels, s.in_flight_batches)
            cap.add_metric(labels, s.config.max_batch_size)
            wait_cap.add_metric(labels, s.config.max_latency_s)
            fit_a.add_metric(labels, s.cost_fit.a_ms / 1000.0)
            fit_b.add_metric(labels, s.cost_fit.b_ms / 1000.0)
            target.add_metric(labels, s.config.latency_slo_s)
            stuck.add_metric(labels, s.stuck_batches)
            for family, value in (
                (model_time, s.model_ms_per_request / 1000.0),
                (busy, s.model_busy_fraction),
                (met, s.latency_slo_met),
            ):
                if value == value:  # no sample while it is NaN (nothing measured yet)
                    family.add_metric(labels, value)
            for outcome in RUNNER_OUTCOMES:
                requests.add_metric([*labels, outcome], getattr(s, outcome))
            for reason, count in sorted(s.fire_reasons.items()):
                batches.add_metric([*labels, reason], count)
            batch_size.add_metric(labels, *_batch_buckets(s))
            latency.add_metric(labels, *_time_buckets(s.latency_buckets, s.latency_sum_s, s))
            wait.add_metric(labels, *_time_buckets(s.queue_wait_buckets, s.queue_wait_sum_s, s))
        yield from (queue_req, queue_items, in_flight, cap, wait_cap, fit_a, fit_b)
        yield from (model_time, busy, target, met, stuck)
        yield from (requests, batches, batch_size, latency, wait)
        yield from _token_families(snaps)


def _token_families(snaps: list[Snapshot]) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """Tokens and padding of the methods with a ragged axis (none: no family)."""
    padded = [s for s in snaps if s.tokens_total]
    if not padded:
        return
    tokens = CounterMetricFamily(
        "labserve_batch_tokens", "Padded tokens computed (items x width).", labels=_LABELS
    )
    padding = CounterMetricFamily(
        "labserve_padding_tokens", "Padding tokens among them.", labels=_LABELS
    )
    fraction = GaugeMetricFamily(
        "labserve_padding_ratio", "Padding tokens / padded tokens (window).", labels=_LABELS
    )
    per_batch = GaugeMetricFamily(
        "labserve_tokens_per_batch", "Mean padded tokens per batch (window).", labels=_LABELS
    )
    fit_c = GaugeMetricFamily(
        "labserve_cost_model_per_token_seconds", "Fitted cost per padded token.", labels=_LABELS
    )
    for s in padded:
        labels = [s.runner, s.method]
        fit_c.add_metric(labels, s.cost_fit.c_ms / 1000.0)
        tokens.add_metric(labels, s.tokens_total)
        padding.add_metric(labels, s.padding_tokens_total)
        if s.padding_fraction == s.padding_fraction:  # NaN: no batch in the window
            fraction.add_metric(labels, s.padding_fraction)
            per_batch.add_metric(labels, s.tokens_per_batch)
    yield from (tokens, padding, fraction, per_batch, fit_c)


def _le(bound: float) -> str:
    """A bucket bound as prometheus-client writes it ("4.0", "0.005")."""
    return repr(float(bound))


def _batch_buckets(s: Snapshot) -> tuple[list[tuple[str, float]], float]:
    counts = s.batch_size_counts
    buckets = [
        (_le(bound), float(sum(c for size, c in counts.items() if size <= bound)))
        for bound in _BATCH_BOUNDS
    ]
    buckets.append(("+Inf", float(sum(counts.values()))))
    return buckets, float(sum(size * c for size, c in counts.items()))


def _time_buckets(
    cumulative: tuple[tuple[float, int], ...], total_s: float, s: Snapshot
) -> tuple[list[tuple[str, float]], float]:
    buckets = [(_le(bound), float(count)) for bound, count in cumulative]
    buckets.append(("+Inf", float(s.served)))
    return buckets, total_s
