//! `reconcile experiment FILE`: the variants of one service tried on one host, unattended.
//!
//! Everything is checked offline first: the experiment file, the manifest, and every variant (the
//! manifest with the variant's keys written in, `reconcile_core::experiment::variant_text`) loaded
//! and checked against the SGLang catalog exactly as `reconcile apply` would load it; a finding in
//! a variant's key is reported at the experiment file's line that sets it. Then, on the host:
//!
//! 1. the baseline is made sure of (applied if the host does not run it) and benchmarked;
//! 2. each variant goes through apply's own path (`apply::apply_one`: preflight, lock, drain,
//!    install, restart, staged verification, benchmark, quality gate, rollback on failure), then
//!    the baseline is applied again the same way, so the next variant starts from it. A variant
//!    that fails is kept in the results with its stage, journal diagnosis and detail;
//! 3. the baseline is benchmarked again: the drift check between the two baselines decides
//!    whether the ranking is trusted;
//! 4. `--keep-best` applies the winner once more and leaves it running.
//!
//! After each run the report so far is written on the host (`experiment.json` in the unit's
//! state folder), so `--resume` continues from there after Ctrl-C, SIGTERM or a lost connection;
//! each of those ends with the baseline restored and verified.

mod measure;
mod state;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use reconcile_core::experiment::{self as core, eta, results, Experiment, Report};
use reconcile_core::learned::LoadHistory;
use tokio_util::sync::CancellationToken;

use crate::apply::{self, ApplyOptions, LockPolicy, Outcome, Owner, UnitReport};
use crate::manifest::{Manifest, ManifestError, ManifestErrors};
use crate::remote::{self, error_chain, Host, RemoteError, SshOptions};
use crate::targets::{self, Filter, Target};

/// What the command line asks for.
#[derive(Debug, Clone)]
pub struct Options {
    pub keep_best: bool,
    pub write: bool,
    pub resume: bool,
    pub chart: Option<PathBuf>,
    pub estimate_only: bool,
    pub lock: LockPolicy,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: cannot read")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The experiment file, the manifest or a variant is wrong; nothing was started.
    #[error(transparent)]
    Invalid(#[from] ManifestErrors),
    #[error("{host}: cannot connect: {}; nothing was changed", error_chain(.source))]
    Unreachable {
        host: String,
        #[source]
        source: RemoteError,
    },
    #[error("the baseline {unit} on {host} is not running as its manifest says ({detail}); fix it with `reconcile apply` first, the experiment changed nothing else")]
    Baseline {
        unit: String,
        host: String,
        detail: String,
    },
    #[error("the estimate, {estimate}, is over the experiment's budget of {budget}; nothing was started (fewer variants or levels, or a larger `budget:`)")]
    OverBudget { estimate: String, budget: String },
    #[error("--resume: {0}")]
    Resume(#[source] ResumeError),
    #[error("{path}: cannot write the {what}")]
    Write {
        path: String,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Why `--resume` has nothing to continue.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// The kept progress is another experiment's (another experiment file or manifest).
    #[error("the experiment {unit} on {host} left was run with another experiment file or manifest; run it anew without --resume")]
    Another { unit: String, host: String },
    /// Nothing was kept.
    #[error("no interrupted experiment of {unit} on {host}")]
    Nothing { unit: String, host: String },
    /// The kept progress cannot be read.
    #[error(transparent)]
    State(#[from] state::StateError),
}

/// Why the baseline may not be running after a variant.
#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    /// The connection was lost and could not be made again: the host may run the variant.
    #[error("the host could not be reached again to restore the baseline ({})", error_chain(.0))]
    Unreachable(#[source] RemoteError),
    /// Applying the baseline again did not succeed; `detail` is apply's.
    #[error("restoring the baseline failed ({detail}): the host needs attention")]
    Failed { detail: String },
}

/// What the run came to, for the report.
#[derive(Debug, serde::Serialize)]
pub struct Done {
    #[serde(flatten)]
    pub report: Report,
    /// The estimate before the start (`6 variants, about 1 h 50 min`).
    pub estimate: String,
    /// The winner's change to the manifest, as a unified diff.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifest_diff: Option<String>,
    /// The manifest file `--write` edited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub written: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chart: Option<String>,
    #[serde(skip)]
    pub levels: Vec<u32>,
    /// Only the estimate was asked for.
    #[serde(skip)]
    pub estimate_only: bool,
    /// The baseline could not be restored at some point: the host needs attention.
    pub needs_attention: Option<String>,
}

impl Done {
    /// 0: finished (failed variants are results, not errors); 2: finished but the drift check
    /// does not trust the ranking; 3: interrupted (baseline restored, `--resume` continues);
    /// 4: the baseline could not be restored.
    pub fn exit_code(&self) -> u8 {
        if self.needs_attention.is_some() {
            4
        } else if self.report.interrupted {
            3
        } else if self.estimate_only || self.report.drift.as_ref().is_some_and(|d| d.trusted) {
            0
        } else {
            2
        }
    }
}

/// Everything checked offline: the experiment, the baseline and each variant's target.
struct Prepared {
    experiment: Experiment,
    /// The experiment file's and manifest's texts, which the host's state is tied to.
    digest: String,
    manifest_path: PathBuf,
    manifest_text: String,
    manifest: Manifest,
    redactor: crate::redact::Redactor,
    /// Each variant's manifest, in the experiment's order.
    variants: Vec<Manifest>,
}

pub async fn run(file: &Path, options: &Options, ssh: &SshOptions) -> Result<Done, Error> {
    let p = prepare(file)?;
    let e = &p.experiment;
    let baseline = target(&p.manifest, &e.host, Some(e.benchmark.clone()))?;
    // Restoring the baseline between variants: verified (and its answers become the reference
    // the next variant's quality gate compares with), not benchmarked; the baseline's figures
    // come from its two measurements.
    let restore = target(&p.manifest, &e.host, None)?;
    let variants: Vec<Target> = p
        .variants
        .iter()
        .map(|m| target(m, &e.host, Some(e.benchmark.clone())))
        .collect::<Result<_, _>>()?;

    let host = remote::connect(&e.host, ssh)
        .await
        .map_err(|source| Error::Unreachable {
            host: e.host.clone(),
            source,
        })?;
    let outcome = run_on(&*host, &p, options, &baseline, &restore, &variants).await;
    host.close().await;
    let mut done = outcome?;
    if done.estimate_only || done.report.interrupted {
        return Ok(done);
    }
    finish(&p, options, &mut done)?;
    Ok(done)
}

async fn run_on(
    host: &dyn Host,
    p: &Prepared,
    options: &Options,
    baseline: &Target,
    restore: &Target,
    variants: &[Target],
) -> Result<Done, Error> {
    let e = &p.experiment;
    let unit = &baseline.desired.unit;
    let per = per_run(host, baseline, e).await;
    let estimate = format!(
        "{} variants, {}",
        e.variants.len(),
        eta::human(eta::before_start(e.variants.len(), &per))
    );
    eprintln!("experiment {unit} on {}: {estimate}", e.host);
    let mut done = Done {
        report: Report::new(e, unit),
        estimate: estimate.clone(),
        manifest_diff: None,
        written: None,
        chart: None,
        levels: e.benchmark.levels.clone(),
        estimate_only: options.estimate_only,
        needs_attention: None,
    };
    if let Some(budget) = e.budget {
        let total = eta::before_start(e.variants.len(), &per);
        if total > budget {
            return Err(Error::OverBudget {
                estimate: eta::human(total),
                budget: humantime::format_duration(budget).to_string(),
            });
        }
    }
    if options.estimate_only {
        return Ok(done);
    }
    let saved = state::read(host, unit).await;
    if !options.resume {
        if let Ok(Some(s)) = &saved {
            eprintln!(
                "note: an interrupted experiment of {unit} on {} ({} variants done) is started anew; --resume would have continued it",
                e.host,
                s.report.variants.len()
            );
        }
    }
    if options.resume {
        match saved {
            Ok(Some(s)) if s.digest == p.digest => {
                eprintln!(
                    "resuming: {} of {} variants done",
                    s.report.variants.len(),
                    e.variants.len()
                );
                done.report = s.report;
                done.report.interrupted = false;
            }
            Ok(Some(_)) => {
                return Err(Error::Resume(ResumeError::Another {
                    unit: unit.to_string(),
                    host: e.host.clone(),
                }))
            }
            Ok(None) => {
                return Err(Error::Resume(ResumeError::Nothing {
                    unit: unit.to_string(),
                    host: e.host.clone(),
                }))
            }
            Err(why) => return Err(Error::Resume(why.into())),
        }
    }

    let cancel = crate::signals::stop_on_signal();
    // No deep check (the host's SGLang parsing the argv, 7-13 s on the real CPU tier): every
    // variant was checked against its version's catalog before the start, a variant the host's
    // SGLang still refuses fails at its start and is rolled back with argparse's message in its
    // diagnosis, and the baseline ran on this host already. Run per variant it would be most of
    // the experiment's own time.
    let apply_options = ApplyOptions::new(
        Owner::this_process(),
        options.lock,
        cancel.clone(),
        p.redactor.clone(),
    )
    .deep(crate::preflight::DeepWhen::Never);
    // Putting the baseline back is what a stop asks for: it is not itself stopped by the signal
    // that interrupted the variant (a second signal does; see `signals`).
    let restore_options = ApplyOptions {
        cancel: CancellationToken::new(),
        ..apply_options.clone()
    };

    // 1. The baseline, running and measured.
    let first = apply::apply_one(host, restore, &restore_options).await;
    if !matches!(
        first.outcome,
        Outcome::Unchanged | Outcome::Converged | Outcome::Reloaded
    ) {
        return Err(Error::Baseline {
            unit: unit.clone(),
            host: e.host.clone(),
            detail: first.detail,
        });
    }
    if done.report.baseline.is_none() {
        let b = measure::baseline(host, baseline, &e.benchmark, &cancel).await;
        let interrupted = b.is_none();
        done.report.baseline = b;
        if interrupted || cancel.is_cancelled() {
            done.report.interrupted = true;
            state::write(host, unit, &p.digest, &done.report).await;
            return Ok(done);
        }
        state::write(host, unit, &p.digest, &done.report).await;
    }

    // 2. Each variant, from the baseline, back to the baseline.
    let mut took = Vec::new();
    for (i, (v, t)) in e.variants.iter().zip(variants).enumerate() {
        if done.report.variants.iter().any(|r| r.name == v.name) {
            continue;
        }
        if cancel.is_cancelled() {
            done.report.interrupted = true;
            break;
        }
        eprintln!(
            "variant {}/{} {}: {}",
            i + 1,
            e.variants.len(),
            v.name,
            v.changes
                .iter()
                .map(core::Change::text)
                .collect::<Vec<_>>()
                .join(", ")
        );
        let started = Instant::now();
        let report = apply::apply_one(host, t, &apply_options).await;
        let mut stops = crate::systemd::last_stop_seconds(host, unit)
            .await
            .unwrap_or(0.0);
        let cancelled_during = cancel.is_cancelled();
        let back = back_to_baseline(host, restore, &restore_options, &report).await;
        if matches!(&back, Ok(Some(r)) if r.outcome == Outcome::Converged) {
            stops += crate::systemd::last_stop_seconds(host, unit)
                .await
                .unwrap_or(0.0);
        }
        let mut result = measure::result_of(v, &report, back.as_ref(), started.elapsed(), stops);
        if let Err(why) = &back {
            done.needs_attention = Some(why.to_string());
            result.detail = format!("{}; {why}", result.detail);
        }
        eprintln!(
            "variant {} {}: {} in {:.1}s (experiment's own {:.2}s)",
            v.name,
            report.outcome_text(),
            reconcile_core::terminal::escape_controls(&result.detail),
            result.seconds,
            result.overhead()
        );
        if cancelled_during && result.status != results::Status::Measured {
            // Cut short by the signal, not judged: run again by `--resume`.
            done.report.interrupted = true;
            state::write(host, unit, &p.digest, &done.report).await;
            break;
        }
        took.push(result.seconds);
        done.report.variants.push(result);
        state::write(host, unit, &p.digest, &done.report).await;
        if done.needs_attention.is_some() {
            return Ok(done);
        }
        let left = e.variants.len() - done.report.variants.len();
        if left > 0 {
            eprintln!(
                "{left} variant{} left, {}",
                if left == 1 { "" } else { "s" },
                eta::human(eta::remaining(&took, left, &per))
            );
        }
    }
    if done.report.interrupted || cancel.is_cancelled() {
        done.report.interrupted = true;
        state::write(host, unit, &p.digest, &done.report).await;
        return Ok(done);
    }

    // 3. The baseline again, for the drift check.
    done.report.baseline_end = measure::baseline(host, baseline, &e.benchmark, &cancel).await;
    done.report.conclude(e);

    // 4. The winner kept, when asked and trusted.
    if options.keep_best {
        if let Some(w) = done.report.winner.clone() {
            let i = e
                .variants
                .iter()
                .position(|v| v.name == w)
                .expect("the winner is a variant");
            let kept = apply::apply_one(host, &variants[i], &restore_options).await;
            if kept.outcome == Outcome::Converged {
                done.report.left_running = w;
            } else {
                done.report.left_running = format!(
                    "baseline (keeping {w} failed: {}; it was rolled back)",
                    kept.detail
                );
            }
        }
    }
    state::clear(host, unit).await;
    Ok(done)
}

/// After a variant: the baseline applied again (through apply, verified), unless the variant's
/// own rollback already put it back. Returns the restore's report, or why the baseline may not be
/// running.
async fn back_to_baseline(
    host: &dyn Host,
    restore: &Target,
    options: &ApplyOptions,
    variant: &UnitReport,
) -> Result<Option<UnitReport>, BaselineError> {
    if variant.outcome == Outcome::RolledBack {
        return Ok(None);
    }
    if !host.connected().await {
        // A lost connection: the host may still run the variant.
        host.reconnect(Duration::from_secs(120))
            .await
            .map_err(BaselineError::Unreachable)?;
    }
    let r = apply::apply_one(host, restore, options).await;
    match r.outcome {
        Outcome::Unchanged | Outcome::Converged | Outcome::Reloaded => Ok(Some(r)),
        _ => Err(BaselineError::Failed { detail: r.detail }),
    }
}

/// The winner's manifest written or diffed, and the chart.
fn finish(p: &Prepared, options: &Options, done: &mut Done) -> Result<(), Error> {
    let e = &p.experiment;
    if let Some(w) = &done.report.winner {
        let v = e
            .variants
            .iter()
            .find(|v| &v.name == w)
            .expect("the winner is a variant");
        let text = core::variant_text(&p.manifest_text, v).expect("checked when prepared");
        let shown = crate::load::display_path(&p.manifest_path);
        done.manifest_diff = Some(core::manifest_diff(&shown, &p.manifest_text, &text));
        if options.write {
            write_atomically(&p.manifest_path, &text, "manifest")?;
            done.written = Some(shown);
        }
    }
    if let Some(path) = &options.chart {
        use reconcile_core::experiment::svg;
        let report = &done.report;
        let series = report.series(&e.benchmark.levels);
        let by_level = svg::chart(
            &format!(
                "{} on {}: output tok/s by concurrency",
                report.service, e.host
            ),
            &e.benchmark.levels,
            &series,
        );
        // Below it, the trade-off: each run at each level, the Pareto front in colour.
        let svg = match report.trade_offs.is_empty() {
            true => by_level,
            false => svg::stacked(&[
                by_level,
                svg::trade_off(
                    &format!(
                        "output tok/s against {}: the front in colour, dominated in grey",
                        report.trade_off_latency
                    ),
                    &report.trade_off_latency,
                    &report.trade_offs,
                ),
            ]),
        };
        write_atomically(path, &svg, "chart")?;
        done.chart = Some(path.display().to_string());
    }
    Ok(())
}

/// Written next to the file and renamed over it: an interrupted write leaves the old file whole.
fn write_atomically(path: &Path, text: &str, what: &'static str) -> Result<(), Error> {
    let err = |source| Error::Write {
        path: path.display().to_string(),
        what,
        source,
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.reconcile-tmp"));
    std::fs::write(&tmp, text).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

/// The estimate's parts from what the host knows of this unit.
async fn per_run(host: &dyn Host, t: &Target, e: &Experiment) -> eta::PerRun {
    let records: Vec<_> = crate::state::read_history(host, &t.desired.unit)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter_map(Result::ok)
        .collect();
    let history = LoadHistory::from_records(records.iter().rev());
    // A request alone, as the last recorded benchmark at concurrency 1 saw it.
    let per_request = records.iter().rev().find_map(|r| {
        let b = r.benchmark.as_ref()?;
        let l = b.levels.iter().find(|l| l.concurrency == 1)?;
        (l.requests_per_s > 0.0).then(|| 1.0 / l.requests_per_s)
    });
    let quality = t
        .verify
        .quality
        .as_ref()
        .map_or(0.0, |_| measure::QUALITY_GUESS_SECONDS);
    eta::PerRun {
        load: history
            .as_ref()
            .map_or(t.verify.load_deadline.as_secs_f64(), LoadHistory::last),
        window: t.verify.crash_window.as_secs_f64(),
        benchmark: eta::benchmark_seconds(&e.benchmark, per_request),
        quality,
    }
}

/// The one target of `m` on `host`, with the benchmark set for a measured run (`None`: none).
fn target(
    m: &Manifest,
    host: &str,
    benchmark: Option<crate::manifest::BenchmarkSpec>,
) -> Result<Target, Error> {
    let mut m = m.clone();
    m.verify.benchmark = benchmark;
    let filter = Filter {
        hosts: vec![host.to_string()],
        ..Filter::default()
    };
    let mut found = targets::targets(&[m], &filter).map_err(|e| {
        ManifestErrors(vec![ManifestError::Invalid {
            file: host.to_string(),
            position: None,
            field: "host".into(),
            message: e.to_string(),
        }])
    })?;
    Ok(found.remove(0))
}

/// Reads and checks everything, touching no host.
fn prepare(file: &Path) -> Result<Prepared, Error> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.display().to_string(),
            source,
        })
    };
    let text = read(file)?;
    let shown = crate::load::display_path(file);
    let experiment = core::parse(&shown, &text)?;
    let manifest_path = file
        .parent()
        .unwrap_or(Path::new(""))
        .join(&experiment.manifest);
    let manifest_text = read(&manifest_path)?;
    let manifest_shown = crate::load::display_path(&manifest_path);
    let loaded =
        crate::load::load_texts(vec![(manifest_shown.clone(), manifest_text.clone())], false)
            .map_err(|f| f.errors)?;
    let mut errors = Vec::new();
    let located = |field: &str, message: String| ManifestError::Invalid {
        file: shown.clone(),
        position: crate::manifest::field_position(&text, &[field]),
        field: field.to_string(),
        message,
    };
    let manifest = loaded
        .manifests
        .into_iter()
        .next()
        .expect("one manifest loaded");
    if manifest.group.is_some() {
        errors.push(located(
            "manifest",
            format!("{manifest_shown} is a server group (`nodes:`): experiments run on one host"),
        ));
    }
    if !manifest.hosts.iter().any(|h| h.name == experiment.host) {
        errors.push(located(
            "host",
            format!(
                "`{}` is not one of {manifest_shown}'s hosts ({}): name the canary or spare there first",
                experiment.host,
                manifest.hosts.iter().map(|h| h.name.as_str()).collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    if experiment.constraints.quality && manifest.verify.quality.is_none() {
        errors.push(ManifestError::Invalid {
            file: shown.clone(),
            position: crate::manifest::field_position(&text, &["constraints", "quality"]),
            field: "constraints.quality".into(),
            message: format!(
                "{manifest_shown} has no `verify.quality`: the quality gate has nothing to run"
            ),
        });
    }
    let mut variants = Vec::new();
    for v in &experiment.variants {
        let vtext = match core::variant_text(&manifest_text, v) {
            Ok(t) => t,
            Err(why) => {
                let c = &v.changes[0];
                errors.push(ManifestError::Invalid {
                    file: shown.clone(),
                    position: c.position,
                    field: c.field.clone(),
                    message: format!("{manifest_shown}: {why}"),
                });
                continue;
            }
        };
        match crate::load::load_texts(vec![(manifest_shown.clone(), vtext)], false) {
            Ok(l) => variants.extend(l.manifests),
            Err(f) => errors.extend(f.errors.0.into_iter().map(|err| relocate(err, v, &shown))),
        }
    }
    if !errors.is_empty() {
        return Err(ManifestErrors(errors).into());
    }
    let digest = reconcile_core::digest::sha256(&format!("{text}\0{manifest_text}"));
    Ok(Prepared {
        experiment,
        digest,
        manifest_path,
        manifest_text,
        manifest,
        redactor: loaded.redactor,
        variants,
    })
}

/// A finding in a variant's manifest, placed where the experiment file sets the key it is
/// about; one about anything else keeps its place and names the variant.
fn relocate(err: ManifestError, v: &core::Variant, experiment_file: &str) -> ManifestError {
    let ManifestError::Invalid {
        file,
        position,
        field,
        message,
    } = err
    else {
        return err;
    };
    let change = v.changes.iter().find(|c| {
        let key = format!("{}.{}", c.section, c.key);
        field == key
            || field.starts_with(&format!("{key}."))
            || field.starts_with(&format!("{key}["))
    });
    match change {
        Some(c) => ManifestError::Invalid {
            file: experiment_file.to_string(),
            position: c.position.or(position),
            field: c.field.clone(),
            message: format!("variant `{}`: {message}", v.name),
        },
        None => ManifestError::Invalid {
            file,
            position,
            field,
            message: format!("with variant `{}`: {message}", v.name),
        },
    }
}

impl UnitReport {
    fn outcome_text(&self) -> String {
        serde_json::to_value(self.outcome)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Position;

    fn variant() -> core::Variant {
        core::parse(
            "e.yaml",
            "manifest: m.yaml\nhost: h\nbenchmark: { levels: [1] }\nobjective: { metric: output_tokens_per_s, concurrency: 1 }\nvariants:\n  - name: v\n    flags:\n      enable-mixed-chunks: true\n",
        )
        .unwrap()
        .variants
        .remove(0)
    }

    fn invalid(field: &str) -> ManifestError {
        ManifestError::Invalid {
            file: "m.yaml".into(),
            position: Some(Position {
                line: 14,
                column: 5,
            }),
            field: field.into(),
            message: "unknown flag".into(),
        }
    }

    #[test]
    fn a_finding_in_a_variants_key_points_at_the_experiment_file() {
        let e = relocate(
            invalid("sglang.flags.enable-mixed-chunks"),
            &variant(),
            "e.yaml",
        );
        assert_eq!(
            e.to_string(),
            "e.yaml:8:7: variants[0].flags.enable-mixed-chunks: variant `v`: unknown flag"
        );
    }

    #[test]
    fn a_finding_elsewhere_keeps_its_place_and_names_the_variant() {
        let e = relocate(invalid("sglang.flags.tp-size"), &variant(), "e.yaml");
        assert_eq!(
            e.to_string(),
            "m.yaml:14:5: sglang.flags.tp-size: with variant `v`: unknown flag"
        );
    }
}
