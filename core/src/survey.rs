//! What one command per host (the survey) printed, read into the facts `plan` and `apply` use:
//! each unit's file and `systemctl show`, each Python's SGLang version, each model path's access,
//! the GPU list, each port's listeners, the deployment records.
//!
//! On a real network every sequential command costs a round trip (tens of ms across sites), so
//! the binary asks for all of a host's facts in one fixed script and this module reads its
//! answer. The script gives each fact the exit status of the part that made it, so one failed or
//! hung part spoils only its own fact. It prints a header a part, then every part's output in one
//! base64 body (`base64` of coreutils, wrapped or not), stdout then stderr of each part in header
//! order, each as long as its header says:
//!
//! ```text
//! == <key> <status> <stdout bytes> <stderr bytes>
//! == end 0
//! <base64 of the bodies>
//! ```
//!
//! One `base64` over every body, where each part's two bodies used to take a `base64` each: the
//! survey's processes are what a plan costs a host. Base64 keeps a unit file holding `== ` lines,
//! or bytes that are not UTF-8, from being taken for a header; the bodies are decoded the way the
//! edge decodes any command's output (invalid UTF-8 replaced), so a fact read here equals the one
//! a command of its own would have read. A missing `== end` line, or a body shorter than its
//! headers, means the output was cut short.

use std::collections::BTreeMap;

use crate::observed::UnitState;
use crate::preflight::{
    last_line, parse_ephemeral, parse_gpu_list, parse_listeners, Access, Gpus, Port, Python,
};

/// The line that ends a complete survey.
pub const END: &str = "end";

/// The status the script gives a part that `timeout` ended (124: it timed out; 137: it ignored the
/// TERM and was killed a second later, `timeout -k 1`).
const TIMED_OUT: [i32; 2] = [124, 137];

/// One part's output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Section {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Every section of a survey, by key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sections {
    sections: BTreeMap<String, Section>,
}

/// The survey's output could not be read (cut short, or not the survey's at all).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the survey's output is malformed at line {line}: {why}")]
pub struct Malformed {
    pub line: usize,
    pub why: String,
}

/// Why a fact could not be read from its section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The part ran past its limit; `command` names it as a person would (`nvidia-smi`).
    TimedOut { command: String },
    /// The part ran and failed.
    Failed {
        command: String,
        status: i32,
        stderr: String,
    },
    /// The survey has no such section (it was not asked for).
    Absent { key: String },
}

impl Sections {
    /// Reads a survey's output. Sections appear once each; a key seen twice keeps its last.
    pub fn parse(output: &str) -> Result<Sections, Malformed> {
        let mut headers: Vec<(String, i32, usize, usize)> = Vec::new();
        let mut lines = output.lines().enumerate();
        let mut ended = false;
        for (i, line) in lines.by_ref() {
            let malformed = |why: &str| Malformed {
                line: i + 1,
                why: why.to_string(),
            };
            let Some(header) = line.strip_prefix("== ") else {
                return Err(malformed("text before the end line that is no header"));
            };
            let fields: Vec<&str> = header.split(' ').collect();
            if fields.first().is_some_and(|key| *key == END) {
                ended = true;
                break;
            }
            let [key, status, out, err] = fields[..] else {
                return Err(malformed(
                    "a header that is not a key, a status and two sizes",
                ));
            };
            let number = |text: &str| text.trim().parse::<i64>().ok();
            let (Some(status), Some(out), Some(err)) = (number(status), number(out), number(err))
            else {
                return Err(malformed("a header whose status or sizes are not numbers"));
            };
            let (Ok(status), Ok(out), Ok(err)) = (
                i32::try_from(status),
                usize::try_from(out),
                usize::try_from(err),
            ) else {
                return Err(malformed("a header whose status or sizes are out of range"));
            };
            if key.is_empty() {
                return Err(malformed("a header without a key"));
            }
            headers.push((key.to_string(), status, out, err));
        }
        let total = output.lines().count();
        if !ended {
            return Err(Malformed {
                line: total,
                why: "no end line: the output was cut short".into(),
            });
        }
        let encoded: String = lines.map(|(_, l)| l.trim_end()).collect();
        let bytes = base64_decode(&encoded).ok_or_else(|| Malformed {
            line: total,
            why: "a body that is not base64".into(),
        })?;
        let want: usize = headers.iter().map(|(_, _, o, e)| o + e).sum();
        if bytes.len() != want {
            return Err(Malformed {
                line: total,
                why: format!(
                    "bodies of {} bytes where the headers say {want}: the output was cut short",
                    bytes.len()
                ),
            });
        }
        let mut sections = BTreeMap::new();
        let mut rest = &bytes[..];
        for (key, status, out, err) in headers {
            let (stdout, after) = rest.split_at(out);
            let (stderr, after) = after.split_at(err);
            rest = after;
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            sections.insert(
                key,
                Section {
                    status,
                    stdout: text(stdout),
                    stderr: text(stderr),
                },
            );
        }
        Ok(Sections { sections })
    }

    pub fn get(&self, key: &str) -> Result<&Section, Fault> {
        self.sections.get(key).ok_or_else(|| Fault::Absent {
            key: key.to_string(),
        })
    }

    pub fn contains(&self, key: &str) -> bool {
        self.sections.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.sections.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sections.is_empty()
    }

    /// Every section, by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Section)> {
        self.sections.iter().map(|(k, s)| (k.as_str(), s))
    }

    /// Adds or replaces a section: for tests, and for anyone who stands in for a host.
    pub fn insert(&mut self, key: &str, section: Section) {
        self.sections.insert(key.to_string(), section);
    }

    /// Writes the sections as the survey script does: for tests, and for anyone who stands in
    /// for a host.
    pub fn render(&self) -> String {
        let mut text = String::new();
        let mut bodies = Vec::new();
        for (key, s) in &self.sections {
            text += &format!(
                "== {key} {} {} {}\n",
                s.status,
                s.stdout.len(),
                s.stderr.len()
            );
            bodies.extend_from_slice(s.stdout.as_bytes());
            bodies.extend_from_slice(s.stderr.as_bytes());
        }
        text += &format!("== {END} 0\n");
        // coreutils wraps at 76 columns; so does this, so that readers see both shapes.
        let encoded = base64_encode(&bodies);
        for chunk in encoded.as_bytes().chunks(76) {
            text += std::str::from_utf8(chunk).expect("base64 is ASCII");
            text.push('\n');
        }
        text
    }
}

impl<K: Into<String>> FromIterator<(K, Section)> for Sections {
    fn from_iter<I: IntoIterator<Item = (K, Section)>>(iter: I) -> Sections {
        Sections {
            sections: iter.into_iter().map(|(k, s)| (k.into(), s)).collect(),
        }
    }
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Standard base64 with padding, as coreutils writes it (its line breaks already removed).
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.as_bytes();
    if !text.len().is_multiple_of(4) {
        return None;
    }
    let value = |c: u8| ALPHABET.iter().position(|&a| a == c).map(|v| v as u32);
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let quads = text.len() / 4;
    for (q, quad) in text.chunks(4).enumerate() {
        let pad = quad.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && q + 1 != quads) {
            return None;
        }
        let mut n = 0u32;
        for &c in &quad[..4 - pad] {
            n = (n << 6) | value(c)?;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

fn timed_out(s: &Section, command: &str) -> Result<(), Fault> {
    if TIMED_OUT.contains(&s.status) {
        return Err(Fault::TimedOut {
            command: command.to_string(),
        });
    }
    Ok(())
}

fn failed(command: String, s: &Section) -> Fault {
    Fault::Failed {
        command,
        status: s.status,
        stderr: s.stderr.trim().to_string(),
    }
}

/// A file read as the edge reads one (`test -e` first): its text, or `None` when there is none.
pub fn file(s: &Section, path: &str) -> Result<Option<String>, Fault> {
    timed_out(s, "sh -c test…")?;
    match s.status {
        0 => Ok(Some(s.stdout.clone())),
        100 => Ok(None),
        _ => Err(failed(format!("cat {path}"), s)),
    }
}

/// `systemctl show -p <properties> -- <unit>`.
pub fn show(s: &Section, unit: &str) -> Result<UnitState, Fault> {
    timed_out(s, "systemctl show")?;
    match s.status {
        0 => Ok(UnitState::from_show(&s.stdout)),
        _ => Err(failed(
            format!(
                "systemctl show -p {} -- {unit}",
                crate::observed::SHOW_PROPERTIES
            ),
            s,
        )),
    }
}

/// The unit's files ([`crate::unit_files::UNIT_FILES_SCRIPT`]), with `systemctl show`'s states.
pub fn unit_files(
    s: &Section,
    load_state: &str,
    unit_file_state: &str,
) -> Result<crate::unit_files::UnitFiles, Fault> {
    timed_out(s, "systemctl show -p FragmentPath,DropInPaths")?;
    match s.status {
        0 => Ok(crate::unit_files::parse_unit_files(
            &s.stdout,
            load_state,
            unit_file_state,
        )),
        _ => Err(failed(
            "systemctl show -p FragmentPath,DropInPaths".into(),
            s,
        )),
    }
}

/// The SGLang version script run by the unit's Python (100: no executable there).
pub fn python(s: &Section) -> Result<Python, Fault> {
    timed_out(s, "sh -c test…")?;
    Ok(match s.status {
        // The version is the last line: the survey's Python prints the weights it checked first.
        0 => Python::Sglang(last_line(&s.stdout)),
        100 => Python::NotExecutable,
        _ if crate::preflight::owners::untrusted(s.status, &s.stderr) => {
            Python::Untrusted(crate::preflight::owners::writable(&s.stderr))
        }
        _ if s.stderr.contains("PackageNotFoundError") => Python::NoSglang,
        status => Python::Failed(format!("exited with {status}: {}", last_line(&s.stderr))),
    })
}

/// The model path's access (0: readable, 100: missing, 101: there but unreadable).
pub fn access(s: &Section, path: &str) -> Result<Access, Fault> {
    timed_out(s, "sh -c test…")?;
    match s.status {
        0 => Ok(Access::Readable),
        100 => Ok(Access::Missing),
        101 => Ok(Access::Unreadable),
        _ => Err(failed(format!("test -r {path}"), s)),
    }
}

/// `nvidia-smi -L` (127: not installed; another failure leaves the GPUs unknown, not an error).
pub fn gpus(s: &Section) -> Result<Gpus, Fault> {
    timed_out(s, "nvidia-smi")?;
    Ok(match s.status {
        0 => Gpus::Listed(parse_gpu_list(&s.stdout)),
        127 => Gpus::Unknown("nvidia-smi is not installed".into()),
        status => Gpus::Unknown(format!(
            "nvidia-smi -L exited with {status}: {}",
            last_line(&s.stderr)
        )),
    })
}

/// The port's listeners and their cgroups (100: no `ss`).
pub fn listeners(s: &Section, port: u16) -> Result<Port, Fault> {
    timed_out(s, "sh -c command…")?;
    match s.status {
        0 => Ok(Port::Listeners {
            listeners: parse_listeners(&s.stdout),
            ephemeral: parse_ephemeral(&s.stdout),
        }),
        100 => Ok(Port::Unknown("ss (iproute2) is not installed".into())),
        _ => Err(failed(format!("ss -Htlnp sport = :{port}"), s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(status: i32, stdout: &str, stderr: &str) -> Section {
        Section {
            status,
            stdout: stdout.into(),
            stderr: stderr.into(),
        }
    }

    #[test]
    fn base64_matches_coreutils() {
        // `printf 'a\nbc' | base64` and friends.
        assert_eq!(base64_encode(b"a\nbc"), "YQpiYw==");
        assert_eq!(base64_encode(b"abc"), "YWJj");
        assert_eq!(base64_encode(b"ab"), "YWI=");
        assert_eq!(base64_encode(b""), "");
        assert_eq!(base64_decode("YQpiYw==").unwrap(), b"a\nbc");
        assert_eq!(base64_decode("").unwrap(), b"");
        assert_eq!(base64_decode("YQ=a"), None);
        assert_eq!(base64_decode("YQ==YWJj"), None);
        assert_eq!(base64_decode("YWJ"), None);
        assert_eq!(base64_decode("Y===").map(|v| v.len()), None);
    }

    #[test]
    fn sections_round_trip_whatever_their_text() {
        let unit = out(0, "[Service]\n== end 0\n--\n\u{fffd}é\n", "");
        let hung = out(124, "", "");
        let text = Sections::from_iter([("unit.0", unit.clone()), ("gpus", hung)]).render();
        let sections = Sections::parse(&text).unwrap();
        assert_eq!(sections.len(), 2);
        assert_eq!(sections.get("unit.0").unwrap(), &unit);
        assert_eq!(
            gpus(sections.get("gpus").unwrap()),
            Err(Fault::TimedOut {
                command: "nvidia-smi".into()
            })
        );
        assert_eq!(
            sections.get("show.0"),
            Err(Fault::Absent {
                key: "show.0".into()
            })
        );
    }

    #[test]
    fn a_survey_cut_short_or_not_a_survey_is_malformed() {
        let long = "x".repeat(200);
        let whole = Sections::from_iter([("unit.0", out(0, &long, "e"))]).render();
        // What the script prints for it: `base64` wraps at 76 columns, and the lines join.
        assert_eq!(whole.lines().count(), 2 + 268_usize.div_ceil(76));
        assert_eq!(
            Sections::parse(&whole)
                .unwrap()
                .get("unit.0")
                .unwrap()
                .stdout,
            long
        );
        let one_line = whole
            .lines()
            .take(2)
            .map(|l| format!("{l}\n"))
            .collect::<String>()
            + &whole.lines().skip(2).collect::<String>();
        assert_eq!(
            Sections::parse(&one_line)
                .unwrap()
                .get("unit.0")
                .unwrap()
                .stderr,
            "e"
        );
        let headers_only = whole.lines().next().unwrap().to_string() + "\n";
        assert_eq!(
            Sections::parse(&headers_only).unwrap_err().why,
            "no end line: the output was cut short"
        );
        let cut = whole
            .lines()
            .take(3)
            .map(|l| format!("{l}\n"))
            .collect::<String>();
        assert!(Sections::parse(&cut)
            .unwrap_err()
            .why
            .ends_with("cut short"));
        assert_eq!(Sections::parse("hello\n").unwrap_err().line, 1);
        assert!(Sections::parse("== unit.0 x 0 0\n== end 0\n").is_err());
        assert!(Sections::parse("== unit.0 0\n== end 0\n").is_err());
        assert!(Sections::parse("== unit.0 0 1 0\n== end 0\n!!!!\n").is_err());
        assert!(Sections::parse(&(whole.clone() + "more\n")).is_err());
        assert!(Sections::parse("== end 0\n").unwrap().is_empty());
    }

    #[test]
    fn each_fact_reads_as_its_own_command_did() {
        assert_eq!(file(&out(0, "t", ""), "/u"), Ok(Some("t".into())));
        assert_eq!(file(&out(100, "", ""), "/u"), Ok(None));
        assert_eq!(
            file(&out(1, "", "cat: /u: Permission denied\n"), "/u"),
            Err(Fault::Failed {
                command: "cat /u".into(),
                status: 1,
                stderr: "cat: /u: Permission denied".into()
            })
        );
        let state = show(&out(0, "ActiveState=active\nExecMainPID=7\n", ""), "a").unwrap();
        assert_eq!((state.active_state.as_str(), state.main_pid), ("active", 7));
        assert!(matches!(
            show(&out(1, "", "bus"), "a.service"),
            Err(Fault::Failed { command, .. }) if command.ends_with("-- a.service")
        ));
        assert_eq!(
            python(&out(0, "0.5.9\n", "")),
            Ok(Python::Sglang("0.5.9".into()))
        );
        assert_eq!(python(&out(100, "", "")), Ok(Python::NotExecutable));
        assert_eq!(
            python(&out(
                1,
                "",
                "importlib.metadata.PackageNotFoundError: sglang\n"
            )),
            Ok(Python::NoSglang)
        );
        assert_eq!(
            python(&out(2, "", "boom\nSyntaxError: x\n\n")),
            Ok(Python::Failed("exited with 2: SyntaxError: x".into()))
        );
        assert_eq!(access(&out(101, "", ""), "/m"), Ok(Access::Unreadable));
        assert_eq!(
            access(&out(137, "", ""), "/m"),
            Err(Fault::TimedOut {
                command: "sh -c test…".into()
            })
        );
        assert_eq!(
            gpus(&out(127, "", "")),
            Ok(Gpus::Unknown("nvidia-smi is not installed".into()))
        );
        assert_eq!(
            gpus(&out(9, "", "NVML: driver not loaded\n")),
            Ok(Gpus::Unknown(
                "nvidia-smi -L exited with 9: NVML: driver not loaded".into()
            ))
        );
        assert_eq!(
            listeners(&out(100, "", ""), 30000),
            Ok(Port::Unknown("ss (iproute2) is not installed".into()))
        );
        assert_eq!(
            listeners(&out(0, "#cgroups\n", ""), 30000),
            Ok(Port::free())
        );
        assert!(matches!(
            listeners(&out(101, "", "x"), 30000),
            Err(Fault::Failed { command, .. }) if command == "ss -Htlnp sport = :30000"
        ));
    }
}
