//! Logging in TE-FL's line format: `[<time> TE-FL <file>:<line> <LEVEL>] <message>`.
//!
//! tefl logs through `tracing` with target `TE-FL`; nothing prints until a subscriber is
//! installed. [`init`] installs one that prints TE-FL's format on stderr at the level of
//! `TEFL_LOG_LEVEL` (or DEBUG with `TE_FL_DEBUG=1`); other targets print from WARNING up.
//!
//! ```no_run
//! tefl_core::logging::init().expect("valid TEFL_LOG_LEVEL");
//! ```

use std::fmt;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;

use crate::Result;
use crate::policy::LogLevel;

/// The `tracing` target of every tefl event.
pub const TARGET: &str = "TE-FL";

/// Formats events as TE-FL does.
#[derive(Debug, Clone, Copy, Default)]
pub struct TeflFormat;

impl<S, N> FormatEvent<S, N> for TeflFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let meta = event.metadata();
        let file = meta.file().and_then(|f| f.rsplit(['/', '\\']).next()).unwrap_or("?");
        let level = match *meta.level() {
            Level::ERROR => "ERROR",
            Level::WARN => "WARNING",
            Level::INFO => "INFO",
            Level::DEBUG => "DEBUG",
            Level::TRACE => "TRACE",
        };
        write!(writer, "[{} TE-FL {}:{} {}] ", timestamp(SystemTime::now()), file, meta.line().unwrap_or(0), level)?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// `YYYY-MM-DD HH:MM:SS` in UTC.
pub fn timestamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

fn level_filter(level: LogLevel) -> LevelFilter {
    match level {
        LogLevel::Debug => LevelFilter::DEBUG,
        LogLevel::Info => LevelFilter::INFO,
        LogLevel::Warning => LevelFilter::WARN,
        LogLevel::Error => LevelFilter::ERROR,
    }
}

/// A subscriber printing TE-FL's format to `writer`: target `TE-FL` at `level`, others at WARNING.
pub fn subscriber<W>(level: LogLevel, writer: W) -> impl Subscriber + Send + Sync
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let filter = Targets::new().with_target(TARGET, level_filter(level)).with_default(LevelFilter::WARN);
    let layer = tracing_subscriber::fmt::layer().event_format(TeflFormat).with_writer(writer).with_filter(filter);
    tracing_subscriber::registry().with(layer)
}

/// Installs the TE-FL subscriber on stderr as the global default, at the level the
/// environment asks for. A bad `TEFL_LOG_LEVEL` / `TE_FL_DEBUG` is a configuration error;
/// a subscriber installed earlier (by tefl or the application) is kept.
pub fn init() -> Result<()> {
    let level = crate::policy::env().as_ref().map_err(Clone::clone)?.log_level;
    let _ = tracing::subscriber::set_global_default(subscriber(level, std::io::stderr));
    Ok(())
}

/// An in-memory log sink, for tests and tools that compare log lines.
#[derive(Clone, Default)]
pub struct CapturedLog(Arc<Mutex<Vec<u8>>>);

impl CapturedLog {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }
    /// The lines written so far.
    pub fn lines(&self) -> Vec<String> {
        let buf = self.0.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&buf).lines().map(str::to_string).collect()
    }
    /// Runs `f` with this sink receiving TE-FL's lines from `level` up (on this thread), and
    /// returns what `f` returns.
    ///
    /// While at most one dispatcher is registered, `tracing` computes the interest of a
    /// callsite met for the first time from the *registering thread's* default dispatcher
    /// alone, and caches it. A test thread without a capture that first meets a TE-FL callsite
    /// while exactly one capture is live caches "never" for it, and the capturing thread's
    /// events from that callsite are lost (CI lost a fallback's WARNING that way, twice). A
    /// dispatcher registered once and kept for the whole process keeps the registry at two or
    /// more, so that every registration asks every live dispatcher, this sink's included; the
    /// interest cache is rebuilt after it is made, for callsites cached before.
    pub fn capture<R>(&self, level: LogLevel, f: impl FnOnce() -> R) -> R {
        static KEEP_REGISTRY_PLURAL: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
        KEEP_REGISTRY_PLURAL.get_or_init(|| {
            let d = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
            tracing::callsite::rebuild_interest_cache();
            d
        });
        tracing::subscriber::with_default(subscriber(level, self.clone()), f)
    }
    /// The messages written so far: each line without its `[<time> TE-FL <file>:<line> <LEVEL>] ` prefix,
    /// with the level: `(LEVEL, message)`.
    pub fn messages(&self) -> Vec<(String, String)> {
        self.lines()
            .iter()
            .filter_map(|l| {
                let (prefix, msg) = l.split_once("] ")?;
                let level = prefix.rsplit(' ').next()?;
                Some((level.to_string(), msg.to_string()))
            })
            .collect()
    }
}

impl Write for CapturedLog {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for CapturedLog {
    type Writer = CapturedLog;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamp_is_civil_utc() {
        assert_eq!(timestamp(UNIX_EPOCH), "1970-01-01 00:00:00");
        // 2026-11-22 01:48:42 UTC
        let t = UNIX_EPOCH + Duration::from_secs(1_795_312_122);
        assert_eq!(timestamp(t), "2026-11-22 01:48:42");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(timestamp(leap), "2000-02-29 00:00:00");
    }

    #[test]
    fn line_format_matches_te_fl() {
        let log = CapturedLog::new();
        log.capture(LogLevel::Info, || {
            tracing::info!(target: TARGET, "hello {}", 1);
            tracing::debug!(target: TARGET, "hidden");
            tracing::warn!(target: TARGET, "careful");
        });
        let lines = log.lines();
        assert_eq!(lines.len(), 2, "{lines:?}");
        let re_ok = |l: &str, level: &str, msg: &str| {
            let (prefix, m) = l.split_once("] ").unwrap();
            assert_eq!(m, msg);
            let parts: Vec<&str> = prefix.trim_start_matches('[').split(' ').collect();
            assert_eq!(parts.len(), 5, "{l}");
            assert_eq!(parts[0].len(), 10);
            assert_eq!(parts[1].len(), 8);
            assert_eq!(parts[2], "TE-FL");
            let (file, line) = parts[3].split_once(':').unwrap();
            assert_eq!(file, "logging.rs");
            assert!(line.parse::<u32>().is_ok());
            assert_eq!(parts[4], level);
        };
        re_ok(&lines[0], "INFO", "hello 1");
        re_ok(&lines[1], "WARNING", "careful");
    }
}
