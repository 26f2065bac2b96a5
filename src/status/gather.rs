//! The edge of `status`: the facts for each unit, read over the host's one connection. Nothing on
//! the host is changed. The pid and unit name are positional arguments, never part of a script.

use std::time::Duration;

use futures::stream::{self, StreamExt};

use super::{classify, split_nul, Facts, Running, Systemd, UnitStatus};
use crate::apply::state::read_record;
use crate::fleet;
use crate::layers::{parse_layers, LAYERS_SCRIPT};
use crate::observed::Show;
use crate::plan::UNIT_DIR;
use crate::redact::Redactor;
use crate::remote::{error_chain, Host, RemoteError, SshOptions};
use crate::targets::Target;
use crate::unit::parse_unit;
use crate::verify::Expect;

/// Units read at once on one connection (sshd allows 10 sessions per connection by default).
const UNITS_PER_HOST_AT_ONCE: usize = 3;

/// How long the server's `/v1/models` may take: status is a quick look, not a health check.
const MODELS_TIMEOUT: Duration = Duration::from_secs(5);

const SHOW: &str =
    "LoadState,ActiveState,SubState,UnitFileState,NeedDaemonReload,ExecMainPID,ExecMainStartTimestamp";

/// The status of every target, at most `parallel` hosts at once, in the targets' order.
pub async fn status_targets(
    targets: Vec<Target>,
    ssh: &SshOptions,
    parallel: usize,
    redactor: &Redactor,
) -> Vec<UnitStatus> {
    let by_host = crate::targets::by_host(targets);
    // The statuses' order, for the server groups' lines.
    let ordered: Vec<Target> = by_host.values().flatten().cloned().collect();
    let results: Vec<Vec<UnitStatus>> = fleet::each_host(
        by_host,
        ssh,
        parallel,
        fleet::no_span,
        async |host: &dyn Host, _: &fleet::Visit<'_>, targets: Vec<Target>| {
            status_host(host, &targets, redactor).await
        },
        |_, targets, e| {
            let error = error_chain(&e);
            targets.iter().map(|t| failed(t, error.clone())).collect()
        },
    )
    .await;
    let mut statuses: Vec<UnitStatus> = results.into_iter().flatten().collect();
    groups(&mut statuses, &ordered);
    statuses
}

/// Each rank of a server group gets the group's line first (`reconcile_core::group::group_status`):
/// the server is in sync only when all of its ranks are.
fn groups(statuses: &mut [UnitStatus], ordered: &[Target]) {
    let mut done: Vec<(&str, &str)> = Vec::new();
    for t in ordered.iter().filter(|t| t.group.is_some()) {
        let key = (t.source.as_str(), t.desired.unit.as_str());
        if done.contains(&key) {
            continue;
        }
        done.push(key);
        let mut members: Vec<(usize, usize)> = ordered
            .iter()
            .enumerate()
            .filter(|(_, o)| (o.source.as_str(), o.desired.unit.as_str()) == key)
            .filter_map(|(i, o)| o.group.as_ref().map(|g| (g.rank, i)))
            .collect();
        members.sort_unstable();
        let whys: Vec<String> = members
            .iter()
            .map(|&(_, i)| match &statuses[i].error {
                Some(e) => format!("unreadable ({e})"),
                None => statuses[i]
                    .classes
                    .iter()
                    .map(|c| c.name())
                    .collect::<Vec<_>>()
                    .join(","),
            })
            .collect();
        let line = {
            let ranks: Vec<reconcile_core::group::RankStatus<'_>> = members
                .iter()
                .zip(&whys)
                .map(|(&(_, i), why)| reconcile_core::group::RankStatus {
                    host: &statuses[i].host,
                    in_sync: statuses[i].in_sync(),
                    why,
                    deployed: statuses[i]
                        .record
                        .as_ref()
                        .map(|r| r.manifest_sha256.as_str()),
                })
                .collect();
            reconcile_core::group::group_status(&ranks)
        };
        for &(_, i) in &members {
            statuses[i].details.insert(0, line.clone());
        }
    }
}

/// The status of `targets`, all on `host`, over a connection the caller holds (the agent's round
/// reads its own machine's this way for its metrics).
pub async fn status_host(
    host: &dyn Host,
    targets: &[Target],
    redactor: &Redactor,
) -> Vec<UnitStatus> {
    stream::iter(targets)
        .map(|t| async {
            match unit_status(host, t, redactor).await {
                Ok(status) => status,
                Err(e) => failed(t, error_chain(&e)),
            }
        })
        .buffered(UNITS_PER_HOST_AT_ONCE)
        .collect()
        .await
}

async fn unit_status(
    host: &dyn Host,
    t: &Target,
    redactor: &Redactor,
) -> Result<UnitStatus, RemoteError> {
    let unit = &t.desired.unit;
    let path = format!("{UNIT_DIR}/{unit}");
    let layers_argv = ["sh", "-c", LAYERS_SCRIPT, "sh", unit, &path];
    let (disk_text, record, systemd, layers, guard) = tokio::join!(
        host.read_file(&path),
        read_record(host, unit),
        systemd(host, unit),
        host.run_ok(&layers_argv),
        crate::apply::guard::read(host, unit)
    );
    let (disk_text, (systemd, unit_file_state), layers) = (disk_text?, systemd?, layers?);
    let layers = parse_layers(&layers, &systemd.load_state, &unit_file_state);
    let (record, record_error) = match record {
        Ok(record) => (record, None),
        Err(e) => (None, Some(e.to_string())),
    };
    let active = systemd.active_state == "active";
    let running = if active && systemd.main_pid != 0 {
        process(host, systemd.main_pid).await?
    } else {
        None
    };
    let served_models = match (&disk_text, active) {
        (Some(text), true) => models(host, text, t.verify.url.as_deref()).await,
        _ => None,
    };
    let facts = Facts {
        unit: unit.clone(),
        layers,
        desired_text: t.desired.text.clone(),
        disk_text,
        record,
        record_error,
        // A guard record that cannot be read says nothing the others do not.
        guard: guard.ok().flatten(),
        systemd,
        running,
    };
    let (classes, mut details) = classify(&facts, redactor);
    if let (Some(models), Some(text)) = (&served_models, &facts.disk_text) {
        let want = Expect::from_unit(&parse_unit(text)).model_id;
        if !models.contains(&want) {
            details.push(format!(
                "the server lists {:?} in /v1/models, the unit names `{want}`",
                models
            ));
        }
    }
    let record = facts.record.as_ref();
    Ok(UnitStatus {
        host: t.host.clone(),
        unit: unit.clone(),
        source: t.source.clone(),
        classes,
        details,
        git_commit: record.and_then(|r| r.git_commit.clone()),
        applied_at: record.map(|r| r.applied_at.clone()),
        applied_by: record.map(|r| r.applied_by.clone()),
        systemd: facts.systemd,
        served_models,
        error: None,
        record: record.cloned(),
    })
}

/// systemd's view, and the unit's `UnitFileState` (for its layers).
async fn systemd(host: &dyn Host, unit: &str) -> Result<(Systemd, String), RemoteError> {
    let out = host
        .run_ok(&["systemctl", "show", "-p", SHOW, "--", unit])
        .await?;
    let show = Show::parse(&out);
    let systemd = Systemd {
        load_state: show.text("LoadState"),
        active_state: show.text("ActiveState"),
        sub_state: show.text("SubState"),
        need_daemon_reload: show.yes("NeedDaemonReload"),
        main_pid: show.number("ExecMainPID").unwrap_or(0),
        started_at: show.text("ExecMainStartTimestamp"),
    };
    Ok((systemd, show.text("UnitFileState")))
}

/// The main process's argv and environment; `None` when it exited meanwhile.
async fn process(host: &dyn Host, pid: u32) -> Result<Option<Running>, RemoteError> {
    let (cmdline, environ) = (
        format!("/proc/{pid}/cmdline"),
        format!("/proc/{pid}/environ"),
    );
    let (cmdline, environ) = tokio::try_join!(host.read_file(&cmdline), host.read_file(&environ))?;
    let Some(cmdline) = cmdline else {
        return Ok(None);
    };
    let env = split_nul(&environ.unwrap_or_default())
        .into_iter()
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect();
    Ok(Some(Running {
        argv: split_nul(&cmdline),
        env,
    }))
}

/// The model ids the server lists, or `None` when it does not answer in time.
async fn models(host: &dyn Host, unit_text: &str, url: Option<&str>) -> Option<Vec<String>> {
    let endpoint = Expect::from_unit(&parse_unit(unit_text)).endpoint;
    let ask = async {
        let server = host.server(&endpoint, url).await.ok()?;
        server.models().await.ok()
    };
    let models = tokio::time::timeout(MODELS_TIMEOUT, ask).await.ok()??;
    Some(models.into_iter().map(|m| m.id).collect())
}

fn failed(t: &Target, error: String) -> UnitStatus {
    UnitStatus {
        host: t.host.clone(),
        unit: t.desired.unit.clone(),
        source: t.source.clone(),
        classes: Vec::new(),
        details: Vec::new(),
        git_commit: None,
        applied_at: None,
        applied_by: None,
        systemd: Systemd::default(),
        served_models: None,
        error: Some(error),
        record: None,
    }
}
