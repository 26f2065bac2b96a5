//! Showing verification live: on a terminal, a spinner per unit with stage, elapsed time, memory
//! and a sparkline; elsewhere (CI logs), one line per finished stage on stderr.

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use reconcile_core::learned::{LoadHistory, Point};

use super::judge::{bytes, sparkline, Sample};
use super::{Stage, Verification};

/// The display for one unit's verification.
pub struct Progress {
    label: String,
    bar: Option<ProgressBar>,
    /// The unit's last good loads, to show this one against.
    last: Option<LoadHistory>,
}

impl Progress {
    /// A spinner in `multi` when there is one (a terminal), plain stage lines otherwise.
    pub fn new(label: String, multi: Option<&MultiProgress>) -> Progress {
        let bar = multi.map(|m| {
            let bar = m.add(ProgressBar::new_spinner());
            bar.set_style(
                ProgressStyle::with_template("{spinner} {prefix} {wide_msg}")
                    .expect("valid template"),
            );
            bar.set_prefix(label.clone());
            bar.enable_steady_tick(std::time::Duration::from_millis(120));
            bar
        });
        Progress {
            label,
            bar,
            last: None,
        }
    }

    /// Shows the load against the unit's last good one, when it has one.
    pub fn against(mut self, last: Option<LoadHistory>) -> Progress {
        self.last = last;
        self
    }

    pub fn update(&self, stage: &str, elapsed: f64, sample: &Sample, record: &Verification) {
        let Some(bar) = &self.bar else { return };
        let memory = sample.service_bytes.map_or("?".into(), bytes);
        let gpus = if sample.gpu_mib.is_empty() {
            String::new()
        } else {
            format!(" gpu {:?} MiB", sample.gpu_mib)
        };
        let spark: Vec<u64> = record
            .samples
            .iter()
            .map(|s| s.service_bytes.unwrap_or(0))
            .collect();
        let against = self.last.as_ref().map_or(String::new(), |h| {
            format!(" {}", h.progress(elapsed, &Point::of(sample)).line())
        });
        bar.set_message(format!(
            "{stage} {elapsed:.0}s mem {memory}{gpus} {}{against}",
            sparkline(&spark)
        ));
    }

    pub fn stage(&self, name: Stage, passed: bool, detail: &str) {
        if self.label.is_empty() {
            return;
        }
        // A stage's detail can carry the host's words (a journal line, an error's output).
        let line = format!(
            "{} {}: {name} {}: {}",
            if passed { "✓" } else { "✗" },
            self.label,
            if passed { "passed" } else { "FAILED" },
            reconcile_core::terminal::escape_controls(detail)
        );
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Progress {
    /// The spinner's text, on a terminal (a wait that is not a verification stage: a drain).
    pub fn status(&self, text: &str) {
        if let Some(bar) = &self.bar {
            bar.set_message(reconcile_core::terminal::escape_controls(text).into_owned());
        }
    }

    /// A line of its own under the unit's label (the benchmark's figures, level by level).
    pub fn line(&self, text: &str) {
        if self.label.is_empty() {
            return;
        }
        let line = format!(
            "  {}: {}",
            self.label,
            reconcile_core::terminal::escape_controls(text)
        );
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }
}
