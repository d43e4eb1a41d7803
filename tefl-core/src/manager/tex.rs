//! TEX-style whole-backend selection: `list_backends`, `get_backend`, `set_backend`.

use crate::device::{read_lock, write_lock};
use crate::{Error, Result};

use super::{LOG, Manager};

/// A whole backend, as the TEX interface lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendInfo {
    /// The name (`nvidia`, `vulkan`, `reference`, or an out-of-tree vendor's).
    pub name: String,
    /// The vendor's registered name, when it registered a `VendorInfo`.
    pub vendor: Option<String>,
    /// The highest priority among its impls.
    pub priority: i32,
    /// Whether its driver is usable here.
    pub available: bool,
    /// Why not, when it is not.
    pub unavailable_reason: Option<String>,
    /// Whether it is the backend `get_backend` reports.
    pub current: bool,
    /// How many impls it registers.
    pub impls: usize,
}

impl Manager {
    /// Every backend: registered vendors, the backends of registered impls, and `reference`.
    pub fn list_backends(&self) -> Vec<BackendInfo> {
        let reg = read_lock(&self.registry);
        let policy = self.effective_policy();
        let mut names: Vec<String> = reg.vendors().map(|v| v.vendor_name.to_ascii_lowercase()).collect();
        names.extend(reg.all_impls().map(|i| i.backend_name().to_ascii_lowercase()));
        names.push("reference".into());
        names.sort();
        names.dedup();
        let mut infos: Vec<BackendInfo> = names
            .into_iter()
            .map(|name| {
                let impls: Vec<_> = reg.all_impls().filter(|i| i.backend_name().eq_ignore_ascii_case(&name)).collect();
                let vendor = reg.vendor(&name);
                let check = match vendor {
                    Some(v) => v.check_available(),
                    None if name == "reference" || impls.iter().any(|i| i.check_available().is_ok()) => Ok(()),
                    None => Err("none of its impls is available".to_string()),
                };
                let (available, unavailable_reason) = match check {
                    Ok(()) => (true, None),
                    Err(r) => (false, Some(r)),
                };
                BackendInfo {
                    vendor: vendor.map(|v| v.vendor_name.clone()),
                    priority: impls.iter().map(|i| i.get_priority()).max().unwrap_or(0),
                    available,
                    unavailable_reason,
                    current: false,
                    impls: impls.len(),
                    name,
                }
            })
            .collect();
        let current = match &policy.backend {
            Some(b) => Some(b.clone()),
            None => {
                // Automatic: the best available backend in preference order.
                let kind_of = |b: &BackendInfo| {
                    reg.all_impls().find(|i| i.backend_name().eq_ignore_ascii_case(&b.name)).map(|i| i.kind())
                };
                policy
                    .prefer
                    .order()
                    .iter()
                    .find_map(|k| {
                        infos
                            .iter()
                            .filter(|b| b.available && kind_of(b) == Some(*k))
                            .max_by_key(|b| b.priority)
                            .map(|b| b.name.clone())
                    })
                    .or(Some("reference".into()))
            }
        };
        for b in &mut infos {
            b.current = current.as_deref() == Some(b.name.as_str());
        }
        infos
    }

    /// The backend in use: the forced one, or the best available under the preference.
    pub fn get_backend(&self) -> BackendInfo {
        let list = self.list_backends();
        list.iter().find(|b| b.current).cloned().unwrap_or_else(|| {
            let name = self.effective_policy().backend.unwrap_or_else(|| "reference".into());
            BackendInfo {
                name,
                vendor: None,
                priority: 0,
                available: false,
                unavailable_reason: Some("not registered in this build".into()),
                current: true,
                impls: 0,
            }
        })
    }

    /// Forces one whole backend (`torch` means `reference`; `auto` returns to automatic
    /// selection). Ops it lacks, or that fail, go to `TE_FALLBACK_BACKEND`.
    pub fn set_backend(&self, name: &str) -> Result<()> {
        let lower = name.trim().to_ascii_lowercase();
        let mut policy = self.policy();
        if lower == "auto" {
            policy.backend = None;
        } else {
            let parsed = crate::policy::parse_backend_name("set_backend", &lower)?;
            let list = self.list_backends();
            let Some(info) = list.iter().find(|b| b.name == parsed) else {
                return Err(Error::BackendNotFound {
                    name: name.to_string(),
                    available: list.into_iter().map(|b| b.name).collect(),
                });
            };
            if !info.available {
                tracing::warn!(target: LOG, "Backend '{parsed}' is not available here; its ops will go to '{}'", policy.fallback_backend);
            }
            policy.backend = Some(parsed);
        }
        *write_lock(&self.policy) = policy;
        self.bump();
        Ok(())
    }
}
