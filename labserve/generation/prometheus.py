"""A prometheus-client collector over generative methods' snapshots (served at /metrics).

Named as vLLM names what means the same, under labserve's prefix, so a dashboard built for
vLLM reads them with the prefix changed: ``labserve_time_to_first_token_seconds``,
``labserve_inter_token_latency_seconds``, ``labserve_e2e_request_latency_seconds`` and
``labserve_iteration_tokens`` (histograms), ``labserve_num_requests_running``,
``labserve_num_requests_waiting``, ``labserve_kv_cache_usage_perc`` (gauges), and labserve's
own ``labserve_kv_blocks_used``, ``labserve_kv_blocks_total`` and ``labserve_kv_cache_bytes``
(the bytes a model that stores K/V in labserve's blocks allocated; absent otherwise),
``labserve_num_preemptions``, ``labserve_prompt_tokens``, ``labserve_generation_tokens``,
``labserve_prefix_cache_queries`` and ``labserve_prefix_cache_hits`` (in tokens, as vLLM's)
and ``labserve_sequences`` by outcome (counters, ``_total`` added by the exposition), and
``labserve_kv_blocks_cached`` (a gauge).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from labserve.generation.stats import GenerationSnapshot, Histogram

__all__ = ["GenerationCollector"]

_LABELS = ["runner", "method"]
Family = GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily


class GenerationCollector(Collector):
    """Exports generative methods' metrics from ``source()``, fresh at each scrape."""

    def __init__(self, source: Callable[[], Iterable[GenerationSnapshot]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Family]:
        """Yield one family per metric, one sample per generative method (none: nothing)."""
        snaps = list(self._source())
        if not snaps:
            return
        gauge, counter, histogram = GaugeMetricFamily, CounterMetricFamily, HistogramMetricFamily
        running = gauge("labserve_num_requests_running", "Sequences running.", labels=_LABELS)
        waiting = gauge("labserve_num_requests_waiting", "Sequences waiting.", labels=_LABELS)
        kv = gauge(
            "labserve_kv_cache_usage_perc",
            "KV blocks used / the pool's blocks (0 to 1); absent without a KV limit.",
            labels=_LABELS,
        )
        blocks = gauge(
            "labserve_kv_blocks_used", "KV blocks held by running sequences.", labels=_LABELS
        )
        blocks_total = gauge(
            "labserve_kv_blocks_total",
            "KV blocks in the pool; absent without a limit.",
            labels=_LABELS,
        )
        kv_bytes = gauge(
            "labserve_kv_cache_bytes",
            "Bytes of the K/V arrays the model allocated in labserve's blocks; absent for a "
            "model that keeps its own caches (its KV figures are labserve's account).",
            labels=_LABELS,
        )
        preempt = counter("labserve_num_preemptions", "Preemptions.", labels=_LABELS)
        prompt = counter(
            "labserve_prompt_tokens", "Prompt tokens of ended sequences.", labels=_LABELS
        )
        generated = counter("labserve_generation_tokens", "Tokens generated.", labels=_LABELS)
        queries = counter(
            "labserve_prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            labels=_LABELS,
        )
        hits = counter(
            "labserve_prefix_cache_hits", "Prompt tokens found in the prefix cache.", labels=_LABELS
        )
        cached = gauge(
            "labserve_kv_blocks_cached", "KV blocks in the prefix cache.", labels=_LABELS
        )
        outcomes = counter(
            "labserve_sequences", "Sequences by outcome.", labels=[*_LABELS, "outcome"]
        )
        hists = {
            "ttft": histogram(
                "labserve_time_to_first_token_seconds", "Arrival to first token.", labels=_LABELS
            ),
            "itl": histogram(
                "labserve_inter_token_latency_seconds", "Gaps between tokens.", labels=_LABELS
            ),
            "e2e": histogram(
                "labserve_e2e_request_latency_seconds", "Arrival to last token.", labels=_LABELS
            ),
            "iteration_tokens": histogram(
                "labserve_iteration_tokens", "Tokens computed per step.", labels=_LABELS
            ),
        }
        for s in snaps:
            labels = [s.runner, s.method]
            running.add_metric(labels, s.num_running)
            waiting.add_metric(labels, s.num_waiting)
            blocks.add_metric(labels, s.kv_blocks_used)
            if s.kv_blocks_total or s.config.kv_limited:
                kv.add_metric(labels, s.kv_cache_usage)
                blocks_total.add_metric(labels, s.kv_blocks_total or s.config.num_kv_blocks)
            if s.kv_memory == "model":
                kv_bytes.add_metric(labels, s.kv_bytes)
            preempt.add_metric(labels, s.num_preemptions)
            prompt.add_metric(labels, s.prompt_tokens)
            generated.add_metric(labels, s.output_tokens)
            queries.add_metric(labels, s.prefix_cache_queries)
            hits.add_metric(labels, s.prefix_cache_hits)
            cached.add_metric(labels, s.kv_blocks_cached)
            for outcome, count in s.outcomes.items():
                outcomes.add_metric([*labels, outcome], count)
            for name, family in hists.items():
                family.add_metric(labels, *_buckets(s.histograms[name]))
        yield from (running, waiting, kv, blocks, blocks_total, kv_bytes, cached)
        yield from (preempt, prompt, generated, queries, hits, outcomes)
        yield from hists.values()


def _buckets(h: Histogram) -> tuple[list[tuple[str, float]], float]:
    buckets = [(repr(float(bound)), float(count)) for bound, count in h.buckets]
    buckets.append(("+Inf", float(h.count)))
    return buckets, h.sum
