//! The edge of preflight: the facts, read over the host's one connection. Manifest values (the
//! Python path, the model path, the port) are positional arguments of fixed scripts, never part
//! of a shell string.

use super::{
    judge, parse_gpu_list, parse_listeners, Access, Deep, Facts, Finding, Gpus, Port, Python,
};
use crate::observed::UnitState;
use crate::remote::{Host, RemoteError};
use crate::targets::Target;

/// Reads the installed version from the distribution's metadata. Importing `sglang` would take
/// seconds (it imports torch); this takes about 0.4 s.
const VERSION_SCRIPT: &str = "from importlib.metadata import version; print(version('sglang'))";

/// Runs the Python only when it is an executable file, so a missing one is told apart from one
/// that fails (status 100).
const PYTHON: &str =
    "test -f \"$1\" && test -x \"$1\" || exit 100; p=$1; shift; exec \"$p\" \"$@\"";

/// 0: readable, 100: missing, 101: there but unreadable.
const ACCESS: &str = "test -e \"$1\" || exit 100; test -r \"$1\" || exit 101";

/// The listeners on a TCP port and the cgroups of their processes (see `parse_listeners`).
const LISTENERS: &str = "command -v ss >/dev/null 2>&1 || exit 100
out=$(ss -Htlnp \"sport = :$1\") || exit 101
[ -n \"$out\" ] && printf '%s\\n' \"$out\"
echo '#cgroups'
for pid in $(printf '%s\\n' \"$out\" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do
  printf '%s %s\\n' \"$pid\" \"$(tr '\\n' ' ' < /proc/$pid/cgroup 2>/dev/null)\"
done";

/// The deep check: the host's SGLang parses the unit's exact arguments as `launch_server` would
/// (argparse, then `ServerArgs`' own checks), without starting a server. On a real host this
/// imports torch: about 10 s.
const DEEP_SCRIPT: &str = "import sys\nfrom sglang.srt.server_args import prepare_server_args\nprepare_server_args(sys.argv[1:])\n";

/// Gathers the facts and judges them. `observed` is read at the same time over the same
/// connection, since the port check needs the unit's `MainPID`.
pub async fn check_with<T>(
    host: &Host,
    t: &Target,
    deep: bool,
    observe: impl std::future::Future<Output = Result<T, RemoteError>>,
    state_of: impl Fn(&T) -> &UnitState,
) -> Result<(T, Vec<Finding>), RemoteError> {
    let (observed, mut facts) = tokio::try_join!(observe, gather(host, t, deep))?;
    facts.main_pid = state_of(&observed).main_pid;
    let findings = judge(t, &facts);
    Ok((observed, findings))
}

/// Gathers the facts and judges them.
pub async fn check(
    host: &Host,
    t: &Target,
    state: &UnitState,
    deep: bool,
) -> Result<Vec<Finding>, RemoteError> {
    let mut facts = gather(host, t, deep).await?;
    facts.main_pid = state.main_pid;
    Ok(judge(t, &facts))
}

/// Every fact at once (the host's connection bounds how many commands run together), then the
/// deep check when asked and when there is an SGLang to ask.
async fn gather(host: &Host, t: &Target, deep: bool) -> Result<Facts, RemoteError> {
    let want = super::Want::of(t);
    let (python, model_path, gpus, port) = tokio::try_join!(
        sglang_version(host, &want.python),
        access(host, &want.model_path),
        gpus(host),
        listeners(host, want.port)
    )?;
    let deep = match (&python, deep) {
        (Python::Sglang(_), true) => {
            Some(deep_check(host, &want.python, &t.desired.model.exec_start).await?)
        }
        _ => None,
    };
    Ok(Facts {
        python,
        model_path,
        gpus,
        port,
        main_pid: 0,
        deep,
    })
}

async fn sglang_version(host: &Host, python: &str) -> Result<Python, RemoteError> {
    let out = host
        .run(&["sh", "-c", PYTHON, "sh", python, "-c", VERSION_SCRIPT])
        .await?;
    Ok(match out.status {
        0 => Python::Sglang(out.stdout.trim().to_string()),
        100 => Python::NotExecutable,
        _ if out.stderr.contains("PackageNotFoundError") => Python::NoSglang,
        status => Python::Failed(format!("exited with {status}: {}", last_line(&out.stderr))),
    })
}

async fn access(host: &Host, path: &str) -> Result<Access, RemoteError> {
    let out = host.run(&["sh", "-c", ACCESS, "sh", path]).await?;
    match out.status {
        0 => Ok(Access::Readable),
        100 => Ok(Access::Missing),
        101 => Ok(Access::Unreadable),
        status => Err(failed(host, format!("test -r {path}"), status, &out.stderr)),
    }
}

async fn gpus(host: &Host) -> Result<Gpus, RemoteError> {
    let out = host.run(&["nvidia-smi", "-L"]).await?;
    Ok(match out.status {
        0 => Gpus::Listed(parse_gpu_list(&out.stdout)),
        127 => Gpus::Unknown("nvidia-smi is not installed".into()),
        status => Gpus::Unknown(format!(
            "nvidia-smi -L exited with {status}: {}",
            last_line(&out.stderr)
        )),
    })
}

async fn listeners(host: &Host, port: u16) -> Result<Port, RemoteError> {
    let port = port.to_string();
    let out = host.run(&["sh", "-c", LISTENERS, "sh", &port]).await?;
    match out.status {
        0 => Ok(Port::Listeners(parse_listeners(&out.stdout))),
        100 => Ok(Port::Unknown("ss (iproute2) is not installed".into())),
        status => Err(failed(
            host,
            format!("ss -Htlnp sport = :{port}"),
            status,
            &out.stderr,
        )),
    }
}

async fn deep_check(host: &Host, python: &str, exec_start: &[String]) -> Result<Deep, RemoteError> {
    // ExecStart is `<python> -m sglang.launch_server <args>`; the script gets the args.
    let args = exec_start.get(3..).unwrap_or_default();
    let mut argv = vec!["sh", "-c", PYTHON, "sh", python, "-c", DEEP_SCRIPT];
    argv.extend(args.iter().map(String::as_str));
    let out = host.run(&argv).await?;
    let last = last_line(&out.stderr);
    Ok(match out.status {
        0 => Deep::Accepted,
        _ if out.stderr.contains("No module named 'sglang.srt") => Deep::Unavailable(format!(
            "this SGLang has no sglang.srt.server_args to parse arguments with ({last})"
        )),
        _ => Deep::Refused(last),
    })
}

fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string()
}

fn failed(host: &Host, command: String, status: i32, stderr: &str) -> RemoteError {
    RemoteError::Failed {
        host: host.name().to_string(),
        command,
        status,
        stderr: stderr.trim().to_string(),
    }
}
