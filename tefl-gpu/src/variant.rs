//! Kernel variants: a source, the defines one variant is compiled with, and the entry points
//! it may launch. Each op file builds its variants with one function, used by the launch and
//! by the test that compiles every variant, so the two cannot drift.

use tefl_kernels::{Source, Target};

/// The `#define`s of one kernel variant, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Defines(Vec<(&'static str, String)>);

impl Defines {
    /// No defines.
    pub fn new() -> Self {
        Defines(Vec::new())
    }

    /// Adds (or replaces) `name` with `value`.
    pub fn set(mut self, name: &'static str, value: impl ToString) -> Self {
        let value = value.to_string();
        match self.0.iter_mut().find(|(k, _)| *k == name) {
            Some(entry) => entry.1 = value,
            None => self.0.push((name, value)),
        }
        self
    }

    /// Adds `name` as 1 or 0.
    pub fn flag(self, name: &'static str, on: bool) -> Self {
        self.set(name, u8::from(on))
    }

    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str())
    }

    /// The pairs, in order.
    pub fn pairs(&self) -> &[(&'static str, String)] {
        &self.0
    }

    /// A compact key (`TX=bf16;BLOCK=256;`) for in-memory module caches.
    pub fn key(&self) -> String {
        self.0.iter().map(|(k, v)| format!("{k}={v};")).collect()
    }
}

/// One compiled form of a kernel source: the source, its defines and the entry points the
/// op launches from it (checked at launch and by the compile test).
#[derive(Clone, Debug)]
pub struct Variant {
    /// The source.
    pub source: &'static Source,
    /// The defines.
    pub defines: Defines,
    /// The `extern "C"` kernels the op launches from this variant.
    pub entries: &'static [&'static str],
}

impl Variant {
    /// `source` with `defines`, launching `entries`.
    pub fn new(source: &'static Source, entries: &'static [&'static str], defines: Defines) -> Self {
        Variant { source, defines, entries }
    }

    /// Whether `entry` is one of the variant's entry points.
    pub fn has_entry(&self, entry: &str) -> bool {
        self.entries.contains(&entry)
    }
}

/// The full text a run-time compiler sees for `variant` on `target`: the target's primitives,
/// the common prelude, the defines (after the prelude, so that a define named like a template
/// parameter, `T` or `D`, cannot reach it), the source's headers, then the source. `#line`
/// directives keep compiler messages pointing at the files under `tefl-kernels/src`.
pub fn full_source(target: Target, variant: &Variant) -> String {
    let src = variant.source;
    let mut s = String::with_capacity(
        target.primitives().text.len() + tefl_kernels::prelude::COMMON.text.len() + src.text.len() + 1024,
    );
    let mut file = |path: &str, text: &str| {
        s.push_str(&format!("#line 1 \"{path}\"\n"));
        s.push_str(text);
        if !text.ends_with('\n') {
            s.push('\n');
        }
    };
    file(target.primitives().path, target.primitives().text);
    file(tefl_kernels::prelude::COMMON.path, tefl_kernels::prelude::COMMON.text);
    let mut defines = String::new();
    for (k, v) in variant.defines.pairs() {
        defines.push_str(&format!("#undef {k}\n#define {k} {v}\n"));
    }
    file("<defines>", &defines);
    for h in src.headers {
        file(h.path, h.text);
    }
    file(src.path, src.text);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defines_replace_and_keep_order() {
        let d = Defines::new().set("TX", "bf16").set("BLOCK", 256).set("TX", "f16").flag("FUSED", true);
        assert_eq!(d.pairs(), &[("TX", "f16".to_string()), ("BLOCK", "256".to_string()), ("FUSED", "1".to_string())]);
        assert_eq!(d.get("BLOCK"), Some("256"));
        assert_eq!(d.key(), "TX=f16;BLOCK=256;FUSED=1;");
    }

    #[test]
    fn full_source_orders_prelude_defines_headers_source() {
        let v = Variant::new(&tefl_kernels::ATTENTION_CUDA, &["attn_fwd"], Defines::new().set("T", "bf16"));
        let text = full_source(Target::Cuda, &v);
        let at = |needle: &str| text.find(needle).unwrap_or_else(|| panic!("{needle} missing"));
        assert!(at("#define WARP_SIZE 32") < at("prelude/common.h"));
        assert!(at("prelude/common.h") < at("#define T bf16"));
        assert!(at("#define T bf16") < at("shared/attention_mask.h"));
        assert!(at("shared/attention_mask.h") < at("cuda/attention/attention.cu"));
        let hip = full_source(Target::Hip, &Variant::new(&tefl_kernels::NORM, &[], Defines::new()));
        // HIP's wavefront width comes from the compiler options (the device's), not the text.
        assert!(hip.contains("#define WARP_SIZE TEFL_WAVE_SIZE") && !hip.contains("#define WARP_SIZE 32"));
    }
}
