//! `GET /metrics`: Prometheus' text format, from the Prometheus project's own Rust client.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A request's route and answer.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The route (`/v1/chat/completions`, ...; `other` for unknown paths).
    pub route: String,
    /// The HTTP status sent.
    pub status: u16,
}

/// The server's counters, gauges and histograms.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Requests answered, by route and status.
    pub requests: Family<RequestLabels, Counter>,
    /// Prompt tokens of the generations run.
    pub prompt_tokens: Counter,
    /// Tokens generated.
    pub generated_tokens: Counter,
    /// Seconds from a request's arrival to its first token (the queue's wait included).
    pub time_to_first_token: Histogram,
    /// Seconds between consecutive tokens of a generation.
    pub token_latency: Histogram,
    /// Generations waiting or running.
    pub queue_depth: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Every metric, registered.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("amk");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests answered, by route and status",
            requests.clone(),
        );
        let prompt_tokens = Counter::default();
        registry.register(
            "prompt_tokens",
            "Prompt tokens of the generations run",
            prompt_tokens.clone(),
        );
        let generated_tokens = Counter::default();
        registry.register(
            "generated_tokens",
            "Tokens generated",
            generated_tokens.clone(),
        );
        // 1 ms to ~33 s.
        let time_to_first_token = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register(
            "time_to_first_token_seconds",
            "Seconds from a request's arrival to its first token, queueing included",
            time_to_first_token.clone(),
        );
        // 100 µs to ~3.3 s.
        let token_latency = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        registry.register(
            "token_latency_seconds",
            "Seconds between consecutive tokens of a generation",
            token_latency.clone(),
        );
        let queue_depth = Gauge::default();
        registry.register(
            "queue_depth",
            "Generations waiting or running",
            queue_depth.clone(),
        );
        Metrics {
            registry,
            requests,
            prompt_tokens,
            generated_tokens,
            time_to_first_token,
            token_latency,
            queue_depth,
        }
    }

    /// Counts one answered request.
    pub fn answered(&self, route: &str, status: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                route: route.to_string(),
                status,
            })
            .inc();
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_every_metric() {
        let m = Metrics::new();
        m.answered("/v1/completions", 200);
        m.generated_tokens.inc_by(3);
        m.time_to_first_token.observe(0.01);
        m.queue_depth.set(2);
        let text = m.render();
        for needle in [
            "amk_http_requests_total{route=\"/v1/completions\",status=\"200\"} 1",
            "amk_generated_tokens_total 3",
            "amk_prompt_tokens_total 0",
            "amk_time_to_first_token_seconds_count 1",
            "amk_token_latency_seconds_bucket",
            "amk_queue_depth 2",
            "# EOF",
        ] {
            assert!(text.contains(needle), "{needle} missing from:\n{text}");
        }
    }
}
