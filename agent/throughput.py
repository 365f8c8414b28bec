"""Where a tenant's throughput comes from: its page-cache accesses per second
(the default), or a metric the application exports for Prometheus."""
from __future__ import annotations

import logging
import math
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("cachepilot.agent")


class ThroughputError(Exception):
    pass


def scrape(url: str, metric: str, labels: dict[str, str], timeout: float = 2.0) -> float:
    """Sum of the samples of `metric` (or `metric_total`) whose labels
    include `labels`."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read(16 << 20).decode("utf-8", errors="replace")
    except OSError as err:
        raise ThroughputError(f"cannot scrape {url}: {err}") from None
    names = {metric, metric + "_total"}
    total, found = 0.0, False
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name in names and all(s.labels.get(k) == v for k, v in labels.items()):
                    if math.isfinite(s.value):
                        total += s.value
                        found = True
    except ValueError as err:
        raise ThroughputError(f"{url} is not Prometheus text: {err}") from None
    if not found:
        raise ThroughputError(f"{url} has no sample of {metric} with labels {labels}")
    return total


class PrometheusSource:
    """A counter's per-second rate between two reads, or a gauge's value.

    read() gives None, and `error` says why, whenever the source cannot
    say: it did not answer, or a counter has no rate yet (its first read,
    or a reset).  Unknown is never 0: a tenant reported at 0 operations
    per second looks starved and would be handed memory."""

    def __init__(self, spec):
        self.spec = spec
        self._last: tuple[float, float] | None = None
        self._warned = False
        self.error = ""

    def read(self, now: float) -> float | None:
        try:
            value = scrape(self.spec.url, self.spec.metric, self.spec.labels,
                           self.spec.timeout_s)
        except ThroughputError as err:
            if not self._warned:
                log.warning("throughput source: %s", err)
                self._warned = True
            self.error = str(err)
            # the next answer's rate would span the silence: start again
            self._last = None
            return None
        self._warned = False
        self.error = ""
        if self.spec.kind == "gauge":
            return value
        last, self._last = self._last, (now, value)
        if last is None or now <= last[0]:
            self.error = "first read of the counter: no rate yet"
            return None
        if value < last[1]:
            self.error = "the counter was reset: no rate this interval"
            return None
        return (value - last[1]) / (now - last[0])
