//! The `quality` stage: after the benchmark, when the manifest has `verify.quality`, the new
//! server's answers are compared with the reference the host keeps (`crate::quality`), and
//! judged by `reconcile_core::quality::judge`. A failure with the gate on rolls back like any
//! other stage.
//!
//! Two measurements frame a restart:
//! - [`before`], while the old server still serves: the reference is read, and scored once more
//!   by the old server: its run-to-run KL, the noise floor the threshold is a multiple of. With no
//!   reference for these settings yet, the old server's own answers become it, so the first change
//!   is judged too;
//! - [`stage`], on the new server: its scores of the reference's tokens, its own greedy tokens,
//!   its distributions over the reference's fixed texts, the needle, the long-context tasks and
//!   the cases.

use std::time::Instant;

use reconcile_core::quality::{self, Floors, QualityReport, QualitySpec, Reference};

use super::Job;
use crate::quality::{self as measure, Measured};
use crate::remote::{error_chain, RemoteError};
use crate::verify::{Expect, Stage, Verification};

/// What was measured before the restart.
#[derive(Debug, Default)]
pub struct Before {
    pub reference: Option<Reference>,
    /// The old server's KL against the reference, over its greedy tokens and over its texts:
    /// the noise floors.
    pub floors: Floors,
    /// What the report should say about it (no old server, an unusable reference, ...).
    pub notes: Vec<String>,
    /// Wall seconds the old server was measured for, when it was.
    pub seconds: Option<f64>,
}

/// The reference, and the old server's noise floor, read while the old server still serves.
/// `previous`: what the old unit serves, when it was running; `live`: the change is a live one.
pub async fn before(
    job: &Job<'_>,
    spec: &QualitySpec,
    previous: Option<&Expect>,
    live: bool,
) -> Before {
    let (host, t) = (job.host, job.t);
    // A live weight move keeps the architecture and the tokenizer (`reconcile_core::live`): the
    // new checkpoint is judged against the previous one's answers, as a restart under one served
    // name is, though the server answers under the new path.
    let model = match previous {
        Some(previous) if live => previous.model_id.clone(),
        _ => Expect::from_unit(&t.desired.model).model_id,
    };
    let key = quality::settings_key(spec, &model);
    let mut out = Before::default();
    match measure::read_reference(host, &t.desired.unit, &key).await {
        Ok((reference, note)) => {
            out.reference = reference;
            out.notes.extend(note);
        }
        Err(e) => out.notes.push(format!(
            "quality: the reference could not be read ({}); it is recorded anew",
            error_chain(&e)
        )),
    }
    let Some(previous) = previous else {
        out.notes
            .push("quality: no server ran before: no noise floor (taken as 0)".into());
        return out;
    };
    let server = match host
        .server(&previous.endpoint, t.verify.url.as_deref())
        .await
    {
        Ok(s) => s,
        Err(e) => {
            out.notes.push(format!(
                "quality: the running server could not be reached for a noise floor ({})",
                error_chain(&e)
            ));
            return out;
        }
    };
    let started = Instant::now();
    // No reference for these settings yet: the old server's answers are it, when it serves the
    // same model (a reference of another model means nothing for this one).
    if out.reference.is_none() && previous.model_id == model {
        let context = previous.context_length.map(|c| c as u32);
        match measure::measure(&server, &model, spec, None, context, previous.reasoning).await {
            Ok(m) => {
                let reference = measure::reference_of(spec, &model, &m);
                out.notes.push(format!(
                    "quality: no reference for these settings; the running server's answers are it (measured in {:.1}s)",
                    m.seconds
                ));
                out.reference = Some(reference);
            }
            Err(e) => out.notes.push(format!(
                "quality: the running server did not answer for a reference ({e})"
            )),
        }
    }
    if let Some(reference) = &out.reference {
        match measure::score(&server, reference).await {
            Ok(scored) => out.floors.greedy = Some(quality::mean_kl(reference, &scored)),
            Err(e) => out.notes.push(format!(
                "quality: the running server could not score the reference for a noise floor ({e}); taken as 0"
            )),
        }
        match measure::text_floor(&server, spec, reference).await {
            Ok(floor) => out.floors.text = floor,
            Err(e) => out.notes.push(format!(
                "quality: the running server could not score the reference's texts for a noise floor ({e}); taken as 0"
            )),
        }
    }
    out.seconds = Some(started.elapsed().as_secs_f64());
    out
}

/// Measures the unit just verified (`v`, which gains the stage) and judges it against what
/// [`before`] found. Returns the report, and the reference to keep if the deployment converges.
pub async fn stage(
    job: &Job<'_>,
    spec: &QualitySpec,
    v: &mut Verification,
    before: &Before,
) -> (QualityReport, Option<Reference>) {
    let (expect, progress) = job.measuring("quality");
    let started = Instant::now();
    let measured = async {
        let server = job.server(&expect).await.map_err(NotMeasured::Unreached)?;
        let context = expect.context_length.map(|c| c as u32);
        measure::measure(
            &server,
            &expect.model_id,
            spec,
            before.reference.as_ref(),
            context,
            expect.reasoning,
        )
        .await
        .map_err(NotMeasured::Measure)
    };
    let measured: Result<Measured, NotMeasured> = job
        .options
        .cancel
        .run_until_cancelled(measured)
        .await
        .unwrap_or_else(|| Err(NotMeasured::Interrupted(crate::signals::interrupted())));
    let (mut report, keep) = match measured {
        Ok(m) => (
            m.judge(spec, before.reference.as_ref(), before.floors),
            Some(measure::reference_of(spec, &expect.model_id, &m)),
        ),
        Err(e) => (QualityReport::could_not_run(spec, &e.to_string()), None),
    };
    report.notes.extend(before.notes.iter().cloned());
    report.before_seconds = before.seconds;
    v.push_after(Stage::Quality, !report.fails(), started, &report.detail);
    progress.stage(Stage::Quality, !report.fails(), &report.detail);
    (report, keep)
}

/// Why the unit just verified could not be measured: the gate then could not run.
#[derive(Debug, thiserror::Error)]
enum NotMeasured {
    /// Its server could not be reached through its host.
    #[error("{}", error_chain(.0))]
    Unreached(#[source] RemoteError),
    /// The measurement failed.
    #[error("{0}")]
    Measure(#[source] crate::quality::MeasureError),
    /// A signal came first (the signals module's words for it).
    #[error("{0}")]
    Interrupted(String),
}
