//! Progress of long offline jobs (import, index rebuild): a bar on a
//! terminal, a log line every few seconds otherwise.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use pando_server::bulk::Progress;

/// Seconds between log lines when stderr is not a terminal.
const LOG_EVERY: Duration = Duration::from_secs(5);

pub struct Reporter {
    bar: Option<ProgressBar>,
    started: Instant,
    /// Time and count of the previous report (for the recent rate).
    last: (Instant, u64),
    /// Rate over the last interval, for the bar.
    recent: f64,
    indexing: bool,
}

impl Reporter {
    /// `total_bytes`: size of the input when known (for the bar and ETA).
    pub fn new(total_bytes: Option<u64>) -> Reporter {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = match total_bytes {
                Some(n) => ProgressBar::new(n),
                None => ProgressBar::new_spinner(),
            };
            let template = if total_bytes.is_some() {
                "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ETA {eta} {msg}"
            } else {
                "{spinner} [{elapsed_precise}] {bytes} read {msg}"
            };
            if let Ok(style) = ProgressStyle::with_template(template) {
                bar.set_style(style);
            }
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        let now = Instant::now();
        Reporter {
            bar,
            started: now,
            last: (now, 0),
            recent: 0.0,
            indexing: false,
        }
    }

    pub fn update(&mut self, p: Progress) {
        let now = Instant::now();
        match p {
            Progress::Loading { entries, bytes } => {
                let since = now.duration_since(self.last.0);
                let due = since
                    >= if self.bar.is_some() {
                        Duration::from_secs(1)
                    } else {
                        LOG_EVERY
                    };
                if due {
                    self.recent = (entries - self.last.1) as f64 / since.as_secs_f64();
                }
                let avg = entries as f64 / now.duration_since(self.started).as_secs_f64().max(1e-3);
                match &self.bar {
                    Some(bar) => {
                        bar.set_position(bytes);
                        bar.set_message(format!(
                            "{entries} entries, {avg:.0}/s average, {:.0}/s recent",
                            self.recent
                        ));
                    }
                    None if due => eprintln!(
                        "Processed {entries} entries ({} MiB read) -- average rate {avg:.0}/sec, recent rate {:.0}/sec",
                        bytes >> 20,
                        self.recent
                    ),
                    None => {}
                }
                if due {
                    self.last = (now, entries);
                }
            }
            Progress::Indexing { done, total } => {
                let first = !self.indexing;
                self.indexing = true;
                let pct = if total == 0 {
                    100.0
                } else {
                    done as f64 * 100.0 / total as f64
                };
                match &self.bar {
                    Some(bar) => {
                        if first {
                            bar.set_length(total.max(1));
                            if let Ok(style) = ProgressStyle::with_template(
                                "{spinner} [{elapsed_precise}] indexing {wide_bar} {pos}/{len} keys ETA {eta}",
                            ) {
                                bar.set_style(style);
                            }
                        }
                        bar.set_position(done);
                    }
                    None => {
                        if first || now.duration_since(self.last.0) >= LOG_EVERY || done == total {
                            eprintln!("Indexing: {done} of {total} keys merged ({pct:.0}%)");
                            self.last.0 = now;
                        }
                    }
                }
            }
        }
    }

    /// Count of entries only (index rebuild): `done` of `total`.
    pub fn entries(&mut self, done: u64, total: u64) {
        let now = Instant::now();
        match &self.bar {
            Some(bar) => {
                if bar.length() != Some(total) {
                    bar.set_length(total);
                    if let Ok(style) = ProgressStyle::with_template(
                        "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} entries ETA {eta}",
                    ) {
                        bar.set_style(style);
                    }
                }
                bar.set_position(done);
            }
            None => {
                if now.duration_since(self.last.0) >= LOG_EVERY || done == total {
                    eprintln!("Read {done} of {total} entries");
                    self.last.0 = now;
                }
            }
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// A size such as `512M`, `2G`, `64MiB` or `1048576` (bytes).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: usize = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (e.g. 512M, 2G)"))?;
    let mult: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => return Err(format!("'{s}': unknown unit '{other}' (use K, M or G)")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("'{s}' is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5T").is_err());
    }
}
