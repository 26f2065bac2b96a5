//! sglang-router's worker list and what a rollout may do with it. Pure: the binary's `router`
//! module fetches `/workers` and acts on these answers.
//!
//! Read from the sglang-router 0.3.2 wheel (`sglang_router-0.3.2.dist-info/METADATA`, "Multi-Model
//! Inference Gateway" and "Administrative & Worker APIs"): `GET /workers` answers
//! `{"workers": [{"id", "url", "model_id", "is_healthy", "load", ...}], "total", "stats"}`;
//! `POST /workers` and `DELETE /workers/{id}` answer 202 and only queue the change, so a caller
//! waits until the list shows it. The router health-checks a worker on the worker's own `/health`
//! (`--health-check-endpoint`, default `/health`, `sglang_router/router_args.py`), and on
//! registration it also reads `/server_info` and `/model_info` (seen in the stand-in's access log
//! against the real router).

use serde::Deserialize;

/// One worker as the router lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worker {
    /// The router's id for it (a UUID), which `DELETE /workers/{id}` takes.
    pub id: String,
    pub url: String,
    /// The model the router found on it (`served_model_name`); `None` when it has not said.
    pub model_id: Option<String>,
    pub healthy: bool,
}

#[derive(Deserialize)]
struct RawList {
    workers: Vec<RawWorker>,
}

#[derive(Deserialize)]
struct RawWorker {
    id: String,
    url: String,
    #[serde(default)]
    model_id: Option<String>,
    #[serde(default)]
    is_healthy: bool,
}

/// A `GET /workers` answer that is not the router's worker list (an error object, a proxy's
/// page).
#[derive(Debug, thiserror::Error)]
#[error("the router's /workers answer is not a worker list: {source}")]
pub struct WorkersError {
    #[source]
    pub source: serde_json::Error,
}

/// The workers of a `GET /workers` answer.
pub fn parse_workers(body: &str) -> Result<Vec<Worker>, WorkersError> {
    let list: RawList = serde_json::from_str(body).map_err(|source| WorkersError { source })?;
    Ok(list
        .workers
        .into_iter()
        .map(|w| Worker {
            id: w.id,
            url: w.url,
            model_id: w.model_id,
            healthy: w.is_healthy,
        })
        .collect())
}

/// Whether two worker URLs name the same worker: scheme and host are case-insensitive, and a
/// trailing `/` does not matter (the router keeps the URL as it was registered).
pub fn same_url(a: &str, b: &str) -> bool {
    let norm = |u: &str| u.trim().trim_end_matches('/').to_ascii_lowercase();
    norm(a) == norm(b)
}

/// The router's entry for the worker at `url`, if it lists one.
pub fn find<'a>(workers: &'a [Worker], url: &str) -> Option<&'a Worker> {
    workers.iter().find(|w| same_url(&w.url, url))
}

/// What a rollout may do with a replica before restarting it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeOut {
    /// The router does not list it (a new replica, or one removed by hand): nothing to take out;
    /// it is added once verified.
    NotListed,
    /// Remove the worker with this id.
    Remove { id: String },
    /// Taking it out would leave fewer than `min_available` healthy replicas of its model.
    Refuse(String),
}

/// Whether the replica at `url` may leave the router: every other healthy worker of its model
/// counts, and at least `min_available` must stay. A replica the router already holds unhealthy
/// serves nothing, so taking it out costs nothing.
pub fn take_out(workers: &[Worker], url: &str, min_available: usize) -> TakeOut {
    let Some(me) = find(workers, url) else {
        return TakeOut::NotListed;
    };
    let others = workers
        .iter()
        .filter(|w| !same_url(&w.url, url) && w.healthy && w.model_id == me.model_id)
        .count();
    if me.healthy && others < min_available {
        let model = me.model_id.as_deref().unwrap_or("(unnamed model)");
        return TakeOut::Refuse(format!(
            "taking {url} out of the router would leave {others} healthy replica(s) of `{model}` \
             (min_available {min_available})"
        ));
    }
    TakeOut::Remove { id: me.id.clone() }
}

/// Where the replica at `url` stands in the router, for waiting on a queued change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listed {
    Absent,
    Unhealthy,
    Healthy,
}

pub fn listed(workers: &[Worker], url: &str) -> Listed {
    match find(workers, url) {
        None => Listed::Absent,
        Some(w) if w.healthy => Listed::Healthy,
        Some(_) => Listed::Unhealthy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The answer of the real sglang-router 0.3.2 with two stand-in workers registered (captured
    /// with curl against `launch_router`; one id shortened to keep the line short).
    const TWO: &str = r#"{"workers":[{"id":"2ceda44b-5205-48c5-b029-56bcabad5660","url":"http://127.0.0.1:39502","model_id":"qwen","priority":50,"cost":1.0,"worker_type":"regular","is_healthy":true,"load":0,"connection_mode":"HTTP","metadata":{"served_model_name":"qwen","dp_size":"1"},"disable_health_check":false},{"id":"0d16","url":"http://127.0.0.1:39501","model_id":"qwen","priority":50,"cost":1.0,"worker_type":"regular","is_healthy":true,"load":0,"connection_mode":"HTTP","metadata":{},"disable_health_check":false}],"total":2,"stats":{"prefill_count":0,"decode_count":0,"regular_count":2}}"#;

    fn worker(id: &str, url: &str, model: &str, healthy: bool) -> Worker {
        Worker {
            id: id.into(),
            url: url.into(),
            model_id: Some(model.into()),
            healthy,
        }
    }

    #[test]
    fn the_real_routers_list_parses() {
        let w = parse_workers(TWO).unwrap();
        assert_eq!(w.len(), 2);
        assert_eq!(w[1], worker("0d16", "http://127.0.0.1:39501", "qwen", true));
        let empty = r#"{"workers":[],"total":0,"stats":{"prefill_count":0,"decode_count":0,"regular_count":0}}"#;
        assert_eq!(parse_workers(empty).unwrap(), vec![]);
        let e = parse_workers(r#"{"error":"Unauthorized"}"#).unwrap_err();
        assert!(e.to_string().contains("not a worker list"), "{e}");
        assert!(e.source.is_data(), "{e:?}");
    }

    #[test]
    fn urls_match_without_case_or_trailing_slash() {
        assert!(same_url("http://Host-A:30000/", "http://host-a:30000"));
        assert!(!same_url("http://host-a:30000", "http://host-a:30001"));
    }

    #[test]
    fn the_last_healthy_replica_of_a_model_is_never_taken_out() {
        let w = vec![
            worker("a", "http://a:1", "qwen", true),
            worker("b", "http://b:1", "qwen", false),
            worker("c", "http://c:1", "llama", true),
        ];
        // b is unhealthy and c serves another model: a is qwen's last healthy replica.
        match take_out(&w, "http://a:1", 1) {
            TakeOut::Refuse(why) => {
                assert!(
                    why.contains("leave 0 healthy replica(s) of `qwen`"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
        // The unhealthy one may go: it serves nothing.
        assert_eq!(
            take_out(&w, "http://b:1", 1),
            TakeOut::Remove { id: "b".into() }
        );
        // min_available 0 lets the last one go.
        assert_eq!(
            take_out(&w, "http://a:1", 0),
            TakeOut::Remove { id: "a".into() }
        );
    }

    #[test]
    fn min_available_counts_the_others_of_the_same_model() {
        let w = vec![
            worker("a", "http://a:1", "qwen", true),
            worker("b", "http://b:1", "qwen", true),
            worker("c", "http://c:1", "qwen", true),
        ];
        assert_eq!(
            take_out(&w, "http://a:1", 2),
            TakeOut::Remove { id: "a".into() }
        );
        assert!(matches!(take_out(&w, "http://a:1", 3), TakeOut::Refuse(_)));
        assert_eq!(take_out(&w, "http://d:1", 1), TakeOut::NotListed);
    }

    #[test]
    fn listed_says_where_a_replica_stands() {
        let w = vec![
            worker("a", "http://a:1", "qwen", true),
            worker("b", "http://b:1", "qwen", false),
        ];
        assert_eq!(listed(&w, "http://a:1/"), Listed::Healthy);
        assert_eq!(listed(&w, "http://b:1"), Listed::Unhealthy);
        assert_eq!(listed(&w, "http://c:1"), Listed::Absent);
    }
}
