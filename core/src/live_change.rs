//! What a live change tells the running server, and how it is told back: the requests'
//! bodies and the plan's words. Apart from the decisions in `crate::live`, so that a plan can
//! hold one without importing them.

use serde::Serialize;
use serde_json::Value;

/// What a live change does to the running server.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LiveChange {
    /// The checkpoint the server moves to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weights: Option<Move>,
    /// The values `/set_internal_state` sets.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub settings: Vec<SettingChange>,
}

/// From one checkpoint to another. `tokenizer_follows`: the unit has no `--tokenizer-path`, so a
/// restart would read the tokenizer from the new checkpoint, where a weight update keeps the one
/// it loaded: the two checkpoints' tokenizer files must be the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Move {
    pub from: String,
    pub to: String,
    pub tokenizer_follows: bool,
}

/// One `/set_internal_state` value, before and after.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SettingChange {
    pub flag: String,
    pub key: String,
    pub from: Value,
    pub to: Value,
}

impl LiveChange {
    /// The change that puts the previous weights and values back.
    pub fn reverse(&self) -> LiveChange {
        LiveChange {
            weights: self.weights.as_ref().map(|m| Move {
                from: m.to.clone(),
                to: m.from.clone(),
                tokenizer_follows: m.tokenizer_follows,
            }),
            settings: self
                .settings
                .iter()
                .map(|s| SettingChange {
                    flag: s.flag.clone(),
                    key: s.key.clone(),
                    from: s.to.clone(),
                    to: s.from.clone(),
                })
                .collect(),
        }
    }

    /// `/update_weights_from_disk`'s body: the requests in flight finish first (no abort), and the
    /// prefix cache, computed with the old weights, is flushed.
    pub fn weights_body(&self) -> Option<Value> {
        self.weights.as_ref().map(|m| {
            serde_json::json!({
                "model_path": m.to,
                "abort_all_requests": false,
                "flush_cache": true,
            })
        })
    }

    /// `/set_internal_state`'s body, when there are values to set.
    pub fn settings_body(&self) -> Option<Value> {
        if self.settings.is_empty() {
            return None;
        }
        let args: serde_json::Map<String, Value> = self
            .settings
            .iter()
            .map(|s| (s.key.clone(), s.to.clone()))
            .collect();
        Some(serde_json::json!({ "server_args": args }))
    }

    /// What the plan says of it: `the weights move to /models/b; --pp-max-micro-batch-size 4 -> 8`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(m) = &self.weights {
            parts.push(format!(
                "the weights move to {} (same architecture; /update_weights_from_disk)",
                m.to
            ));
        }
        for s in &self.settings {
            parts.push(format!(
                "--{} {} -> {} (/set_internal_state)",
                s.flag, s.from, s.to
            ));
        }
        parts.join("; ")
    }
}
