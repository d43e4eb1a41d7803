//! The selection policy and every environment variable of DESIGN.md's table.
//!
//! Parsing is strict: malformed syntax, an unknown value, an unknown token kind or an op
//! name outside the catalogue is an [`Error::Config`] naming the variable and the bad piece.
//! Keywords (`flagos`, `INFO`, ...) are matched case-insensitively; surrounding whitespace
//! is ignored; an empty variable counts as unset.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::PathBuf;

use crate::{Error, Result, catalogue};

/// `TE_FL_PREFER`: which kind of impl comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Prefer {
    /// Portable kernels first: flagos → vendor → reference (the default).
    #[default]
    Flagos,
    /// Vendor kernels first: vendor → flagos → reference.
    Vendor,
    /// The reference first: reference → flagos → vendor.
    Reference,
}

impl Prefer {
    /// The kind order this preference gives.
    pub fn order(self) -> [crate::BackendImplKind; 3] {
        use crate::BackendImplKind::*;
        match self {
            Prefer::Flagos => [Default, Vendor, Reference],
            Prefer::Vendor => [Vendor, Default, Reference],
            Prefer::Reference => [Reference, Default, Vendor],
        }
    }
}

impl fmt::Display for Prefer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Prefer::Flagos => "flagos",
            Prefer::Vendor => "vendor",
            Prefer::Reference => "reference",
        })
    }
}

/// One token of a `TE_FL_PER_OP` order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Token {
    /// `flagos` or `default`: portable impls.
    Flagos,
    /// `vendor`: any vendor impl.
    Vendor,
    /// `vendor:<name>`: one vendor's impls (name compared case-insensitively).
    VendorNamed(String),
    /// `reference`.
    Reference,
    /// `impl:<impl_id>`: exactly one impl.
    Impl(String),
}

impl Token {
    /// Whether an impl matches this token.
    pub fn matches(&self, imp: &crate::OpImpl) -> bool {
        use crate::BackendImplKind as K;
        match self {
            Token::Flagos => imp.kind() == K::Default,
            Token::Vendor => imp.kind() == K::Vendor,
            Token::VendorNamed(n) => {
                imp.kind() == K::Vendor && imp.vendor_name().is_some_and(|v| v.eq_ignore_ascii_case(n))
            }
            Token::Reference => imp.kind() == K::Reference,
            Token::Impl(id) => imp.impl_id() == id,
        }
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Flagos => f.write_str("flagos"),
            Token::Vendor => f.write_str("vendor"),
            Token::VendorNamed(n) => write!(f, "vendor:{n}"),
            Token::Reference => f.write_str("reference"),
            Token::Impl(i) => write!(f, "impl:{i}"),
        }
    }
}

/// How one call's candidate chain is filtered and ordered. Build it from the environment
/// with [`SelectionPolicy::from_env`] or programmatically:
///
/// ```
/// use tefl_core::{Prefer, SelectionPolicy};
/// let p = SelectionPolicy::default()
///     .prefer(Prefer::Vendor)
///     .deny_vendors(&["acme"])
///     .per_op("rmsnorm_fwd", "vendor:nvidia|reference")?;
/// assert_eq!(p.per_op["rmsnorm_fwd"].len(), 2);
/// # Ok::<(), tefl_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectionPolicy {
    /// `TE_FL_PREFER` (or legacy `TE_FL_PREFER_VENDOR=1`).
    pub prefer: Prefer,
    /// `TE_FL_STRICT=1`: no fallback; the first impl's error is returned.
    pub strict: bool,
    /// `TE_FL_ALLOW_VENDORS`, lower-cased; applies to vendor impls only. `None`: all allowed.
    pub allow_vendors: Option<Vec<String>>,
    /// `TE_FL_DENY_VENDORS`, lower-cased; applies to every impl with that vendor name.
    pub deny_vendors: Vec<String>,
    /// `TE_FL_PER_OP`: op → token order. Replaces the default order for that op and limits
    /// its fallback chain to the tokens named.
    pub per_op: BTreeMap<String, Vec<Token>>,
    /// `TE_BACKEND` / `TE_PLUGIN` / `set_backend`: one whole backend forced (`torch` = `reference`).
    pub backend: Option<String>,
    /// `TE_FALLBACK_BACKEND`: where a forced backend's missing or failing ops go (default `reference`).
    pub fallback_backend: String,
}

impl Default for SelectionPolicy {
    fn default() -> Self {
        SelectionPolicy {
            prefer: Prefer::Flagos,
            strict: false,
            allow_vendors: None,
            deny_vendors: Vec::new(),
            per_op: BTreeMap::new(),
            backend: None,
            fallback_backend: "reference".into(),
        }
    }
}

/// Reads one variable: `Ok(None)` when unset or empty, an error when not UTF-8.
pub type Lookup<'a> = &'a dyn Fn(&'static str) -> Result<Option<String>>;

/// Reads the process environment.
pub fn env_lookup(var: &'static str) -> Result<Option<String>> {
    match std::env::var_os(var) {
        None => Ok(None),
        Some(v) => match v.into_string() {
            Ok(s) if s.trim().is_empty() => Ok(None),
            Ok(s) => Ok(Some(s)),
            Err(raw) => Err(Error::config(var, raw.to_string_lossy(), "value is not valid UTF-8")),
        },
    }
}

impl SelectionPolicy {
    /// The policy the environment describes (`TE_FL_PREFER`, `TE_FL_PREFER_VENDOR`,
    /// `TE_FL_STRICT`, `TE_FL_ALLOW_VENDORS`, `TE_FL_DENY_VENDORS`, `TE_FL_PER_OP`,
    /// `TE_BACKEND`, `TE_PLUGIN`, `TE_FALLBACK_BACKEND`).
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(&env_lookup)
    }

    /// The policy described by variables read through `get` (tests pass a map).
    pub fn from_lookup(get: Lookup<'_>) -> Result<Self> {
        let mut p = SelectionPolicy::default();
        let legacy = get("TE_FL_PREFER_VENDOR")?.map(|v| parse_flag("TE_FL_PREFER_VENDOR", &v)).transpose()?;
        match get("TE_FL_PREFER")? {
            Some(v) => p.prefer = parse_prefer("TE_FL_PREFER", &v)?,
            None if legacy == Some(true) => p.prefer = Prefer::Vendor,
            None => {}
        }
        if let Some(v) = get("TE_FL_STRICT")? {
            p.strict = parse_flag("TE_FL_STRICT", &v)?;
        }
        if let Some(v) = get("TE_FL_ALLOW_VENDORS")? {
            p.allow_vendors = Some(parse_name_list("TE_FL_ALLOW_VENDORS", &v)?);
        }
        if let Some(v) = get("TE_FL_DENY_VENDORS")? {
            p.deny_vendors = parse_name_list("TE_FL_DENY_VENDORS", &v)?;
        }
        if let Some(v) = get("TE_FL_PER_OP")? {
            p.per_op = parse_per_op("TE_FL_PER_OP", &v)?;
        }
        let backend_raw = get("TE_BACKEND")?;
        let plugin_raw = get("TE_PLUGIN")?;
        let backend = backend_raw.as_deref().map(|v| parse_backend_name("TE_BACKEND", v)).transpose()?;
        let plugin = plugin_raw.as_deref().map(|v| parse_backend_name("TE_PLUGIN", v)).transpose()?;
        p.backend = match (backend, plugin) {
            (Some(b), Some(pl)) if b != pl => {
                // Messages quote what the user typed, not the parsed name (`torch` reads as itself).
                let typed = |raw: &Option<String>| raw.as_deref().unwrap_or("").trim().to_string();
                return Err(Error::config(
                    "TE_PLUGIN",
                    typed(&plugin_raw),
                    format!("conflicts with TE_BACKEND={}; set only one", typed(&backend_raw)),
                ));
            }
            (b, pl) => b.or(pl),
        };
        if let Some(v) = get("TE_FALLBACK_BACKEND")? {
            p.fallback_backend = parse_backend_name("TE_FALLBACK_BACKEND", &v)?;
        }
        Ok(p)
    }

    /// Sets the preference.
    pub fn prefer(mut self, prefer: Prefer) -> Self {
        self.prefer = prefer;
        self
    }
    /// Sets strict mode.
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }
    /// Sets the allow list (vendor impls only).
    pub fn allow_vendors(mut self, vendors: &[&str]) -> Self {
        self.allow_vendors = Some(vendors.iter().map(|v| v.to_ascii_lowercase()).collect());
        self
    }
    /// Sets the deny list.
    pub fn deny_vendors(mut self, vendors: &[&str]) -> Self {
        self.deny_vendors = vendors.iter().map(|v| v.to_ascii_lowercase()).collect();
        self
    }
    /// Sets one op's order from `TE_FL_PER_OP` syntax (`vendor:acme|reference`).
    pub fn per_op(mut self, op: &str, order: &str) -> Result<Self> {
        let (op, tokens) = parse_per_op_entry("per_op", &format!("{op}={order}"))?;
        self.per_op.insert(op, tokens);
        Ok(self)
    }
    /// Forces one whole backend (`None`: automatic selection).
    pub fn backend(mut self, backend: Option<&str>) -> Result<Self> {
        self.backend = backend.map(|b| parse_backend_name("set_backend", b)).transpose()?;
        Ok(self)
    }

    /// Whether the deny list names `vendor`.
    pub fn denies(&self, vendor: &str) -> bool {
        self.deny_vendors.iter().any(|d| d.eq_ignore_ascii_case(vendor))
    }
    /// Whether the allow list (if any) admits `vendor`.
    pub fn allows(&self, vendor: &str) -> bool {
        self.allow_vendors.as_ref().is_none_or(|a| a.iter().any(|x| x.eq_ignore_ascii_case(vendor)))
    }
}

/// A scoped change to the policy; see `Manager::scoped`. Unset fields leave the policy as is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PolicyOverride {
    /// Replaces the preference.
    pub prefer: Option<Prefer>,
    /// Replaces strict mode.
    pub strict: Option<bool>,
    /// Replaces the allow list.
    pub allow_vendors: Option<Option<Vec<String>>>,
    /// Replaces the deny list.
    pub deny_vendors: Option<Vec<String>>,
    /// Per-op orders added (replacing those ops' entries).
    pub per_op: BTreeMap<String, Vec<Token>>,
}

impl PolicyOverride {
    /// An override that changes nothing yet.
    pub fn new() -> Self {
        Self::default()
    }
    /// Overrides the preference.
    pub fn prefer(mut self, p: Prefer) -> Self {
        self.prefer = Some(p);
        self
    }
    /// Overrides strict mode.
    pub fn strict(mut self, s: bool) -> Self {
        self.strict = Some(s);
        self
    }
    /// Overrides the allow list.
    pub fn allow_vendors(mut self, v: &[&str]) -> Self {
        self.allow_vendors = Some(Some(v.iter().map(|s| s.to_ascii_lowercase()).collect()));
        self
    }
    /// Overrides the deny list.
    pub fn deny_vendors(mut self, v: &[&str]) -> Self {
        self.deny_vendors = Some(v.iter().map(|s| s.to_ascii_lowercase()).collect());
        self
    }
    /// Adds a per-op order (`TE_FL_PER_OP` token syntax).
    pub fn per_op(mut self, op: &str, order: &str) -> Result<Self> {
        let (op, tokens) = parse_per_op_entry("per_op", &format!("{op}={order}"))?;
        self.per_op.insert(op, tokens);
        Ok(self)
    }
    /// Applies the override to a policy.
    pub fn apply(&self, p: &mut SelectionPolicy) {
        if let Some(x) = self.prefer {
            p.prefer = x;
        }
        if let Some(x) = self.strict {
            p.strict = x;
        }
        if let Some(x) = &self.allow_vendors {
            p.allow_vendors = x.clone();
        }
        if let Some(x) = &self.deny_vendors {
            p.deny_vendors = x.clone();
        }
        for (op, t) in &self.per_op {
            p.per_op.insert(op.clone(), t.clone());
        }
    }
}

/// Parses `flagos` / `default` / `vendor` / `reference`.
pub fn parse_prefer(var: &'static str, value: &str) -> Result<Prefer> {
    match value.trim().to_ascii_lowercase().as_str() {
        "flagos" | "default" => Ok(Prefer::Flagos),
        "vendor" => Ok(Prefer::Vendor),
        "reference" => Ok(Prefer::Reference),
        _ => Err(Error::config(var, value.trim(), "expected one of flagos, vendor, reference")),
    }
}

/// Parses `0` / `1`.
pub fn parse_flag(var: &'static str, value: &str) -> Result<bool> {
    match value.trim() {
        "0" => Ok(false),
        "1" => Ok(true),
        other => Err(Error::config(var, other, "expected 0 or 1")),
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// Parses a comma list of vendor names (lower-cased). Empty items are errors.
pub fn parse_name_list(var: &'static str, value: &str) -> Result<Vec<String>> {
    value
        .split(',')
        .map(|item| {
            let item = item.trim();
            if item.is_empty() {
                Err(Error::config(var, value.trim(), "empty item in comma list"))
            } else if !valid_name(item) {
                Err(Error::config(var, item, "names use ASCII letters, digits, '_', '.' or '-'"))
            } else {
                Ok(item.to_ascii_lowercase())
            }
        })
        .collect()
}

/// Parses a backend name for `TE_BACKEND`, `TE_PLUGIN`, `TE_FALLBACK_BACKEND` (`torch` means `reference`).
pub fn parse_backend_name(var: &'static str, value: &str) -> Result<String> {
    let v = value.trim().to_ascii_lowercase();
    if !valid_name(&v) {
        return Err(Error::config(var, value.trim(), "expected a backend name such as nvidia, amd, vulkan, reference"));
    }
    Ok(if v == "torch" { "reference".into() } else { v })
}

/// Parses one token of a per-op order.
pub fn parse_token(var: &'static str, raw: &str) -> Result<Token> {
    let t = raw.trim();
    let (head, arg) = match t.split_once(':') {
        Some((h, a)) => (h.trim().to_ascii_lowercase(), Some(a.trim())),
        None => (t.to_ascii_lowercase(), None),
    };
    let need = |a: Option<&str>, what: &str| -> Result<String> {
        match a {
            Some(a) if valid_name(a) => Ok(a.to_string()),
            _ => Err(Error::config(var, t, format!("'{head}:' needs {what}"))),
        }
    };
    match (head.as_str(), arg) {
        ("flagos" | "default", None) => Ok(Token::Flagos),
        ("vendor", None) => Ok(Token::Vendor),
        ("reference", None) => Ok(Token::Reference),
        ("vendor", a) => Ok(Token::VendorNamed(need(a, "a vendor name")?.to_ascii_lowercase())),
        ("impl", a) => Ok(Token::Impl(need(a, "an impl id")?)),
        ("flagos" | "default" | "reference", Some(_)) => {
            Err(Error::config(var, t, format!("'{head}' takes no ':' argument")))
        }
        _ => Err(Error::config(
            var,
            t,
            "unknown token; expected flagos, default, vendor, vendor:<name>, reference or impl:<impl_id>",
        )),
    }
}

fn parse_per_op_entry(var: &'static str, entry: &str) -> Result<(String, Vec<Token>)> {
    let Some((op, order)) = entry.split_once('=') else {
        return Err(Error::config(var, entry.trim(), "expected op=token|token"));
    };
    let op = op.trim();
    if op.is_empty() {
        return Err(Error::config(var, entry.trim(), "missing op name before '='"));
    }
    if catalogue::find(op).is_none() {
        let hint = match catalogue::closest(op) {
            Some(c) => format!("not an op of the catalogue; did you mean '{c}'?"),
            None => "not an op of the catalogue".to_string(),
        };
        return Err(Error::config(var, op, hint));
    }
    if order.trim().is_empty() {
        return Err(Error::config(var, entry.trim(), "empty token list after '='"));
    }
    let mut tokens = Vec::new();
    for raw in order.split('|') {
        if raw.trim().is_empty() {
            return Err(Error::config(var, entry.trim(), "empty token between '|'"));
        }
        let tok = parse_token(var, raw)?;
        if tokens.contains(&tok) {
            return Err(Error::config(var, raw.trim(), format!("token repeated for op '{op}'")));
        }
        tokens.push(tok);
    }
    Ok((op.to_string(), tokens))
}

/// Parses `op=tok|tok;op2=tok` (a trailing `;` is allowed; an op may appear once).
pub fn parse_per_op(var: &'static str, value: &str) -> Result<BTreeMap<String, Vec<Token>>> {
    let mut map = BTreeMap::new();
    let trimmed = value.trim();
    let body = trimmed.strip_suffix(';').unwrap_or(trimmed);
    for entry in body.split(';') {
        if entry.trim().is_empty() {
            return Err(Error::config(var, value.trim(), "empty entry between ';'"));
        }
        let (op, tokens) = parse_per_op_entry(var, entry)?;
        if map.insert(op.clone(), tokens).is_some() {
            return Err(Error::config(var, op, "op configured twice"));
        }
    }
    Ok(map)
}

/// Log levels of `TEFL_LOG_LEVEL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum LogLevel {
    /// Everything.
    Debug,
    /// The default.
    #[default]
    Info,
    /// Warnings and errors.
    Warning,
    /// Errors only.
    Error,
}

impl LogLevel {
    /// The name TE-FL prints.
    pub fn name(self) -> &'static str {
        match self {
            LogLevel::Debug => "DEBUG",
            LogLevel::Info => "INFO",
            LogLevel::Warning => "WARNING",
            LogLevel::Error => "ERROR",
        }
    }
}

/// Parses `DEBUG` / `INFO` / `WARNING` (or `WARN`) / `ERROR`.
pub fn parse_log_level(var: &'static str, value: &str) -> Result<LogLevel> {
    match value.trim().to_ascii_uppercase().as_str() {
        "DEBUG" => Ok(LogLevel::Debug),
        "INFO" => Ok(LogLevel::Info),
        "WARNING" | "WARN" => Ok(LogLevel::Warning),
        "ERROR" => Ok(LogLevel::Error),
        _ => Err(Error::config(var, value.trim(), "expected DEBUG, INFO, WARNING or ERROR")),
    }
}

/// Every tefl environment variable, parsed and checked at once: the one reader of the
/// environment. The manager takes its policy and plugins from it, and backends take their
/// settings from [`env()`] (skip flags, autotuning, caches, kernel timing), so each variable
/// has one parser and one default.
///
/// Paths (`TEFL_CACHE_DIR`, `TE_FL_PLUGIN_MODULES` entries) are taken as raw OS strings:
/// any valid path works, UTF-8 or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvConfig {
    /// The selection variables.
    pub policy: SelectionPolicy,
    /// `TE_FL_PLUGIN_MODULES`: plugin libraries (paths, or names `x` for `libx.so`).
    pub plugin_modules: Vec<OsString>,
    /// `TE_FL_SKIP_CUDA=1`: the nvidia backend reports unavailable.
    pub skip_cuda: bool,
    /// `TEFL_LOG_LEVEL`, or DEBUG when `TE_FL_DEBUG=1` (the explicit level wins).
    pub log_level: LogLevel,
    /// `TEFL_AUTOTUNE=1`: time tune candidates on first use of a shape bucket. Off by
    /// default (heuristics only), so that a first call never pays for measuring unasked.
    pub autotune: bool,
    /// The autotune and compiled-kernel cache folder: `TEFL_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/tefl`, else `$HOME/.cache/tefl`.
    pub cache_dir: PathBuf,
    /// `TEFL_KERNEL_TIMING=1`: GPU backends time every kernel launch and print it.
    pub kernel_timing: bool,
    /// `TEFL_ATTN_FWD_MIN_BLOCKS` (1..=4): forward-attention blocks per SM the CUDA kernel's
    /// register budget is cut for (experiments; `None` = the tune config's value).
    pub attn_fwd_min_blocks: Option<u32>,
    /// `TEFL_ATTN_WGMMA` (`0`/`1`): whether the CUDA forward attention may run on the Hopper
    /// wgmma kernel (`None` = the tune config's choice; `0` compares with the mma.sync kernel).
    pub attn_wgmma: Option<bool>,
    /// `TEFL_COOPERATIVE` (`0`/`1`, default `1`): whether GPU backends may use cooperative
    /// launches (every block resident at once), where a kernel's blocks sum their partial
    /// results among themselves instead of in a second launch; `0` keeps the second launch
    /// (comparisons, or a GPU shared with other processes).
    pub cooperative: bool,
    /// `TEFL_COMPILE_AHEAD` (`0`/`1`, default `1`): whether GPU backends compile, on other
    /// threads, the kernel variants an op's first call implies for later calls (a forward its
    /// backward's); `0` compiles each variant at its own first launch only (the process then
    /// never waits at exit for a compile nothing used).
    pub compile_ahead: bool,
    /// `TEFL_VULKAN_DEVICE`: the Vulkan device tefl uses, an index into its list (discrete GPUs
    /// first) or part of a name (the Vulkan backend resolves it); `None` = the first.
    pub vulkan_device: Option<String>,
    /// `TEFL_VULKAN_COOPMAT` (0, 1 or 2; default 1): cooperative matrices for the Vulkan GEMM
    /// and attention where the device has them (1), with GEMM on NVIDIA's workgroup-scope
    /// matrices where offered (2), or none (0).
    pub vulkan_coopmat: u8,
    /// `TEFL_VULKAN_GEMM_TILE` (`MxN` or `MxN/G`, G = 8 where left out): the pinned
    /// cooperative-matrix GEMM tile as (M, N, G); whether that tile was built and fits the
    /// device is the Vulkan backend's check when it opens one.
    pub vulkan_gemm_tile: Option<(u32, u32, u32)>,
    /// `TEFL_VULKAN_PIPELINE_STATS=1`: log the driver's statistics of every Vulkan pipeline.
    pub vulkan_pipeline_stats: bool,
    /// `TEFL_HOST_CACHE_MB` (whole MiB, 0 to [`MAX_HOST_CACHE_MIB`]; default 512): the most
    /// bytes of freed CPU buffers tefl keeps for reuse (`device::HOST_CACHE_BYTES` by default;
    /// 0 keeps none).
    pub host_cache_bytes: usize,
}

/// The largest `TEFL_HOST_CACHE_MB` taken: 1 TiB.
pub const MAX_HOST_CACHE_MIB: usize = 1 << 20;

/// `TEFL_VULKAN_GEMM_TILE`'s form: `MxN` or `MxN/G`, positive integers (G = 8 where left out).
fn parse_gemm_tile(var: &'static str, v: &str) -> Result<(u32, u32, u32)> {
    let bad = || Error::config(var, v.trim(), "expected MxN or MxN/G, e.g. 128x256/8");
    let (dims, group) = v.trim().split_once('/').unwrap_or((v.trim(), "8"));
    let (m, n) = dims.split_once(['x', 'X']).ok_or_else(bad)?;
    let num = |t: &str| t.trim().parse::<u32>().ok().filter(|&x| x > 0).ok_or_else(bad);
    Ok((num(m)?, num(n)?, num(group)?))
}

/// Reads one variable as an OS string (paths): `Ok(None)` when unset or empty.
pub type OsLookup<'a> = &'a dyn Fn(&'static str) -> Result<Option<OsString>>;

/// Reads the process environment as OS strings (never an error: any bytes are a valid path).
pub fn env_lookup_os(var: &'static str) -> Result<Option<OsString>> {
    Ok(std::env::var_os(var).filter(|v| !v.to_string_lossy().trim().is_empty()))
}

/// The process's configuration, read once, on first use. Every part of tefl that needs a
/// variable reads it here; a malformed variable is the same error everywhere.
pub fn env() -> &'static Result<EnvConfig> {
    static ENV: std::sync::OnceLock<Result<EnvConfig>> = std::sync::OnceLock::new();
    ENV.get_or_init(EnvConfig::from_env)
}

/// Splits a comma list of paths on the raw bytes (Unix) so non-UTF-8 entries survive.
fn split_paths(var: &'static str, v: &OsStr) -> Result<Vec<OsString>> {
    #[cfg(unix)]
    let items: Vec<OsString> = {
        use std::os::unix::ffi::{OsStrExt, OsStringExt};
        v.as_bytes().split(|b| *b == b',').map(|b| OsString::from_vec(b.trim_ascii().to_vec())).collect()
    };
    #[cfg(not(unix))]
    let items: Vec<OsString> = v.to_string_lossy().split(',').map(|s| OsString::from(s.trim())).collect();
    if items.iter().any(|i| i.is_empty()) {
        return Err(Error::config(var, v.to_string_lossy().trim(), "empty item in comma list"));
    }
    Ok(items)
}

/// A path variable's value with surrounding ASCII whitespace removed.
fn trim_os(v: OsString) -> OsString {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::{OsStrExt, OsStringExt};
        OsString::from_vec(v.as_bytes().trim_ascii().to_vec())
    }
    #[cfg(not(unix))]
    {
        OsString::from(v.to_string_lossy().trim())
    }
}

impl EnvConfig {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self> {
        Self::from_lookups(&env_lookup, &env_lookup_os)
    }

    /// Reads variables through `get` (tests pass a map); paths come from the same strings.
    pub fn from_lookup(get: Lookup<'_>) -> Result<Self> {
        Self::from_lookups(get, &|k| get(k).map(|v| v.map(OsString::from)))
    }

    /// Reads text variables through `get` and path variables through `get_os`.
    pub fn from_lookups(get: Lookup<'_>, get_os: OsLookup<'_>) -> Result<Self> {
        let policy = SelectionPolicy::from_lookup(get)?;
        let plugin_modules = match get_os("TE_FL_PLUGIN_MODULES")? {
            None => Vec::new(),
            Some(v) => split_paths("TE_FL_PLUGIN_MODULES", &v)?,
        };
        let flag = |var: &'static str| -> Result<bool> {
            Ok(get(var)?.map(|v| parse_flag(var, &v)).transpose()?.unwrap_or(false))
        };
        let skip_cuda = flag("TE_FL_SKIP_CUDA")?;
        let debug = flag("TE_FL_DEBUG")?;
        let log_level = match get("TEFL_LOG_LEVEL")? {
            Some(v) => parse_log_level("TEFL_LOG_LEVEL", &v)?,
            None if debug => LogLevel::Debug,
            None => LogLevel::Info,
        };
        let autotune = flag("TEFL_AUTOTUNE")?;
        let kernel_timing = flag("TEFL_KERNEL_TIMING")?;
        let attn_fwd_min_blocks = match get("TEFL_ATTN_FWD_MIN_BLOCKS")? {
            None => None,
            Some(v) => match v.trim().parse::<u32>() {
                Ok(n) if (1..=4).contains(&n) => Some(n),
                _ => {
                    return Err(Error::config("TEFL_ATTN_FWD_MIN_BLOCKS", v.trim(), "expected an integer from 1 to 4"));
                }
            },
        };
        let attn_wgmma = get("TEFL_ATTN_WGMMA")?.map(|v| parse_flag("TEFL_ATTN_WGMMA", &v)).transpose()?;
        let cooperative =
            get("TEFL_COOPERATIVE")?.map(|v| parse_flag("TEFL_COOPERATIVE", &v)).transpose()?.unwrap_or(true);
        let compile_ahead =
            get("TEFL_COMPILE_AHEAD")?.map(|v| parse_flag("TEFL_COMPILE_AHEAD", &v)).transpose()?.unwrap_or(true);
        let vulkan_device = get("TEFL_VULKAN_DEVICE")?.map(|v| v.trim().to_string());
        let vulkan_coopmat = match get("TEFL_VULKAN_COOPMAT")?.as_deref().map(str::trim) {
            None | Some("1") => 1,
            Some("2") => 2,
            Some("0") => 0,
            Some(other) => {
                return Err(Error::config(
                    "TEFL_VULKAN_COOPMAT",
                    other,
                    "expected 1 (subgroup-scope cooperative matrices, the default), 2 (GEMM on workgroup-scope ones \
                     where offered) or 0 (none)",
                ));
            }
        };
        let vulkan_gemm_tile =
            get("TEFL_VULKAN_GEMM_TILE")?.map(|v| parse_gemm_tile("TEFL_VULKAN_GEMM_TILE", &v)).transpose()?;
        let vulkan_pipeline_stats = flag("TEFL_VULKAN_PIPELINE_STATS")?;
        let host_cache_bytes = match get("TEFL_HOST_CACHE_MB")? {
            None => crate::device::HOST_CACHE_BYTES,
            Some(v) => match v.trim().parse::<usize>() {
                Ok(mib) if mib <= MAX_HOST_CACHE_MIB => mib << 20,
                _ => {
                    return Err(Error::config(
                        "TEFL_HOST_CACHE_MB",
                        v.trim(),
                        format!(
                            "expected a whole number of MiB from 0 (keep no freed CPU buffers) to {MAX_HOST_CACHE_MIB}"
                        ),
                    ));
                }
            },
        };
        let cache_dir = match get_os("TEFL_CACHE_DIR")? {
            Some(d) => PathBuf::from(trim_os(d)),
            None => match get_os("XDG_CACHE_HOME")? {
                Some(x) => PathBuf::from(x).join("tefl"),
                None => PathBuf::from(get_os("HOME")?.unwrap_or_else(|| ".".into())).join(".cache").join("tefl"),
            },
        };
        Ok(EnvConfig {
            policy,
            plugin_modules,
            skip_cuda,
            log_level,
            autotune,
            cache_dir,
            kernel_timing,
            attn_fwd_min_blocks,
            attn_wgmma,
            cooperative,
            compile_ahead,
            vulkan_device,
            vulkan_coopmat,
            vulkan_gemm_tile,
            vulkan_pipeline_stats,
            host_cache_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(vars: &[(&'static str, &str)]) -> impl Fn(&'static str) -> Result<Option<String>> {
        let m: HashMap<&'static str, String> = vars.iter().map(|(k, v)| (*k, v.to_string())).collect();
        move |k| Ok(m.get(k).cloned().filter(|v| !v.trim().is_empty()))
    }

    fn policy(vars: &[(&'static str, &str)]) -> Result<SelectionPolicy> {
        SelectionPolicy::from_lookup(&lookup(vars))
    }

    fn config_err(r: Result<SelectionPolicy>) -> (&'static str, String) {
        match r {
            Err(Error::Config { variable, token, .. }) => (variable, token),
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let p = policy(&[]).unwrap();
        assert_eq!(p, SelectionPolicy::default());
        assert_eq!(p.prefer, Prefer::Flagos);
        assert!(!p.strict);
        assert_eq!(p.fallback_backend, "reference");
    }

    #[test]
    fn prefer_and_legacy() {
        assert_eq!(policy(&[("TE_FL_PREFER", "vendor")]).unwrap().prefer, Prefer::Vendor);
        assert_eq!(policy(&[("TE_FL_PREFER", " Reference ")]).unwrap().prefer, Prefer::Reference);
        assert_eq!(policy(&[("TE_FL_PREFER", "default")]).unwrap().prefer, Prefer::Flagos);
        assert_eq!(policy(&[("TE_FL_PREFER_VENDOR", "1")]).unwrap().prefer, Prefer::Vendor);
        assert_eq!(policy(&[("TE_FL_PREFER_VENDOR", "0")]).unwrap().prefer, Prefer::Flagos);
        // TE_FL_PREFER wins over the legacy variable.
        let p = policy(&[("TE_FL_PREFER_VENDOR", "1"), ("TE_FL_PREFER", "reference")]).unwrap();
        assert_eq!(p.prefer, Prefer::Reference);
        assert_eq!(config_err(policy(&[("TE_FL_PREFER", "bogus")])), ("TE_FL_PREFER", "bogus".into()));
        assert_eq!(config_err(policy(&[("TE_FL_PREFER_VENDOR", "yes")])), ("TE_FL_PREFER_VENDOR", "yes".into()));
    }

    #[test]
    fn strict_is_not_inverted() {
        assert!(policy(&[("TE_FL_STRICT", "1")]).unwrap().strict);
        assert!(!policy(&[("TE_FL_STRICT", "0")]).unwrap().strict);
        assert_eq!(config_err(policy(&[("TE_FL_STRICT", "true")])).0, "TE_FL_STRICT");
    }

    #[test]
    fn vendor_lists() {
        let p = policy(&[("TE_FL_ALLOW_VENDORS", "NVIDIA, acme"), ("TE_FL_DENY_VENDORS", "Foo")]).unwrap();
        assert_eq!(p.allow_vendors, Some(vec!["nvidia".into(), "acme".into()]));
        assert!(p.allows("Nvidia") && !p.allows("amd"));
        assert!(p.denies("FOO"));
        assert_eq!(config_err(policy(&[("TE_FL_ALLOW_VENDORS", "a,,b")])).0, "TE_FL_ALLOW_VENDORS");
        assert_eq!(config_err(policy(&[("TE_FL_DENY_VENDORS", "a b")])), ("TE_FL_DENY_VENDORS", "a b".into()));
    }

    #[test]
    fn per_op_syntax() {
        let p =
            policy(&[("TE_FL_PER_OP", "rmsnorm_fwd=vendor:Acme|flagos;rmsnorm_bwd=impl:vendor.x|reference;")]).unwrap();
        assert_eq!(p.per_op["rmsnorm_fwd"], vec![Token::VendorNamed("acme".into()), Token::Flagos]);
        assert_eq!(p.per_op["rmsnorm_bwd"], vec![Token::Impl("vendor.x".into()), Token::Reference]);
        let cases: &[(&str, &str)] = &[
            ("rmsnorm_fwd=vendr:x", "vendr:x"),
            ("rmsnorm_fwd", "rmsnorm_fwd"),
            ("no_such_op=vendor", "no_such_op"),
            ("rmsnorm_fwd=", "rmsnorm_fwd="),
            ("rmsnorm_fwd=vendor||reference", "rmsnorm_fwd=vendor||reference"),
            ("rmsnorm_fwd=vendor:", "vendor:"),
            ("rmsnorm_fwd=impl:", "impl:"),
            ("rmsnorm_fwd=reference:x", "reference:x"),
            ("rmsnorm_fwd=vendor|vendor", "vendor"),
            ("rmsnorm_fwd=vendor;rmsnorm_fwd=reference", "rmsnorm_fwd"),
            ("=vendor", "=vendor"),
            (";;", ";;"),
        ];
        for (value, bad) in cases {
            let (var, token) = config_err(policy(&[("TE_FL_PER_OP", value)]));
            assert_eq!(var, "TE_FL_PER_OP");
            assert_eq!(&token, bad, "for {value:?}");
        }
        // The reason reads as a sentence naming what is missing.
        for (value, says) in [("rmsnorm_fwd=vendor:", "needs a vendor name"), ("rmsnorm_fwd=impl:", "needs an impl id")]
        {
            let e = policy(&[("TE_FL_PER_OP", value)]).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn tex_backend_variables() {
        assert_eq!(policy(&[("TE_BACKEND", "torch")]).unwrap().backend.as_deref(), Some("reference"));
        assert_eq!(policy(&[("TE_PLUGIN", "NVIDIA")]).unwrap().backend.as_deref(), Some("nvidia"));
        assert_eq!(policy(&[("TE_BACKEND", "amd"), ("TE_PLUGIN", "amd")]).unwrap().backend.as_deref(), Some("amd"));
        assert_eq!(
            config_err(policy(&[("TE_BACKEND", "amd"), ("TE_PLUGIN", "nvidia")])),
            ("TE_PLUGIN", "nvidia".into())
        );
        assert_eq!(policy(&[("TE_FALLBACK_BACKEND", "torch")]).unwrap().fallback_backend, "reference");
        assert_eq!(config_err(policy(&[("TE_BACKEND", "nv idia")])).0, "TE_BACKEND");
    }

    #[test]
    fn env_config_other_variables() {
        let c = EnvConfig::from_lookup(&lookup(&[("TE_FL_DEBUG", "1"), ("TEFL_AUTOTUNE", "0")])).unwrap();
        assert_eq!(c.log_level, LogLevel::Debug);
        assert!(!c.autotune);
        let c = EnvConfig::from_lookup(&lookup(&[
            ("TEFL_AUTOTUNE", "1"),
            ("TEFL_KERNEL_TIMING", "1"),
            ("TEFL_ATTN_FWD_MIN_BLOCKS", " 3 "),
            ("TEFL_ATTN_WGMMA", "0"),
            ("TEFL_COOPERATIVE", "0"),
            ("TEFL_COMPILE_AHEAD", "0"),
            ("TEFL_CACHE_DIR", " /tmp/x "),
        ]))
        .unwrap();
        assert_eq!(c.attn_wgmma, Some(false));
        assert!(!c.cooperative && !c.compile_ahead);
        assert!(c.autotune && c.kernel_timing);
        assert_eq!(c.attn_fwd_min_blocks, Some(3));
        assert_eq!(c.cache_dir, PathBuf::from("/tmp/x"));
        let d = EnvConfig::from_lookup(&lookup(&[("XDG_CACHE_HOME", "/c")])).unwrap();
        assert!(!d.autotune && !d.kernel_timing, "measuring and timing are opt-in");
        assert!(d.cooperative, "cooperative launches are on by default");
        assert!(d.compile_ahead, "compiling ahead is on by default");
        assert_eq!(d.cache_dir, PathBuf::from("/c/tefl"));
        assert_eq!((d.vulkan_coopmat, d.vulkan_gemm_tile, d.vulkan_pipeline_stats), (1, None, false));
        assert_eq!(d.vulkan_device, None);
        assert_eq!(d.host_cache_bytes, crate::device::HOST_CACHE_BYTES);
        for (mib, bytes) in [(" 64 ", 64 << 20), ("0", 0), ("1048576", 1 << 40)] {
            let h = EnvConfig::from_lookup(&lookup(&[("TEFL_HOST_CACHE_MB", mib)])).unwrap();
            assert_eq!(h.host_cache_bytes, bytes, "TEFL_HOST_CACHE_MB={mib}");
        }
        let v = EnvConfig::from_lookup(&lookup(&[
            ("TEFL_VULKAN_DEVICE", " NVIDIA H200 "),
            ("TEFL_VULKAN_COOPMAT", " 0 "),
            ("TEFL_VULKAN_GEMM_TILE", "256X128/1"),
            ("TEFL_VULKAN_PIPELINE_STATS", "1"),
        ]))
        .unwrap();
        assert_eq!(v.vulkan_device.as_deref(), Some("NVIDIA H200"));
        assert_eq!((v.vulkan_coopmat, v.vulkan_gemm_tile, v.vulkan_pipeline_stats), (0, Some((256, 128, 1)), true));
        let v = EnvConfig::from_lookup(&lookup(&[("TEFL_VULKAN_COOPMAT", "2"), ("TEFL_VULKAN_GEMM_TILE", "128x256")]));
        assert_eq!(v.map(|v| (v.vulkan_coopmat, v.vulkan_gemm_tile)).unwrap(), (2, Some((128, 256, 8))));
        let c = EnvConfig::from_lookup(&lookup(&[("TE_FL_DEBUG", "1"), ("TEFL_LOG_LEVEL", "error")])).unwrap();
        assert_eq!(c.log_level, LogLevel::Error);
        let c = EnvConfig::from_lookup(&lookup(&[("TE_FL_PLUGIN_MODULES", "libx.so, y")])).unwrap();
        assert_eq!(c.plugin_modules, vec![OsString::from("libx.so"), "y".into()]);
        for (var, val) in [
            ("TEFL_LOG_LEVEL", "LOUD"),
            ("TE_FL_SKIP_CUDA", "2"),
            ("TE_FL_PLUGIN_MODULES", "a,,b"),
            ("TEFL_AUTOTUNE", "off"),
            ("TEFL_KERNEL_TIMING", "bogus"),
            ("TEFL_ATTN_FWD_MIN_BLOCKS", "lots"),
            ("TEFL_ATTN_FWD_MIN_BLOCKS", "9"),
            ("TEFL_ATTN_WGMMA", "maybe"),
            ("TEFL_COOPERATIVE", "yes please"),
            ("TEFL_COMPILE_AHEAD", "later"),
            ("TEFL_VULKAN_COOPMAT", "3"),
            ("TEFL_VULKAN_COOPMAT", "yes"),
            ("TEFL_VULKAN_PIPELINE_STATS", "on"),
            ("TEFL_VULKAN_GEMM_TILE", "128"),
            ("TEFL_VULKAN_GEMM_TILE", "ax128"),
            ("TEFL_VULKAN_GEMM_TILE", "128x128/"),
            ("TEFL_VULKAN_GEMM_TILE", "128x-1"),
            ("TEFL_VULKAN_GEMM_TILE", "0x128"),
            ("TEFL_HOST_CACHE_MB", "-1"),
            ("TEFL_HOST_CACHE_MB", "1048577"),
            ("TEFL_HOST_CACHE_MB", "1.5"),
            ("TEFL_HOST_CACHE_MB", "lots"),
        ] {
            match EnvConfig::from_lookup(&lookup(&[(var, val)])) {
                Err(Error::Config { variable, .. }) => assert_eq!(variable, var),
                other => panic!("{var}={val}: {other:?}"),
            }
        }
    }

    #[cfg(unix)]
    #[test]
    fn non_utf8_paths_are_accepted() {
        use std::os::unix::ffi::OsStringExt;
        let raw = OsString::from_vec(b"/tmp/caf\xe9".to_vec());
        let plugins = OsString::from_vec(b"/opt/p\xff/libp.so,q".to_vec());
        let (r, p) = (raw.clone(), plugins.clone());
        let get_os = move |k: &'static str| {
            Ok(match k {
                "TEFL_CACHE_DIR" => Some(r.clone()),
                "TE_FL_PLUGIN_MODULES" => Some(p.clone()),
                _ => None,
            })
        };
        let c = EnvConfig::from_lookups(&|_| Ok(None), &get_os).unwrap();
        assert_eq!(c.cache_dir, PathBuf::from(raw));
        assert_eq!(c.plugin_modules, vec![OsString::from_vec(b"/opt/p\xff/libp.so".to_vec()), "q".into()]);
    }

    #[test]
    fn override_applies_fields() {
        let mut p = SelectionPolicy::default();
        PolicyOverride::new()
            .prefer(Prefer::Reference)
            .strict(true)
            .deny_vendors(&["X"])
            .per_op("rmsnorm_fwd", "reference")
            .unwrap()
            .apply(&mut p);
        assert_eq!(p.prefer, Prefer::Reference);
        assert!(p.strict);
        assert_eq!(p.deny_vendors, vec!["x".to_string()]);
        assert_eq!(p.per_op["rmsnorm_fwd"], vec![Token::Reference]);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        #[test]
        fn no_input_panics(s in "\\PC{0,40}", t in "[a-z_:|;=,. -]{0,40}") {
            for var in ["TE_FL_PREFER", "TE_FL_PREFER_VENDOR", "TE_FL_STRICT", "TE_FL_ALLOW_VENDORS",
                        "TE_FL_DENY_VENDORS", "TE_FL_PER_OP", "TE_BACKEND", "TE_PLUGIN",
                        "TE_FALLBACK_BACKEND", "TE_FL_PLUGIN_MODULES", "TE_FL_SKIP_CUDA",
                        "TEFL_LOG_LEVEL", "TE_FL_DEBUG", "TEFL_AUTOTUNE", "TEFL_CACHE_DIR",
                        "TEFL_KERNEL_TIMING", "TEFL_ATTN_FWD_MIN_BLOCKS", "TEFL_ATTN_WGMMA",
                        "TEFL_COOPERATIVE", "TEFL_COMPILE_AHEAD", "TEFL_HOST_CACHE_MB"] {
                for v in [&s, &t] {
                    let vv = v.clone();
                    let get = move |k: &'static str| Ok(if k == var { Some(vv.clone()) } else { None });
                    let _ = EnvConfig::from_lookup(&get);
                }
            }
            let _ = parse_per_op("TE_FL_PER_OP", &format!("rmsnorm_fwd={t}"));
            let _ = parse_token("TE_FL_PER_OP", &s);
        }
    }
}
