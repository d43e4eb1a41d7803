//! Progress of the long tool runs (`test-backend --full`, `bench`): on a terminal, one status
//! line on stderr rewritten in place (what runs now, how many are done); elsewhere nothing, the
//! tools' own plain lines (families, table rows) being the record.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// One status line on stderr while stderr is a terminal.
pub struct Progress {
    tty: bool,
    label: String,
    done: usize,
    total: Option<usize>,
    shown: Option<Instant>,
}

impl Progress {
    /// A progress line headed `label`, drawn only when stderr is a terminal.
    pub fn new(label: impl Into<String>) -> Self {
        Progress { tty: std::io::stderr().is_terminal(), label: label.into(), done: 0, total: None, shown: None }
    }

    /// A new heading (a conformance family, a bench phase), its count starting again, of
    /// `total` steps where known.
    pub fn start(&mut self, label: impl Into<String>, total: Option<usize>) {
        self.label = label.into();
        self.done = 0;
        self.total = total;
        self.shown = None;
    }

    /// One more step done, `what` running next (redrawn at most every 50 ms).
    pub fn tick(&mut self, what: &str) {
        self.done += 1;
        if !self.tty || self.shown.is_some_and(|t| t.elapsed() < Duration::from_millis(50)) {
            return;
        }
        self.shown = Some(Instant::now());
        let count = match self.total {
            Some(t) => format!("{}/{t}", self.done),
            None => self.done.to_string(),
        };
        let mut line = format!("{} [{count}] {what}", self.label);
        line.truncate(line.char_indices().nth(110).map_or(line.len(), |(i, _)| i));
        eprint!("\r\x1b[2K{line}");
    }

    /// Whether the line is drawn (stderr is a terminal); elsewhere the tools print plain lines.
    pub fn on_terminal(&self) -> bool {
        self.tty
    }

    /// Clears the line (before a plain line is printed, and at the end).
    pub fn clear(&mut self) {
        if self.tty && self.shown.take().is_some() {
            eprint!("\r\x1b[2K");
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}
