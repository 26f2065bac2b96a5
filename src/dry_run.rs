//! `reconcile --dry-run`: read every host concurrently, one SSH connection each and one command
//! (the survey) for all of a host's units, and plan each unit, with its preflight checks (the hosts
//! visited through `fleet`). Nothing on a host is changed. An unreachable host is reported;
//! the others are planned. What a unit's planning comes to ([`PlanOutcome`]) and its tally are
//! pure, in `reconcile_core::dry_run`.

use futures::stream::{self, StreamExt};

use crate::digest::sha256;
use crate::observed::Observed;
use crate::plan::{plan, PlannedState, UnitPlan};
use crate::preflight::{self, Ask, DeepWhen, Survey};
use crate::redact::Redactor;
use crate::remote::{error_chain, Host, SshOptions};
use crate::state::STATE_DIR;
use crate::systemd::Systemd;
use crate::targets::Target;
use crate::visit;
use reconcile_core::guard::Settled;

pub use reconcile_core::dry_run::{PlanOutcome, Tally};

/// Units planned at once on one connection: sshd allows 10 sessions per connection by default, and
/// a unit runs at most two commands at once (observing it, then its preflight) when there is no
/// survey; with one, only the deep check and facts the survey lacks take commands.
const UNITS_PER_HOST_AT_ONCE: usize = 4;

/// Plans every target, at most `parallel` hosts at once. Results come back in the targets' order.
/// `deep` says which units get preflight's deep check (the host's SGLang checks the unit's argv
/// and its model's config, 10-30 s a unit; by default those that restart or are new).
pub async fn plan_targets(
    targets: Vec<Target>,
    ssh: &SshOptions,
    parallel: usize,
    deep: impl Into<DeepWhen>,
    redactor: &Redactor,
) -> Vec<PlanOutcome> {
    let deep = deep.into();
    // The outcomes' order in `ordered`, for the server groups' plans.
    let (by_host, ordered) = visit::by_host(targets);
    let results: Vec<Vec<PlanOutcome>> = visit::each_host(
        by_host,
        ssh,
        parallel,
        |name| tracing::info_span!("host", host = %name),
        async |host: &dyn Host, _: &visit::Visit<'_>, targets: Vec<Target>| {
            plan_host(host, &targets, deep, redactor).await
        },
        |_, targets, e| {
            let error = error_chain(&e);
            targets
                .iter()
                .map(|t| PlanOutcome::failed(t, error.clone()))
                .collect()
        },
    )
    .await;
    let mut outcomes: Vec<PlanOutcome> = results.into_iter().flatten().collect();
    reconcile_core::group::plan_groups(&mut outcomes, &ordered);
    outcomes
}

/// A connected host's units: every fact they need read in one survey, then planned a few at once
/// (only the deep check, and facts the survey lacks, take commands of their own). A host that
/// cannot run the survey is planned with one command per fact, as before it.
async fn plan_host(
    host: &dyn Host,
    targets: &[Target],
    deep: DeepWhen,
    redactor: &Redactor,
) -> Vec<PlanOutcome> {
    let survey = match preflight::survey(host, targets, Ask::plan(STATE_DIR, deep)).await {
        Ok(Some(survey)) => survey,
        Ok(None) => {
            return stream::iter(targets)
                .map(|t| plan_unit(host, t, deep, redactor))
                .buffered(UNITS_PER_HOST_AT_ONCE)
                .collect()
                .await
        }
        Err(e) => {
            let error = error_chain(&e);
            return targets
                .iter()
                .map(|t| PlanOutcome::failed(t, error.clone()))
                .collect();
        }
    };
    stream::iter(targets)
        .map(|t| plan_surveyed(host, &survey, t, deep, redactor))
        .buffered(UNITS_PER_HOST_AT_ONCE)
        .collect()
        .await
}

async fn plan_surveyed(
    host: &dyn Host,
    survey: &Survey,
    t: &Target,
    deep: DeepWhen,
    redactor: &Redactor,
) -> PlanOutcome {
    let observed = match survey.observed(&t.desired.unit) {
        Ok(observed) => observed,
        Err(e) => return PlanOutcome::failed(t, error_chain(&e)),
    };
    let mut planned = plan(&t.host, &t.source, &t.desired, &observed, redactor);
    crate::apply::live::plan(host, t, &observed, &mut planned).await;
    let verdict = planned.verdict;
    let checked = preflight::check_surveyed(host, t, survey, &observed.state, verdict, deep).await;
    match checked {
        Ok(checked) => {
            let guard = survey.guard(&t.desired.unit);
            let mut findings = checked.findings;
            planned.pinned = pinned_plan(host, t, &mut findings).await;
            planned_with(t, &observed, planned, findings, checked.sglang, guard)
        }
        Err(e) => PlanOutcome::failed(t, error_chain(&e)),
    }
}

/// A unit planned without a survey: observed, then its preflight, over commands of their own.
async fn plan_unit(
    host: &dyn Host,
    t: &Target,
    deep: DeepWhen,
    redactor: &Redactor,
) -> PlanOutcome {
    // Planned as soon as it is observed: preflight's other checks depend on the verdict.
    let observe = async {
        let observed = host.observe(&t.desired.unit).await?;
        let mut planned = plan(&t.host, &t.source, &t.desired, &observed, redactor);
        crate::apply::live::plan(host, t, &observed, &mut planned).await;
        Ok((observed, planned))
    };
    let verdict = |(_, p): &(Observed, UnitPlan)| p.verdict;
    let ((observed, mut planned), mut findings, sglang) =
        match preflight::check_with(host, t, deep, observe, |(o, _)| &o.state, verdict).await {
            Ok(all) => all,
            Err(e) => return PlanOutcome::failed(t, error_chain(&e)),
        };
    planned.pinned = pinned_plan(host, t, &mut findings).await;
    let guard = crate::apply::guard::read(host, &t.desired.unit)
        .await
        .ok()
        .flatten();
    planned_with(t, &observed, planned, findings, sglang, guard)
}

/// The plan of a pinned model's copy on the host (`sglang.model:`); one that is refused, or
/// cannot be looked at, is a preflight error too, so the plan fails before anything stops.
async fn pinned_plan(
    host: &dyn Host,
    t: &Target,
    findings: &mut Vec<preflight::Finding>,
) -> Option<reconcile_core::pinned::CopyPlan> {
    let spec = t.manifest.sglang.pinned.as_ref()?;
    match crate::pinned::plan(host, &t.manifest.sglang.python, spec).await {
        Ok(planned) => {
            if let reconcile_core::pinned::Holding::Refused { why } = &planned.holding {
                findings.push(preflight::Finding::error("weights", why.clone()));
            }
            Some(planned)
        }
        Err(e) => {
            findings.push(preflight::Finding::error("weights", error_chain(&e)));
            None
        }
    }
}

fn planned_with(
    t: &Target,
    observed: &Observed,
    mut planned: UnitPlan,
    findings: Vec<preflight::Finding>,
    sglang: Option<String>,
    guard: Option<Settled>,
) -> PlanOutcome {
    planned.preflight = findings;
    let current = observed.unit_text.as_deref().map(sha256);
    let desired = sha256(&t.desired.text);
    // What the host's guard did with the last change, when its apply died: let stand unconfirmed (the
    // next apply confirms it, no restart) or rolled back (this plan asks for it again).
    planned
        .notes
        .extend(guard.and_then(|g| g.plan_note(current.as_deref(), &desired)));
    // A restart is judged on its answers too: the pull request says so before it merges.
    if let Some(q) = &t.verify.quality {
        if matches!(
            planned.verdict,
            crate::plan::Verdict::Restart
                | crate::plan::Verdict::Install
                | crate::plan::Verdict::Live
        ) {
            planned.judged_on_quality = true;
            let gate = if q.gate {
                "rolled back"
            } else {
                "reported only (gate off)"
            };
            let texts = reconcile_core::quality::texts(
                q.texts,
                q.texts_file.as_ref().map(|f| f.content.as_slice()),
            )
            .len();
            let mut measured = vec!["the greedy tokens".to_string()];
            if texts > 0 {
                let s = if texts == 1 { "" } else { "s" };
                measured.push(format!("every position of {texts} fixed text{s}"));
            }
            if q.needle.is_some() {
                measured.push("the needle".into());
            }
            if let Some(l) = &q.long_context {
                let names: Vec<&str> = l.tasks.iter().map(|t| t.name()).collect();
                measured.push(format!("the long-context tasks ({})", names.join(", ")));
            }
            if q.cases.is_some() {
                measured.push("the cases".into());
            }
            planned.notes.push(format!(
                "apply judges this change on quality (verify.quality) against the host's reference: {}; a drop beyond the limits is {gate}",
                measured.join(", "),
            ));
        }
    }
    planned.recorded = Some(PlannedState {
        desired_sha256: desired,
        current_sha256: current,
        sglang_version: sglang,
    });
    PlanOutcome::Planned(Box::new(planned))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Verdict;
    use crate::preflight::survey::tests::fake_answer;
    use crate::remote::fake::{FakeHost, Reply};

    fn targets() -> Vec<Target> {
        let manifests: Vec<_> = (1..=3)
            .map(|i| {
                let text = format!("service: s{i}\nhosts: [gpu-a]\nsglang:\n  python: /venv/bin/python3\n  version: 0.5.23\n  model_path: /models/m\n  port: 3000{i}\nenv: {{ CUDA_VISIBLE_DEVICES: \"{}\" }}\n", i - 1);
                crate::manifest::parse(&format!("manifests/s{i}.yaml"), &text).expect("parses")
            })
            .collect();
        crate::targets::targets(&manifests, &Default::default()).expect("targets")
    }

    /// The units a fake host's deep check ran for, by their `--port` (the check's last
    /// argument): every command after the survey is one.
    /// The `--port` of each unit the deep check asked about, read from the check's stdin.
    fn deep_checked(fake: &FakeHost) -> Vec<String> {
        let inputs = fake.inputs();
        assert!(inputs.len() > 1, "{:?}", fake.commands());
        inputs[1..]
            .iter()
            .map(|input| {
                let ask: serde_json::Value = serde_json::from_slice(input).unwrap();
                let args = ask["args"].as_array().unwrap();
                let port = args.iter().position(|a| a == "--port").unwrap();
                args[port + 1].as_str().unwrap().to_string()
            })
            .collect()
    }

    #[tokio::test]
    async fn a_host_with_three_units_is_planned_from_one_command() {
        let targets = targets();
        // s2 is on the host as rendered: no change, so no change-only checks for it.
        let s2 = format!("{}/s2.service", crate::plan::UNIT_DIR);
        let s2_text = targets[1].desired.text.clone();
        let files = [(s2.clone(), s2_text)];
        let (deep, accepted) = preflight::deep_command();
        let deep: Vec<&str> = deep.iter().map(String::as_str).collect();
        let fake = FakeHost::new("gpu-a")
            .on_with(&["sh", "-c"], move |argv, _| {
                let files: Vec<(&str, &str)> = files
                    .iter()
                    .map(|(p, t)| (p.as_str(), t.as_str()))
                    .collect();
                Reply::ok(&fake_answer(argv, "0.5.23", &files))
            })
            .on(&deep, Reply::ok(&accepted));
        let outcomes = plan_host(&fake, &targets, DeepWhen::default(), &Redactor::default()).await;
        // The survey, then the deep check of each new unit (s1, s3); none for s2, unchanged.
        assert_eq!(
            deep_checked(&fake),
            ["30001", "30003"],
            "each unit's own --port"
        );
        let without = FakeHost::new("gpu-a").on_with(&["sh", "-c"], |argv, _| {
            Reply::ok(&fake_answer(argv, "0.5.23", &[]))
        });
        plan_host(&without, &targets, DeepWhen::Never, &Redactor::default()).await;
        assert_eq!(without.commands().len(), 1, "--no-deep: one command");
        let verdicts: Vec<Verdict> = outcomes
            .iter()
            .map(|o| match o {
                PlanOutcome::Planned(p) => {
                    assert!(!preflight::has_errors(&p.preflight), "{:?}", p.preflight);
                    p.verdict
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            verdicts,
            [Verdict::Install, Verdict::NoChange, Verdict::Install]
        );
    }

    #[tokio::test]
    async fn a_verdict_the_host_kept_for_the_same_sglang_costs_no_command_of_its_own() {
        let targets = targets();
        let refused = "#reconcile-deep {\"verdict\": \"refused\", \"stage\": \"model-config\", \"flag\": \"model-path\", \"reason\": \"kept\", \"unchecked\": []}\n";
        // s1's verdict was kept by this SGLang, s3's by another: only s3 is checked again.
        let kept = move |i: usize, version: &str| {
            let stdout =
                format!("#reconcile-deep-kept k{i}\n#reconcile-deep-version {version}\n{refused}");
            reconcile_core::survey::Section {
                status: 0,
                stdout,
                stderr: String::new(),
            }
        };
        let (deep, accepted) = preflight::deep_command();
        let deep: Vec<&str> = deep.iter().map(String::as_str).collect();
        let fake = FakeHost::new("gpu-a")
            .on_with(&["sh", "-c"], move |argv, _| {
                let answer = fake_answer(argv, "0.5.23", &[]);
                let mut sections = reconcile_core::survey::Sections::parse(&answer).unwrap();
                sections.insert("kept.0", kept(0, "0.5.23"));
                sections.insert("kept.2", kept(2, "0.5.22"));
                Reply::ok(&sections.render())
            })
            .on(&deep, Reply::ok(&accepted));
        let outcomes = plan_host(&fake, &targets, DeepWhen::default(), &Redactor::default()).await;
        assert_eq!(
            deep_checked(&fake),
            ["30002", "30003"],
            "s1's verdict was kept"
        );
        let deep_errors = |o: &PlanOutcome| match o {
            PlanOutcome::Planned(p) => p
                .preflight
                .iter()
                .filter(|f| f.check == "deep")
                .map(|f| f.message.clone())
                .collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        let cached_refusal = deep_errors(&outcomes[0]);
        assert!(
            cached_refusal.len() == 1 && cached_refusal[0].ends_with("kept"),
            "{cached_refusal:?}"
        );
        assert_eq!(deep_errors(&outcomes[2]), Vec::<String>::new());
    }

    #[tokio::test]
    async fn a_hung_part_fails_the_units_that_need_it_naming_it() {
        let targets = targets();
        let fake = FakeHost::new("gpu-a").on_with(&["sh", "-c"], |argv, _| {
            let answer = fake_answer(argv, "0.5.23", &[]);
            let mut sections = reconcile_core::survey::Sections::parse(&answer).unwrap();
            assert!(sections.contains("gpus"), "asked for the GPUs");
            // nvidia-smi ended by its `timeout`.
            let hung = reconcile_core::survey::Section {
                status: 124,
                ..Default::default()
            };
            sections.insert("gpus", hung);
            Reply::ok(&sections.render())
        });
        let outcomes = plan_host(&fake, &targets, DeepWhen::default(), &Redactor::default()).await;
        assert_eq!(fake.commands().len(), 1);
        for o in &outcomes {
            match o {
                PlanOutcome::Error { error, .. } => {
                    assert_eq!(error, "`nvidia-smi` on gpu-a did not answer in 30s")
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_host_that_cannot_run_the_survey_is_planned_one_command_a_fact() {
        let targets = targets();
        let fake = FakeHost::new("gpu-a")
            .once(&["sh", "-c"], Reply::exit(1, "", "mktemp: failed"))
            .on(&["sh", "-c"], Reply::ok("0.5.23\n"))
            .on(&["systemctl", "show"], Reply::ok("LoadState=not-found\n"))
            .on(&["nvidia-smi"], Reply::ok("GPU 0: H100 (UUID: GPU-a)\n"));
        let outcomes = plan_host(
            &fake,
            &targets[..1],
            DeepWhen::default(),
            &Redactor::default(),
        )
        .await;
        assert!(matches!(&outcomes[0], PlanOutcome::Planned(p) if p.verdict == Verdict::Install));
        assert!(fake.commands().len() > 1);
    }
}
