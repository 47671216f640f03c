//! The feedback controller's decisions as metrics, per Service port and family: the share moved
//! out of the zone, the latency ratios it read, the backends ejected, panic.

use std::sync::Mutex;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, gauge::ConstGauge},
};
use topology_model::Family;
use topology_policy::feedback::{Inputs, PortInput};

/// The last inputs, encoded at each scrape.
#[derive(Debug, Default)]
pub struct FeedbackMetrics {
    inputs: Mutex<Inputs>,
}

impl FeedbackMetrics {
    /// Replaces the inputs shown.
    pub fn set(&self, inputs: Inputs) {
        *self.inputs.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = inputs;
    }
}

impl Collector for FeedbackMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let inputs = self.inputs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        type Value = fn(&PortInput) -> Option<f64>;
        let gauges: [(&str, &str, Value); 5] = [
            ("feedback_shift_ratio", "Share of this node's traffic feedback moved out of its zone", |i| Some(i.shift)),
            ("feedback_zone_latency_ratio", "This zone's connection lifetime over the port's unloaded latency", |i| {
                i.measured.near_ratio()
            }),
            (
                "feedback_other_zones_latency_ratio",
                "The other zones' connection lifetime over the unloaded latency",
                |i| i.measured.far_ratio(),
            ),
            ("feedback_ejected_backends", "Backends left out for failing", |i| Some(i.ejected.len() as f64)),
            ("feedback_panic", "1 while most endpoints fail and every endpoint is used, else 0", |i| {
                Some(f64::from(u8::from(i.panic)))
            }),
        ];
        for (name, help, value) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (key, input) in inputs.iter() {
                let Some(value) = value(input) else { continue };
                let labels = [
                    ("service".to_owned(), key.service.to_string()),
                    ("port".to_owned(), key.port.to_string()),
                    ("family".to_owned(), if key.family == Family::V4 { "IPv4" } else { "IPv6" }.to_owned()),
                ];
                ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;
    use topology_model::ObjectKey;
    use topology_policy::feedback::{Measured, PortKey};

    use super::*;

    #[test]
    fn decisions_are_gauges_per_port() {
        let metrics = std::sync::Arc::new(FeedbackMetrics::default());
        let mut registry = Registry::with_prefix("topology_agent");
        registry.register_collector(Box::new(std::sync::Arc::clone(&metrics)));
        let key = PortKey { service: ObjectKey::new("default", "web"), port: 80, family: Family::V4 };
        let measured = Measured { baseline_us: Some(1000.0), near_us: Some(2500.0), ..Default::default() };
        metrics.set(Inputs::from([(key, PortInput { shift: 0.25, measured, ..Default::default() })]));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let labels = "{service=\"default/web\",port=\"80\",family=\"IPv4\"}";
        assert!(text.contains(&format!("topology_agent_feedback_shift_ratio{labels} 0.25")), "{text}");
        assert!(text.contains(&format!("topology_agent_feedback_zone_latency_ratio{labels} 2.5")), "{text}");
        assert!(!text.contains("feedback_other_zones_latency_ratio{"), "no far reading, no sample: {text}");
        assert!(text.contains(&format!("topology_agent_feedback_panic{labels} 0")), "{text}");
    }
}
