//! The edge of `status`: the facts for each unit, read over the host's one connection. Nothing on
//! the host is changed. The pid and unit name are positional arguments, never part of a script.

use std::time::Duration;

use futures::stream::{self, StreamExt};

use reconcile_core::live::held::{self, Held};
use reconcile_core::live::LiveChange;

use super::{
    classify, live_standing, split_nul, AskError, Facts, LiveStanding, Running, Systemd, UnitStatus,
};
use crate::observed::Show;
use crate::plan::UNIT_DIR;
use crate::redact::Redactor;
use crate::remote::http::{GetError, Server};
use crate::remote::{error_chain, Host, RemoteError, SshOptions};
use crate::state::read_record;
use crate::targets::Target;
use crate::unit::parse_unit;
use crate::unit_files::{parse_unit_files, UNIT_FILES_SCRIPT};
use crate::verify::Expect;
use crate::visit;

/// Units read at once on one connection (sshd allows 10 sessions per connection by default).
const UNITS_PER_HOST_AT_ONCE: usize = 3;

/// How long the server's `/v1/models` may take: status is a quick look, not a health check.
const MODELS_TIMEOUT: Duration = Duration::from_secs(5);

/// How long each of the server's answers about what a live apply told it may take
/// (`/server_info` waits for every scheduler, between two batches), and all of them together.
const HELD_TIMEOUT: Duration = Duration::from_secs(10);
const HELD_TOTAL: Duration = Duration::from_secs(15);

const SHOW: &str =
    "LoadState,ActiveState,SubState,UnitFileState,NeedDaemonReload,ExecMainPID,ExecMainStartTimestamp";

/// The status of every target, at most `parallel` hosts at once, in the targets' order.
pub async fn status_targets(
    targets: Vec<Target>,
    ssh: &SshOptions,
    parallel: usize,
    redactor: &Redactor,
    weights: WeightsCheck,
) -> Vec<UnitStatus> {
    // The statuses' order in `ordered`, for the server groups' lines.
    let (by_host, ordered) = visit::by_host(targets);
    let results: Vec<Vec<UnitStatus>> = visit::each_host(
        by_host,
        ssh,
        parallel,
        visit::no_span,
        async |host: &dyn Host, _: &visit::Visit<'_>, targets: Vec<Target>| {
            status_host(host, &targets, redactor, weights).await
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
    weights: WeightsCheck,
) -> Vec<UnitStatus> {
    stream::iter(targets)
        .map(|t| async {
            match unit_status(host, t, redactor, weights).await {
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
    weights: WeightsCheck,
) -> Result<UnitStatus, RemoteError> {
    let unit = &t.desired.unit;
    let path = format!("{UNIT_DIR}/{unit}");
    let unit_files_argv = ["sh", "-c", UNIT_FILES_SCRIPT, "sh", unit, &path];
    let (disk_text, record, systemd, unit_files, guard) = tokio::join!(
        host.read_file(&path),
        read_record(host, unit),
        systemd(host, unit),
        host.run_ok(&unit_files_argv),
        crate::apply::guard::read(host, unit)
    );
    let (disk_text, (systemd, unit_file_state), unit_files) = (disk_text?, systemd?, unit_files?);
    let unit_files = parse_unit_files(&unit_files, &systemd.load_state, &unit_file_state);
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
    let mut facts = Facts {
        unit: unit.clone(),
        unit_files,
        desired_text: t.desired.text.clone(),
        disk_text,
        record,
        record_error,
        // A guard record that cannot be read says nothing the others do not.
        guard: guard.ok().flatten(),
        systemd,
        running,
        sglang_version: t.desired.sglang_version.clone(),
        held: None,
    };
    // Applied live to the process that runs: only the server says what it serves.
    if let (LiveStanding::Holds(change), Some(text)) = (live_standing(&facts), &facts.disk_text) {
        facts.held = Some(held_by(host, text, t.verify.url.as_deref(), &change).await);
    }
    let (mut classes, mut details) = classify(&facts, redactor);
    if let Some(drift) = pinned_drift(host, t, &facts, weights).await {
        classes.retain(|c| *c != super::Class::InSync);
        classes.push(super::Class::WeightsDrift);
        details.push(drift);
    }
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

/// How closely `status` checks a pinned model's copy against the lock file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightsCheck {
    /// Its files' sizes and the lock digest it was verified against: a stat of each file.
    Sizes,
    /// Every file hashed (`--verify-weights`): reads the whole model.
    Hashes,
}

/// Why the pinned copy the unit on disk runs is not the lock's, or `None` when it is (or the
/// unit is not pinned, or runs another revision than the manifest's: a pending change, which
/// the plan shows).
async fn pinned_drift(
    host: &dyn Host,
    t: &Target,
    facts: &Facts,
    check: WeightsCheck,
) -> Option<String> {
    let spec = t.manifest.sglang.pinned.as_ref()?;
    let dir = spec.pinned_dir();
    let runs_it = facts.disk_text.as_deref().is_some_and(|text| {
        parse_unit(text)
            .exec_start
            .iter()
            .any(|arg| arg.trim_end_matches('/') == dir)
    });
    if !runs_it {
        return None;
    }
    let python = &t.manifest.sglang.python;
    let planned = match crate::pinned::plan(host, python, spec).await {
        Ok(planned) => planned,
        Err(e) => {
            return Some(format!(
                "the pinned copy could not be looked at: {}",
                error_chain(&e)
            ))
        }
    };
    use reconcile_core::pinned::Holding;
    match planned.holding {
        Holding::Verified if check == WeightsCheck::Hashes => {
            match crate::pinned::verify(host, python, spec).await {
                Ok(differ) if differ.is_empty() => None,
                Ok(differ) => Some(format!(
                    "the pinned copy {dir} differs from the lock: {}",
                    differ
                        .iter()
                        .map(|d| format!("{}: {}", d.path, d.why))
                        .collect::<Vec<_>>()
                        .join("; ")
                )),
                Err(e) => Some(format!("the pinned copy could not be hashed: {}", error_chain(&e))),
            }
        }
        Holding::Verified => None,
        Holding::Fetch { .. } => Some(format!(
            "the pinned copy {dir} the unit runs is gone: the next start fails; `reconcile apply --restart` fetches it again"
        )),
        Holding::Refused { why } => Some(why),
    }
}

/// systemd's view, and the unit's `UnitFileState` (for its unit files).
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

/// What the server holds of what `change` tells: its checkpoint when the weights moved, its
/// values when some were set. Read as `apply::live` tells them: through the host, with the
/// unit's endpoint and key.
async fn held_by(
    host: &dyn Host,
    unit_text: &str,
    url: Option<&str>,
    change: &LiveChange,
) -> Result<Held, AskError> {
    let endpoint = Expect::from_unit(&parse_unit(unit_text)).endpoint;
    let ask = async {
        let server = host
            .server(&endpoint, url)
            .await
            .map_err(|e| AskError::Unreachable(e.into()))?;
        let mut held = Held::default();
        if change.weights.is_some() {
            let info = get(&server, "/model_info", "/get_model_info").await?;
            held.model_path = Some(held::model_path(&info)?);
        }
        if !change.settings.is_empty() {
            let info = get(&server, "/server_info", "/get_server_info").await?;
            held.ranks = held::internal_states(&info)?;
        }
        Ok(held)
    };
    tokio::time::timeout(HELD_TOTAL, ask)
        .await
        .map_err(|_| AskError::TimedOut(HELD_TOTAL))?
}

/// `path`, or its older name `before` where this SGLang lacks it (`/get_model_info` is 0.5.23's
/// deprecated name, which logs a warning each call).
async fn get(server: &Server, path: &str, before: &str) -> Result<String, GetError> {
    match server.get_within(path, HELD_TIMEOUT).await {
        Err(GetError::NotFound { .. }) => server.get_within(before, HELD_TIMEOUT).await,
        answered => answered,
    }
}

fn failed(t: &Target, error: String) -> UnitStatus {
    UnitStatus {
        host: t.host.clone(),
        unit: t.desired.unit.clone(),
        source: t.source.clone(),
        error: Some(error),
        ..UnitStatus::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::fake::FakeHost;
    use reconcile_core::live::{Move, SettingChange};

    /// A local HTTP server that answers each path of `routes` with its body (and 404 any other),
    /// as many times as it is asked; its port.
    async fn serve(routes: Vec<(&'static str, String)>) -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 4096];
                let n = socket.read(&mut buf).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]);
                let path = request.split(' ').nth(1).unwrap_or("").to_string();
                let reply = match routes.iter().find(|(p, _)| *p == path) {
                    Some((_, body)) => format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    ),
                    None => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        .to_string(),
                };
                let _ = socket.write_all(reply.as_bytes()).await;
            }
        });
        port
    }

    fn change() -> LiveChange {
        LiveChange {
            weights: Some(Move {
                from: "/models/a".into(),
                to: "/models/b".into(),
                tokenizer_follows: true,
            }),
            settings: vec![SettingChange {
                flag: "pp-max-micro-batch-size".into(),
                key: "pp_max_micro_batch_size".into(),
                from: 4.into(),
                to: 8.into(),
            }],
        }
    }

    fn unit(port: u16) -> String {
        format!("[Service]\nExecStart=/venv/bin/python3 -m sglang.launch_server --model-path /models/b --port {port}\n")
    }

    #[tokio::test]
    async fn the_server_is_asked_what_it_holds_under_the_older_routes_where_it_lacks_the_new() {
        // An SGLang without `/model_info` or `/server_info`: their older names answer.
        let port = serve(vec![
            (
                "/get_model_info",
                r#"{"model_path": "/models/b", "is_generation": true}"#.into(),
            ),
            (
                "/get_server_info",
                r#"{"internal_states": [{"pp_max_micro_batch_size": 8}, {"pp_max_micro_batch_size": 8}]}"#.into(),
            ),
        ])
        .await;
        let fake = FakeHost::new("h");
        let host: &dyn Host = &fake;
        let held = held_by(host, &unit(port), None, &change()).await.unwrap();
        assert_eq!(held.model_path.as_deref(), Some("/models/b"));
        assert_eq!(held.ranks.len(), 2);
        assert_eq!(held::differences(&change(), &held), Vec::<String>::new());
        // Only what was told is asked: values alone read no checkpoint.
        let values = LiveChange {
            weights: None,
            ..change()
        };
        let held = held_by(host, &unit(port), None, &values).await.unwrap();
        assert_eq!(held.model_path, None);
    }

    #[tokio::test]
    async fn a_server_that_cannot_say_is_an_error_not_an_agreement() {
        // The route answers, but not with what SGLang's does.
        let port = serve(vec![("/model_info", r#"{"detail": "nope"}"#.into())]).await;
        let fake = FakeHost::new("h");
        let host: &dyn Host = &fake;
        let e = held_by(host, &unit(port), None, &change())
            .await
            .unwrap_err();
        assert!(matches!(e, AskError::Answer(_)), "{e}");
        assert!(e.to_string().contains("no `model_path`"), "{e}");
        // Neither name there: the older name's 404 is the error.
        let values = LiveChange {
            weights: None,
            ..change()
        };
        let e = held_by(host, &unit(port), None, &values).await.unwrap_err();
        assert_eq!(e.to_string(), "/get_server_info answered 404 Not Found");
        // A host that cannot be reached.
        fake.disconnect();
        let e = held_by(host, &unit(port), None, &change())
            .await
            .unwrap_err();
        assert!(matches!(e, AskError::Unreachable(_)), "{e}");
    }
}
