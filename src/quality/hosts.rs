//! `reconcile quality SERVICE`: the quality measurement alone, against the server each host runs
//! now (no restart), under the unit's lock. It is compared with the reference the host keeps for
//! these settings, when there is one, and becomes the reference: what the next apply's `quality`
//! stage compares with.

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use reconcile_core::quality::{self, Floors, QualityReport, QualitySpec};

use crate::apply::state::{self, LockPolicy, Owner};
use crate::remote::{error_chain, Host, SshOptions};
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

/// Measures `unit` on each host (at most `at_once` at once).
pub async fn quality_hosts(
    hosts: &[String],
    unit: &str,
    ssh: &SshOptions,
    at_once: usize,
    options: &QualityOptions<'_>,
) -> Vec<HostQuality> {
    crate::fleet::each_host(
        hosts.iter().map(|h| (h.clone(), ())),
        ssh,
        at_once,
        crate::fleet::no_span,
        async |host: &dyn Host, visit: &crate::fleet::Visit<'_>, ()| {
            let mut out = HostQuality::new(visit.name, unit);
            if let Err(e) = quality_host(host, unit, options, &mut out).await {
                out.error = Some(e);
            }
            out.seconds = visit.started.elapsed().as_secs_f64();
            out
        },
        |visit, (), e| HostQuality {
            error: Some(format!("unreachable: {}", error_chain(&e))),
            seconds: visit.started.elapsed().as_secs_f64(),
            ..HostQuality::new(visit.name, unit)
        },
    )
    .await
}

async fn quality_host(
    host: &dyn Host,
    unit: &str,
    options: &QualityOptions<'_>,
    out: &mut HostQuality,
) -> Result<(), String> {
    let text = crate::systemd::running_unit(host, unit, "measure")
        .await
        .map_err(|e| e.to_string())?;
    let note = state::lock(host, unit, &options.owner, options.lock)
        .await
        .map_err(|e| e.to_string())?;
    out.notes.extend(note);
    let result = measure_and_store(host, unit, &text, options, out).await;
    state::unlock_noting(host, unit, &mut out.notes).await;
    result
}

/// Under the lock: the kept reference, the measurement, and the new reference kept.
async fn measure_and_store(
    host: &dyn Host,
    unit: &str,
    unit_text: &str,
    options: &QualityOptions<'_>,
    out: &mut HostQuality,
) -> Result<(), String> {
    let expect = Expect::from_unit(&parse_unit(unit_text));
    let key = quality::settings_key(options.spec, &expect.model_id);
    let (reference, note) = super::read_reference(host, unit, &key)
        .await
        .map_err(|e| error_chain(&e))?;
    out.notes.extend(note);
    let server = host
        .server(&expect.endpoint, options.url)
        .await
        .map_err(|e| error_chain(&e))?;
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
        return Err(crate::signals::interrupted());
    };
    let measured = measured?;
    // The running server is its own reference: no floor beyond its run-to-run noise, which this
    // comparison is.
    let report = measured.judge(options.spec, reference.as_ref(), Floors::default());
    let failed = report.fails().then(|| report.detail.clone());
    out.quality = Some(report);
    if let Some(e) = failed {
        return Err(format!(
            "{e}; the running server no longer answers as the kept reference says; nothing was stored"
        ));
    }
    let new = super::reference_of(options.spec, &expect.model_id, &measured);
    let path = super::keep_reference(host, unit, &new)
        .await
        .map_err(|e| error_chain(&e))?;
    out.stored = Some(path);
    Ok(())
}
