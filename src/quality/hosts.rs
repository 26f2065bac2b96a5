//! `reconcile quality SERVICE`: the quality measurement alone, against the server each host runs
//! now (no restart), under the unit's lock. It is compared with the reference the host keeps for
//! these settings, when there is one, and becomes the reference: what the next apply's `quality`
//! stage compares with.

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use reconcile_core::quality::{self, Floors, QualityReport, QualitySpec};

use super::MeasureError;
use crate::bench::running::{each_running, HostResult, Parts, Visit};
use crate::remote::{error_chain, Host, RemoteError, SshOptions};
use crate::state::{LockPolicy, Owner};
use crate::unit::parse_unit;
use crate::verify::Expect;

/// What `reconcile quality` needs besides the hosts.
pub struct QualityOptions<'a> {
    pub spec: &'a QualitySpec,
    /// `verify.url` of the manifest: reach the server there instead of a port forward.
    pub url: Option<&'a str>,
    pub owner: Owner,
    pub lock: LockPolicy,
    /// Cancelled on Ctrl-C: stops the measurement; nothing is stored.
    pub cancel: CancellationToken,
}

/// One host's measurement.
#[derive(Debug, Clone, Serialize)]
pub struct HostQuality {
    pub host: String,
    pub unit: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quality: Option<QualityReport>,
    /// Where the reference was kept, when it was.
    pub stored: Option<String>,
    pub notes: Vec<String>,
    pub error: Option<String>,
    pub seconds: f64,
}

impl HostQuality {
    fn new(host: &str, unit: &str) -> HostQuality {
        HostQuality {
            host: host.to_string(),
            unit: unit.to_string(),
            quality: None,
            stored: None,
            notes: Vec::new(),
            error: None,
            seconds: 0.0,
        }
    }
}

impl HostResult for HostQuality {
    fn new(host: &str, unit: &str) -> HostQuality {
        HostQuality::new(host, unit)
    }

    fn parts(&mut self) -> Parts<'_> {
        (&mut self.notes, &mut self.error, &mut self.seconds)
    }
}

/// Why a host's measurement did not become its reference, once its unit was found running and
/// locked.
#[derive(Debug, thiserror::Error)]
pub enum QualityError {
    /// The kept reference could not be read (a reference that reads but does not parse is a
    /// note, not this).
    #[error("{}", error_chain(.source))]
    Reference {
        #[source]
        source: RemoteError,
    },
    /// The server could not be reached (its port forward, or its client).
    #[error("{}", error_chain(.source))]
    Server {
        #[source]
        source: RemoteError,
    },
    /// Ctrl-C or SIGTERM stopped the measurement (`signals::interrupted`'s words).
    #[error("{message}")]
    Interrupted { message: String },
    /// The server did not answer what the measurement asks.
    #[error(transparent)]
    Measure(#[from] MeasureError),
    /// The running server no longer answers as its kept reference says: the verdict's detail.
    #[error("{detail}; the running server no longer answers as the kept reference says; nothing was stored")]
    Regressed { detail: String },
    /// The new reference was not written.
    #[error("{}", error_chain(.source))]
    Keep {
        #[source]
        source: RemoteError,
    },
}

/// Measures `unit` on each host (at most `at_once` at once).
pub async fn quality_hosts(
    hosts: &[String],
    unit: &str,
    ssh: &SshOptions,
    at_once: usize,
    options: &QualityOptions<'_>,
) -> Vec<HostQuality> {
    let visit = Visit {
        unit,
        to: "measure",
        owner: &options.owner,
        lock: options.lock,
    };
    each_running(
        hosts,
        ssh,
        at_once,
        &visit,
        async |host: &dyn Host, text: &str, out: &mut HostQuality| {
            measure_and_store(host, unit, text, options, out).await
        },
    )
    .await
}

/// Under the lock: the kept reference, the measurement, and the new reference kept.
async fn measure_and_store(
    host: &dyn Host,
    unit: &str,
    unit_text: &str,
    options: &QualityOptions<'_>,
    out: &mut HostQuality,
) -> Result<(), QualityError> {
    let expect = Expect::from_unit(&parse_unit(unit_text));
    let key = quality::settings_key(options.spec, &expect.model_id);
    let (reference, note) = super::read_reference(host, unit, &key)
        .await
        .map_err(|source| QualityError::Reference { source })?;
    out.notes.extend(note);
    let server = host
        .server(&expect.endpoint, options.url)
        .await
        .map_err(|source| QualityError::Server { source })?;
    let context = expect.context_length.map(|c| c as u32);
    let measuring = super::measure(
        &server,
        &expect.model_id,
        options.spec,
        reference.as_ref(),
        context,
        expect.reasoning,
    );
    let Some(measured) = options.cancel.run_until_cancelled(measuring).await else {
        return Err(QualityError::Interrupted {
            message: crate::signals::interrupted(),
        });
    };
    let measured = measured?;
    // The running server is its own reference: no floor beyond its run-to-run noise, which this
    // comparison is.
    let report = measured.judge(options.spec, reference.as_ref(), Floors::default());
    let failed = report.fails().then(|| report.detail.clone());
    out.quality = Some(report);
    if let Some(e) = failed {
        return Err(QualityError::Regressed { detail: e });
    }
    let new = super::reference_of(options.spec, &expect.model_id, &measured);
    let path = super::keep_reference(host, unit, &new)
        .await
        .map_err(|source| QualityError::Keep { source })?;
    out.stored = Some(path);
    Ok(())
}
