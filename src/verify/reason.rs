//! Why a stage of verification failed, kept as its cause (a remote error, an HTTP answer, what a
//! judge found) until the report: callers tell a cancel from a failure by the variant, and the
//! report's words come from `Display`, the same text the stage has always shown.

use std::sync::Arc;
use std::time::Duration;

use crate::remote::http::ApiError;
use crate::remote::{error_chain, RemoteError};

/// Why a stage failed: the `reason` of a [`super::Failure`].
#[derive(Debug, thiserror::Error)]
pub enum Reason {
    /// Before the first poll: systemd could not be asked, or the port could not be forwarded.
    #[error("{}", error_chain(.0))]
    Start(#[source] RemoteError),
    /// systemd showed a crash, a restart or a new invocation (`crash_reason`'s words).
    #[error("crashed {:.1}s after the restart: {crash}", .after.as_secs_f64())]
    Crashed {
        after: Duration,
        // A judge's verdict, not a failure to read: its words are the whole of what it found.
        crash: String,
    },
    /// systemd could not be asked while the server started.
    #[error("{}", error_chain(.0))]
    Unreachable(#[source] RemoteError),
    /// Verification was cancelled (Ctrl-C, SIGTERM, a group's failed rank); the text says what
    /// stopped it (`signals::interrupted`).
    #[error("{0}")]
    Cancelled(String),
    /// A sample (GPU memory, the unit's signs of life) could not be read.
    #[error("{}", error_chain(.0))]
    Sample(#[source] RemoteError),
    /// A judge found the samples wanting: memory over its ceiling or dropping, a dead worker, a
    /// stall, a plateau off the expected GPU memory.
    // The core's judges return their verdicts as words: nothing failed, so there is no cause to keep.
    #[error("{0}")]
    Judged(String),
    /// `/v1/models` did not answer (after its tries).
    #[error(transparent)]
    Models(Arc<ApiError>),
    /// `/v1/models` does not list the expected model.
    #[error("/v1/models lists {serving:?}, not the expected `{expected}`: wrong model")]
    WrongModel {
        serving: Vec<String>,
        expected: String,
    },
    /// The model's context length is not the manifest's.
    #[error("max_model_len is {got}, the manifest sets context-length {want}")]
    ContextLength { got: u64, want: u64 },
    /// The port answered, but warmup outlasted its timeout; `last` is what the probe saw last.
    #[error("still warming up {warming:.0}s after the port opened (warmup timeout {timeout:?}); last: {last}")]
    WarmupTimeout {
        warming: f64,
        timeout: Duration,
        last: String,
    },
    /// Not ready by the load deadline; `last` is what the probe saw last.
    #[error("not ready after the {deadline:?} load deadline; last: {last}")]
    LoadDeadline { deadline: Duration, last: String },
    /// The smoke completion got no answer.
    #[error(transparent)]
    Smoke(ApiError),
    /// The smoke completion's answer lacks the expected text; `cut` when it stopped at
    /// `max_tokens`.
    #[error("answered {content:?}, which lacks {expect:?}{}", if *.cut { " (cut at max_tokens: raise verify.smoke.max_tokens)" } else { "" })]
    SmokeLacks {
        content: String,
        expect: String,
        cut: bool,
    },
}
