//! Compiles the WGSL shaders of `shaders/` to SPIR-V 1.3 with naga, one module per variant
//! (the dtype codes and workgroup size a variant bakes in as constants), and writes
//! `$OUT_DIR/shaders.rs`: the table `SHADERS` of (variant name, SPIR-V bytes) the backend
//! loads from. A shader that naga rejects fails the build with naga's message.

#[path = "build/cm2.rs"]
mod cm2;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The dtype codes of `common.wgsl`.
const DTYPES: [(&str, u32); 3] = [("f32", 0), ("f16", 1), ("bf16", 2)];
/// The FP8 formats and their mantissa bits (`fp8_codes.wgsl`).
const FP8_FORMATS: [(&str, u32); 2] = [("e4m3", 3), ("e5m2", 2)];
/// The workgroup sizes every elementwise variant is built for (the tune configs pick one).
const WORKGROUPS: [u32; 3] = [64, 128, 256];
/// The largest head dims attention variants are built for (a call takes the smallest that fits).
const ATTN_HEAD_DIMS: [u32; 4] = [32, 64, 128, 256];
/// Query (or key) rows per attention workgroup, one per invocation.
const ATTN_ROWS: u32 = 64;
/// The attention stages with a head-dim bucket and the files each is made of.
const ATTN_STAGES: [(&str, &[&str]); 3] = [
    ("attn_fwd", &["philox.wgsl", "attn_common.wgsl", "attn_rows.wgsl", "attn_fwd.wgsl"]),
    ("attn_dq", &["philox.wgsl", "attn_common.wgsl", "attn_rows.wgsl", "attn_dq.wgsl"]),
    ("attn_dkdv", &["philox.wgsl", "attn_common.wgsl", "attn_rows.wgsl", "attn_dkdv.wgsl"]),
];

/// The attention stages on cooperative matrices and the files each is made of.
const ATTN_COOP_STAGES: [(&str, &[&str]); 3] = [
    ("attn_fwd_coop", &["philox.wgsl", "attn_common.wgsl", "attn_coop.wgsl", "attn_fwd_coop.wgsl"]),
    ("attn_dq_coop", &["philox.wgsl", "attn_common.wgsl", "attn_coop.wgsl", "attn_dq_coop.wgsl"]),
    ("attn_dkdv_coop", &["philox.wgsl", "attn_common.wgsl", "attn_coop.wgsl", "attn_dkdv_coop.wgsl"]),
];

/// The subgroup grids (along m, along n) the cooperative-matrix GEMM is built for: each
/// subgroup computes 64×64 of the product, so a workgroup 64·SGM × 64·SGN.
const GEMM_COOP_GRIDS: [(u32, u32); 3] = [(2, 2), (2, 4), (4, 2)];
/// Tile rows per raster group the cooperative-matrix GEMM is built for (1 = plain row order).
const GEMM_COOP_RASTER_GROUPS: [u32; 2] = [1, 8];

/// A variant: the shader, the files it is made of after `common.wgsl` (in order), and its
/// constants, in order (`name=value`).
struct Variant {
    shader: &'static str,
    /// `enable` directives (they must open the module).
    header: &'static str,
    files: &'static [&'static str],
    consts: Vec<(&'static str, String, u32)>,
}

impl Variant {
    /// `activation.tx=f16.tg=f32.wg=256`: the name the backend looks a module up by.
    fn name(&self) -> String {
        let mut s = self.shader.to_string();
        for (k, shown, _) in &self.consts {
            let _ = write!(s, ".{}={shown}", k.to_ascii_lowercase());
        }
        s
    }

    /// The WGSL constants prepended to `common.wgsl` and the shader.
    fn prelude(&self) -> String {
        self.consts.iter().map(|(k, _, v)| format!("const {k}: u32 = {v}u;\n")).collect()
    }
}

fn variants() -> Vec<Variant> {
    let mut v = Vec::new();
    for (tx, cx) in DTYPES {
        for (tg, cg) in DTYPES {
            for wg in WORKGROUPS {
                let consts = vec![("TX", tx.into(), cx), ("TG", tg.into(), cg), ("WG", wg.to_string(), wg)];
                v.push(Variant {
                    shader: "activation",
                    header: "",
                    files: &["act_fns.wgsl", "activation_params.wgsl", "activation.wgsl"],
                    consts: consts.clone(),
                });
                v.push(Variant {
                    shader: "activation_dbias",
                    header: "",
                    files: &["act_fns.wgsl", "activation_dbias.wgsl"],
                    consts: consts.clone(),
                });
                v.push(Variant {
                    shader: "softmax",
                    header: "",
                    files: &["rows.wgsl", "softmax_params.wgsl", "softmax.wgsl"],
                    consts,
                });
            }
        }
    }
    for (tx, cx) in DTYPES {
        for wg in WORKGROUPS {
            v.push(Variant {
                shader: "rope",
                header: "",
                files: &["rope_params.wgsl", "rope.wgsl"],
                consts: vec![("TX", tx.into(), cx), ("WG", wg.to_string(), wg)],
            });
            if tx != "f32" {
                v.push(Variant {
                    shader: "rope_vec",
                    header: "",
                    files: &["rope_params.wgsl", "vec8.wgsl", "rope_vec.wgsl"],
                    consts: vec![("TX", tx.into(), cx), ("WG", wg.to_string(), wg)],
                });
            }
            v.push(Variant {
                shader: "fp8",
                header: "",
                files: &["fp8_codes.wgsl", "fp8.wgsl"],
                consts: vec![("TX", tx.into(), cx), ("WG", wg.to_string(), wg)],
            });
            v.push(Variant {
                shader: "dropout",
                header: "",
                files: &["philox.wgsl", "dropout.wgsl"],
                consts: vec![("TX", tx.into(), cx), ("WG", wg.to_string(), wg)],
            });
        }
    }
    for (tx, cx) in DTYPES {
        v.push(Variant {
            shader: "gemm",
            header: "",
            files: &["gemm_params.wgsl", "gemm_tiles.wgsl", "gemm.wgsl"],
            consts: vec![("TX", tx.into(), cx), ("WG", "256".into(), 256)],
        });
    }
    // The product of FP8 inputs, per pair of formats (by their mantissa bits).
    for (fa, ma) in FP8_FORMATS {
        for (fb, mb) in FP8_FORMATS {
            v.push(Variant {
                shader: "gemm_fp8",
                header: "",
                files: &["gemm_params.wgsl", "gemm_tiles.wgsl", "fp8_codes.wgsl", "gemm_fp8.wgsl"],
                consts: vec![("FA", fa.into(), ma), ("FB", fb.into(), mb), ("WG", "256".into(), 256)],
            });
        }
    }
    // The product on cooperative matrices, for 16-bit inputs, per pair of transposes (bf16:
    // the f16 module retyped, see `retype_coop_operands`), subgroup grid, raster group (the
    // `gemm_coop` tune configs choose; ops/gemm.rs names the same values) and output (W, or a
    // D of either 16-bit dtype).
    for (tx, cx) in [("f16", 1), ("bf16", 2)] {
        for (ta, tb) in [(0u32, 0u32), (0, 1), (1, 0), (1, 1)] {
            for (sgm, sgn) in GEMM_COOP_GRIDS {
                for gm in GEMM_COOP_RASTER_GROUPS {
                    for (out, co) in [("w", 0), ("f16", 1), ("bf16", 2)] {
                        v.push(Variant {
                            shader: "gemm_coop",
                            header: "enable f16;\nenable wgpu_cooperative_matrix;\n",
                            files: &["gemm_params.wgsl", "gemm_coop.wgsl"],
                            consts: vec![
                                ("TX", tx.into(), cx),
                                ("TA", ta.to_string(), ta),
                                ("TB", tb.to_string(), tb),
                                ("SGM", sgm.to_string(), sgm),
                                ("SGN", sgn.to_string(), sgn),
                                ("GM", gm.to_string(), gm),
                                ("OUT", out.into(), co),
                            ],
                        });
                    }
                }
            }
        }
    }
    // The attention stages on cooperative matrices, per 16-bit dtype and head dim (64 or 128,
    // exactly), 64 query rows per workgroup (ops/attention.rs names the same values).
    for (tx, cx) in [("f16", 1), ("bf16", 2)] {
        for dm in [64u32, 128] {
            for (shader, files) in ATTN_COOP_STAGES {
                v.push(Variant {
                    shader,
                    header: "enable f16;\nenable wgpu_cooperative_matrix;\n",
                    files,
                    consts: vec![
                        ("TX", tx.into(), cx),
                        ("DM", dm.to_string(), dm),
                        ("BR", ATTN_ROWS.to_string(), ATTN_ROWS),
                    ],
                });
            }
        }
    }
    // Attention: each stage per dtype and largest head dim, BR rows per workgroup
    // (ops/attention.rs names the same values).
    for (tx, cx) in DTYPES {
        for dm in ATTN_HEAD_DIMS {
            for (shader, files) in ATTN_STAGES {
                v.push(Variant {
                    shader,
                    header: "",
                    files,
                    consts: vec![
                        ("TX", tx.into(), cx),
                        ("DM", dm.to_string(), dm),
                        ("BR", ATTN_ROWS.to_string(), ATTN_ROWS),
                    ],
                });
            }
        }
        v.push(Variant {
            shader: "attn_delta",
            header: "",
            files: &["attn_delta.wgsl"],
            consts: vec![("TX", tx.into(), cx), ("WG", "256".into(), 256)],
        });
    }
    v.push(Variant { shader: "copy", header: "", files: &["copy.wgsl"], consts: vec![("WG", "256".into(), 256)] });
    for wg in WORKGROUPS {
        v.push(Variant {
            shader: "optimizer",
            header: "",
            files: &["rows.wgsl", "optimizer.wgsl"],
            consts: vec![("WG", wg.to_string(), wg)],
        });
        v.push(Variant {
            shader: "norm",
            header: "",
            files: &["rows.wgsl", "norm_params.wgsl", "norm.wgsl"],
            consts: vec![("WG", wg.to_string(), wg)],
        });
        for (tx, cx) in [("f16", 1), ("bf16", 2)] {
            // One per activation (the codes of activation_params.wgsl's `act`, 0 to 5).
            for act in 0..=5u32 {
                v.push(Variant {
                    shader: "activation_vec",
                    header: "",
                    files: &["act_fns.wgsl", "activation_params.wgsl", "vec8.wgsl", "activation_vec.wgsl"],
                    consts: vec![("TX", tx.into(), cx), ("ACT", act.to_string(), act), ("WG", wg.to_string(), wg)],
                });
            }
            v.push(Variant {
                shader: "softmax_vec",
                header: "",
                files: &["softmax_params.wgsl", "vec8.wgsl", "wg_reduce.wgsl", "softmax_vec.wgsl"],
                consts: vec![("TX", tx.into(), cx), ("WG", wg.to_string(), wg)],
            });
        }
        // The 16-byte paths of the row-wise shaders.
        for (tx, cx) in [("f16", 1), ("bf16", 2)] {
            for bwd in [0u32, 1, 2] {
                v.push(Variant {
                    shader: "norm_vec",
                    header: "",
                    files: &["norm_params.wgsl", "vec8.wgsl", "wg_reduce.wgsl", "norm_vec.wgsl"],
                    consts: vec![("TX", tx.into(), cx), ("BWD", bwd.to_string(), bwd), ("WG", wg.to_string(), wg)],
                });
            }
        }
    }
    v
}

/// The module's SPIR-V words and the bytes of workgroup memory it declares (the sum of its
/// `var<workgroup>` sizes).
fn compile(name: &str, text: &str) -> (Vec<u32>, u32) {
    let module = naga::front::wgsl::parse_str(text)
        .unwrap_or_else(|e| panic!("{name}: WGSL does not parse:\n{}", e.emit_to_string(text)));
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
        .validate(&module)
        .unwrap_or_else(|e| panic!("{name}: WGSL does not validate:\n{}", e.emit_to_string(text)));
    // No 16-bit inputs or outputs between stages exist in compute shaders; naga would otherwise
    // declare StorageInputOutput16, which drivers without it reject. Loops are not given naga's
    // extra iteration counters: every loop here is bounded by its sizes, and the counters keep
    // drivers from unrolling (private arrays then go to memory). Workgroup memory is not
    // zero-initialised, as WGSL would have it: naga's polyfill for that has one invocation of
    // every workgroup store zeros over all of the workgroup's memory before a barrier, which
    // cost the 24 KB GEMM tile about 30 µs a workgroup on the H200 (2026-12-02, alternating in
    // one run: bf16 4096³ 0.823 → 0.707–0.710 ms, 8192³ 5.77 → 5.37–5.38, attention causal
    // b4 h32 s4096 d128 forward 9.16 → 8.69, backward 31.56 → 28.80). Every shader here writes
    // its workgroup memory before it reads it (README, "Vulkan backend"); a new one must too.
    let options = naga::back::spv::Options {
        lang_version: (1, 3),
        use_storage_input_output_16: false,
        force_loop_bounding: false,
        zero_initialize_workgroup_memory: naga::back::spv::ZeroInitializeWorkgroupMemoryMode::None,
        ..Default::default()
    };
    let pipeline =
        naga::back::spv::PipelineOptions { shader_stage: naga::ShaderStage::Compute, entry_point: "main".into() };
    let words = naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline))
        .unwrap_or_else(|e| panic!("{name}: SPIR-V output failed: {e}"));
    let shared = module
        .global_variables
        .iter()
        .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
        .map(|(_, g)| module.types[g.ty].inner.size(module.to_ctx()))
        .sum();
    (words, shared)
}

/// SPIR-V opcodes and operands `mark_bfloat16` reads or writes.
const OP_EXTENSION: u32 = 10;
const OP_CAPABILITY: u32 = 17;
const OP_TYPE_FLOAT: u32 = 22;
/// Capabilities of SPV_KHR_bfloat16: BFloat16TypeKHR, BFloat16CooperativeMatrixKHR.
const BFLOAT16_CAPABILITIES: [u32; 2] = [5116, 5118];
/// The FP encoding operand of OpTypeFloat that makes a 16-bit float bfloat16.
const FP_ENCODING_BFLOAT16: u32 = 0;

/// Appends SPV_KHR_bfloat16's capabilities and its extension (where the module's capabilities end).
fn declare_bfloat16(out: &mut Vec<u32>) {
    for cap in BFLOAT16_CAPABILITIES {
        out.extend([(2 << 16) | OP_CAPABILITY, cap]);
    }
    let text = cm2::string("SPV_KHR_bfloat16");
    out.push(((1 + text.len() as u32) << 16) | OP_EXTENSION);
    out.extend(text);
}

/// Words before a module's first instruction.
const HEADER: usize = 5;

/// The word ranges of a module's instructions, in order. Panics (failing the build) where a
/// word count is zero or runs past the module.
fn instructions(name: &str, words: &[u32]) -> Vec<std::ops::Range<usize>> {
    let mut spans = Vec::new();
    let mut at = HEADER;
    while at < words.len() {
        let count = (words[at] >> 16) as usize;
        assert!(count > 0 && at + count <= words.len(), "{name}: malformed SPIR-V at word {at}");
        spans.push(at..at + count);
        at += count;
    }
    spans
}

/// Turns a module whose only 16-bit float type is the element type of its cooperative matrices
/// into the same module on bfloat16 (SPV_KHR_bfloat16): the type gets the BFloat16KHR encoding,
/// and the capabilities and extension are declared. Panics (failing the build) when the module
/// does not have exactly one 16-bit float type.
fn mark_bfloat16(name: &str, words: &mut Vec<u32>) {
    let mut out = words[..HEADER].to_vec();
    let mut declared = false;
    let mut retyped = 0;
    for span in instructions(name, words) {
        let inst = &words[span];
        let (count, opcode) = (inst.len(), inst[0] & 0xFFFF);
        if !declared && opcode != OP_CAPABILITY {
            // After the last capability: the new capabilities, then the extension.
            declare_bfloat16(&mut out);
            declared = true;
        }
        if opcode == OP_TYPE_FLOAT && count == 3 && inst[2] == 16 {
            out.extend([(4 << 16) | OP_TYPE_FLOAT, inst[1], 16, FP_ENCODING_BFLOAT16]);
            retyped += 1;
        } else {
            out.extend_from_slice(inst);
        }
    }
    assert_eq!(retyped, 1, "{name}: expected one 16-bit float type to mark bfloat16");
    *words = out;
}

/// SPIR-V opcodes and capabilities `retype_coop_operands` reads or writes.
const OP_CONSTANT: u32 = 43;
const OP_TYPE_COOPERATIVE_MATRIX: u32 = 4456;
const CAPABILITY_FLOAT16: u32 = 9;

/// Retypes the A and B cooperative matrices of a module (declared with f32 components, the
/// type naga gives a matrix loaded through an f32 pointer) to a new 16-bit float type: IEEE
/// half, or bfloat16 (SPV_KHR_bfloat16) when `bf16`. The loads then reinterpret the 16-byte
/// units of the shared tiles as 16-bit elements, as SPV_KHR_cooperative_matrix allows. Panics
/// (failing the build) when the module already has a 16-bit float type or no A/B matrix types.
fn retype_coop_operands(name: &str, words: &mut Vec<u32>, bf16: bool) {
    let half = words[3];
    let mut out = words[..HEADER].to_vec();
    out[3] = half + 1;
    let mut constants = std::collections::HashMap::new();
    let (mut declared, mut typed, mut retyped, mut has_float16) = (false, false, 0, false);
    for span in instructions(name, words) {
        let inst = &words[span];
        let (count, opcode) = (inst.len(), inst[0] & 0xFFFF);
        if opcode == OP_CAPABILITY && inst[1] == CAPABILITY_FLOAT16 {
            has_float16 = true;
        }
        if !declared && opcode != OP_CAPABILITY {
            // After the last capability: the new type's capabilities (and extension).
            if bf16 {
                declare_bfloat16(&mut out);
            } else if !has_float16 {
                out.extend([(2 << 16) | OP_CAPABILITY, CAPABILITY_FLOAT16]);
            }
            declared = true;
        }
        assert!(!(opcode == OP_TYPE_FLOAT && inst[2] == 16), "{name}: the module already has a 16-bit float type");
        if opcode == OP_CONSTANT && count == 4 {
            constants.insert(inst[2], inst[3]);
        }
        if opcode == OP_TYPE_COOPERATIVE_MATRIX && count == 7 {
            if !typed {
                if bf16 {
                    out.extend([(4 << 16) | OP_TYPE_FLOAT, half, 16, FP_ENCODING_BFLOAT16]);
                } else {
                    out.extend([(3 << 16) | OP_TYPE_FLOAT, half, 16]);
                }
                typed = true;
            }
            // Use: 0 MatrixAKHR, 1 MatrixBKHR, 2 MatrixAccumulatorKHR.
            if matches!(constants.get(&inst[6]), Some(0 | 1)) {
                out.extend([inst[0], inst[1], half, inst[3], inst[4], inst[5], inst[6]]);
                retyped += 1;
                continue;
            }
        }
        out.extend_from_slice(inst);
    }
    assert_eq!(retyped, 2, "{name}: expected one A and one B cooperative matrix type");
    *words = out;
}

/// SPIR-V opcodes and scopes `widen_subgroup_barriers` reads.
const OP_CONTROL_BARRIER: u32 = 224;
const SCOPE_WORKGROUP: u32 = 2;
const SCOPE_SUBGROUP: u32 = 3;

/// Gives each subgroup-scope `OpControlBarrier` (WGSL's `subgroupBarrier()`) the memory
/// semantics of the module's workgroup barriers (acquire-release on workgroup memory) in place of
/// naga's SubgroupMemory, which orders no storage class Vulkan has: the barrier then makes one
/// subgroup's stores to workgroup memory visible to its other invocations, which is what the
/// shaders use it for. Panics (failing the build) when a module has subgroup barriers but no
/// workgroup barrier to take the semantics from.
fn widen_subgroup_barriers(name: &str, words: &mut [u32]) {
    let mut constants = std::collections::HashMap::new();
    let (mut subgroup, mut workgroup_semantics) = (Vec::new(), None);
    for span in instructions(name, words) {
        let at = span.start;
        let (count, opcode) = (span.len(), words[at] & 0xFFFF);
        if opcode == OP_CONSTANT && count == 4 {
            constants.insert(words[at + 2], words[at + 3]);
        }
        if opcode == OP_CONTROL_BARRIER && count == 4 {
            match constants.get(&words[at + 1]) {
                Some(&SCOPE_SUBGROUP) => subgroup.push(at),
                Some(&SCOPE_WORKGROUP) => workgroup_semantics = Some(words[at + 3]),
                _ => {}
            }
        }
    }
    if subgroup.is_empty() {
        return;
    }
    let semantics =
        workgroup_semantics.unwrap_or_else(|| panic!("{name}: subgroup barriers but no workgroup barrier to copy"));
    for at in subgroup {
        words[at + 3] = semantics;
    }
}

fn main() {
    let dir = Path::new("shaders");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=shaders");
    let read = |f: &str| {
        let p = dir.join(f);
        println!("cargo:rerun-if-changed={}", p.display());
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let common = read("common.wgsl");
    let mut table = String::from("/// Every shader variant: its name and its SPIR-V (little-endian words).\n");
    table.push_str("pub static SHADERS: &[(&str, &[u8])] = &[\n");
    let mut shared_table =
        String::from("/// The workgroup memory each WGSL module declares, in bytes (build.rs, from naga).\n");
    shared_table.push_str("pub static SHARED_BYTES: &[(&str, u32)] = &[\n");
    for v in variants() {
        let name = v.name();
        let mut text = format!("{}{}{common}\n", v.header, v.prelude());
        for f in v.files {
            text.push_str(&read(f));
            text.push('\n');
        }
        let (mut words, shared) = compile(&name, &text);
        widen_subgroup_barriers(&name, &mut words);
        let _ = writeln!(shared_table, "    ({name:?}, {shared}),");
        if v.shader == "gemm_coop" {
            retype_coop_operands(&name, &mut words, name.contains(".tx=bf16."));
        } else if v.shader.starts_with("attn_") && v.shader.ends_with("_coop") && name.contains(".tx=bf16.") {
            mark_bfloat16(&name, &mut words);
        }
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let file = out.join(format!("{name}.spv"));
        std::fs::write(&file, bytes).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let _ = writeln!(table, "    ({name:?}, include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{name}.spv\"))),");
    }
    // The product on workgroup-scope cooperative matrices, assembled (build/cm2.rs).
    println!("cargo:rerun-if-changed=build");
    for v in cm2::Cm2::all() {
        let name = v.name();
        let bytes: Vec<u8> = v.assemble().iter().flat_map(|w| w.to_le_bytes()).collect();
        let file = out.join(format!("{name}.spv"));
        std::fs::write(&file, bytes).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let _ = writeln!(table, "    ({name:?}, include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{name}.spv\"))),");
    }
    table.push_str("];\n");
    shared_table.push_str("];\n");
    table.push_str(&shared_table);
    std::fs::write(out.join("shaders.rs"), table).expect("write shaders.rs");
}
