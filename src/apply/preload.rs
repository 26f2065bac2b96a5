//! Preloading a restarting server's weights into its host's page cache while the old server still
//! serves (`reconcile_core::preload` decides whether and words the outcome; this reads the files).

use std::time::Instant;

use reconcile_core::preload::{PreloadPlan, Preloading};
use tokio_util::sync::CancellationToken;

use crate::remote::{error_chain, Host};

/// Reads `plan`'s files (relative to `model_path`) whole, at the lowest I/O and CPU priority
/// (`ionice -c 3`, the idle class, where the host's I/O scheduler honours it: BFQ does, `none`
/// and `mq-deadline` do not; then `nice -n 19`), for at most the plan's limit (`timeout`'s exit
/// 124). Arguments: the model folder, the limit in seconds, then the files.
const PRELOAD_SCRIPT: &str = r#"# stage: the model's weights read into the page cache
d=$1 limit=$2; shift 2
cd -- "$d" || exit 1
if ionice -c 3 true 2>/dev/null; then low="ionice -c 3 nice -n 19"; else low="nice -n 19"; fi
timeout -k 5 "$limit" $low cat -- "$@" >/dev/null
"#;

/// Preloads `plan` on `host`. A signal (`cancel`) ends the wait, not the apply: the stop that
/// follows is where a signal stops it. Preloading never fails the apply; its outcome is reported.
pub(super) async fn preload(
    host: &dyn Host,
    model_path: &str,
    plan: &PreloadPlan,
    cancel: &CancellationToken,
) -> Preloading {
    let limit = plan.limit.as_secs().max(1).to_string();
    let mut argv: Vec<&str> = vec!["sh", "-c", PRELOAD_SCRIPT, "sh", model_path, &limit];
    argv.extend(plan.files.iter().map(String::as_str));
    let started = Instant::now();
    // The command's own `timeout` ends the read; this bound is for a host that stops answering.
    let bound = plan.limit + std::time::Duration::from_secs(30);
    let read = host.run_within(&argv, None, bound);
    let ended = tokio::select! {
        out = read => out,
        () = cancel.cancelled() => {
            let mut cut = Preloading::ended(plan, 124, "", started.elapsed().as_secs_f64());
            cut.why = Some("a signal stopped the apply".into());
            return cut;
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    match ended {
        Ok(out) => Preloading::ended(plan, out.status, &out.stderr, seconds),
        Err(e) => Preloading::ended(plan, -1, &error_chain(&e), seconds),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_files_are_read_whole_and_a_missing_one_fails_the_staging_not_the_apply() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.safetensors"), vec![7u8; 1 << 20]).unwrap();
        let host = crate::remote::Local::new(Default::default());
        let plan = PreloadPlan {
            files: vec!["a.safetensors".into()],
            bytes: 1 << 20,
            limit: std::time::Duration::from_secs(60),
        };
        let model = dir.path().to_str().unwrap();
        let never = CancellationToken::new();
        let preloaded = preload(&host, model, &plan, &never).await;
        assert_eq!(
            preloaded.outcome,
            reconcile_core::preload::PreloadOutcome::Preloaded,
            "{preloaded:?}"
        );
        let missing = PreloadPlan {
            files: vec!["b.safetensors".into()],
            ..plan
        };
        let failed = preload(&host, model, &missing, &never).await;
        assert_eq!(
            failed.outcome,
            reconcile_core::preload::PreloadOutcome::Failed
        );
        assert!(
            failed
                .why
                .as_deref()
                .unwrap_or("")
                .contains("b.safetensors"),
            "{failed:?}"
        );
    }
}
