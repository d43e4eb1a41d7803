//! `generic_gemm`'s product on NVIDIA's workgroup-scope cooperative matrices
//! (`SPV_NV_cooperative_matrix2` with `SPV_NV_tensor_addressing`), assembled here as SPIR-V 1.6
//! words: WGSL (naga) has no way to spell workgroup-scope matrices or tensor layouts.
//!
//! One workgroup computes a BM×BN tile of the product: per k step it loads the next step's
//! BM×BK tile of op(A) and BK×BN tile of op(B) straight from the storage buffers through tensor
//! layouts (the driver stages them through shared memory itself, which is the point of the
//! extension), multiplies this step's into a BM×BN f32 accumulator, and at the end stores
//! alpha·accumulator through a tensor layout: to W (f32, binding 2) or to D in its 16-bit
//! dtype (binding 6). The layouts clamp: elements outside the operands read as 0 and stores
//! outside D are dropped, so edge tiles need no code of their own. A transposed operand is
//! read through a tensor view that swaps its two dimensions.
//!
//! BM, BN, BK and the workgroup size are specialization constants 0–3, set by the backend
//! from the device's flexible-dimension granularities and its tune configs.
//!
//! Measured on the H200 (2026-11-26, bf16, same run): 4096³ 0.877 ms and 8192³ 6.76 ms with
//! 128×256×32 tiles (the fastest of six the autotuner timed; 256 invocations, the shape the
//! driver lists with f32 accumulation), against 0.847 and 5.83 ms for the subgroup-scope
//! `gemm_coop.wgsl`, so it runs only when `TEFL_VULKAN_COOPMAT=2` asks for it.

use spirv::{Capability, Op};

/// Specialization constant ids of the module (the backend's `ops/gemm.rs` sets them).
pub const SPEC_BM: u32 = 0;
pub const SPEC_BN: u32 = 1;
pub const SPEC_BK: u32 = 2;
pub const SPEC_WG: u32 = 3;

/// The binding of the f32 product W and of the 16-bit D (`gemm_params.wgsl`'s bindings).
const BINDING_W: u32 = 2;
const BINDING_D: u32 = 6;

/// Indices of the push-constant fields this module reads (`gemm_params.wgsl`'s Params:
/// thirteen u32 fields, then alpha; each 4 bytes).
const PUSH_FIELDS: u32 = 14;
const FIELD_M: u32 = 1;
const FIELD_N: u32 = 2;
const FIELD_K: u32 = 3;
// The module indexes those fields with its constants 1, 2 and 3.
const _: () = assert!(FIELD_M == 1 && FIELD_N == 2 && FIELD_K == 3);
const FIELD_ALPHA: u32 = 13;

/// Where the product goes.
#[derive(Clone, Copy, PartialEq)]
pub enum Out {
    /// W, f32, binding 2.
    W,
    /// D as f16, binding 6.
    F16,
    /// D as bf16, binding 6.
    Bf16,
}

/// One module: 16-bit input dtype (bf16 or f16), transposes of A and B, and output.
pub struct Cm2 {
    pub bf16: bool,
    pub ta: bool,
    pub tb: bool,
    pub out: Out,
}

impl Cm2 {
    /// Every variant the backend may ask for.
    pub fn all() -> Vec<Cm2> {
        let mut v = Vec::new();
        for bf16 in [false, true] {
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                for out in [Out::W, Out::F16, Out::Bf16] {
                    v.push(Cm2 { bf16, ta, tb, out });
                }
            }
        }
        v
    }

    /// `gemm_cm2.tx=bf16.ta=0.tb=1.out=f16`: the name the backend looks the module up by.
    pub fn name(&self) -> String {
        let out = match self.out {
            Out::W => "w",
            Out::F16 => "f16",
            Out::Bf16 => "bf16",
        };
        format!(
            "gemm_cm2.tx={}.ta={}.tb={}.out={out}",
            if self.bf16 { "bf16" } else { "f16" },
            u8::from(self.ta),
            u8::from(self.tb)
        )
    }

    /// The module's words.
    pub fn assemble(&self) -> Vec<u32> {
        let mut a = Asm::default();
        let bf16_used = self.bf16 || self.out == Out::Bf16;
        for cap in [
            Capability::Shader,
            Capability::Float16,
            Capability::StorageBuffer16BitAccess,
            Capability::VulkanMemoryModel,
            Capability::CooperativeMatrixKHR,
            Capability::CooperativeMatrixTensorAddressingNV,
            Capability::TensorAddressingNV,
        ] {
            a.caps.op(Op::Capability, &[cap as u32]);
        }
        if bf16_used {
            a.caps.op(Op::Capability, &[Capability::BFloat16TypeKHR as u32]);
            a.caps.op(Op::Capability, &[Capability::BFloat16CooperativeMatrixKHR as u32]);
        }
        let mut exts = vec!["SPV_KHR_cooperative_matrix", "SPV_NV_cooperative_matrix2", "SPV_NV_tensor_addressing"];
        if bf16_used {
            exts.push("SPV_KHR_bfloat16");
        }
        for e in exts {
            let s = string(e);
            a.caps.op(Op::Extension, &s);
        }
        // Logical addressing, Vulkan memory model.
        a.caps.op(Op::MemoryModel, &[0, 3]);

        // Types.
        let t_void = a.ty(Op::TypeVoid, &[]);
        let t_fn = a.ty(Op::TypeFunction, &[t_void]);
        let t_bool = a.ty(Op::TypeBool, &[]);
        let t_u32 = a.ty(Op::TypeInt, &[32, 0]);
        let t_f32 = a.ty(Op::TypeFloat, &[32]);
        let t_f16 = a.ty(Op::TypeFloat, &[16]);
        // OpTypeFloat's FP encoding operand 0 = BFloat16KHR.
        let t_bf16 = if bf16_used { Some(a.ty(Op::TypeFloat, &[16, 0])) } else { None };
        let t_in = if self.bf16 { t_bf16.unwrap_or(t_f16) } else { t_f16 };
        let t_v3 = a.ty(Op::TypeVector, &[t_u32, 3]);
        let c = |a: &mut Asm, v: u32| a.constant(t_u32, v);
        let c0 = c(&mut a, 0);
        let c1 = c(&mut a, 1);
        let c2 = c(&mut a, 2);
        let c3 = c(&mut a, 3);
        let (c_m, c_n, c_k, c_alpha) = (c1, c2, c3, c(&mut a, FIELD_ALPHA));
        let f0 = a.constant(t_f32, 0);
        let h0 = a.constant(t_in, 0);
        // Specialization constants: BM, BN, BK (defaults 128, 128, 32) and the workgroup size.
        let bm = a.spec(t_u32, 128, SPEC_BM);
        let bn = a.spec(t_u32, 128, SPEC_BN);
        let bk = a.spec(t_u32, 32, SPEC_BK);
        let wg = a.spec(t_u32, 256, SPEC_WG);

        // Scope Workgroup = 2; use A = 0, B = 1, Accumulator = 2.
        let scope = c2;
        let t_ma = a.ty(Op::TypeCooperativeMatrixKHR, &[t_in, scope, bm, bk, c0]);
        let t_mb = a.ty(Op::TypeCooperativeMatrixKHR, &[t_in, scope, bk, bn, c1]);
        let t_acc = a.ty(Op::TypeCooperativeMatrixKHR, &[t_f32, scope, bm, bn, c2]);
        // Two-dimensional layouts, clamp mode Constant (1): outside reads as 0.
        let t_layout = a.ty(Op::TypeTensorLayoutNV, &[c2, c1]);
        let f = a.constant_false(t_bool);
        let t_view = a.ty(Op::TypeTensorViewNV, &[c2, f, c1, c0]);

        // Push constants: the Params block (thirteen u32, then alpha).
        let mut members = vec![t_u32; PUSH_FIELDS as usize];
        members[FIELD_ALPHA as usize] = t_f32;
        let t_params = a.ty(Op::TypeStruct, &members);
        a.deco.op(Op::Decorate, &[t_params, spirv::Decoration::Block as u32]);
        for i in 0..PUSH_FIELDS {
            a.deco.op(Op::MemberDecorate, &[t_params, i, spirv::Decoration::Offset as u32, 4 * i]);
        }
        let sc_push = spirv::StorageClass::PushConstant as u32;
        let t_p_params = a.ty(Op::TypePointer, &[sc_push, t_params]);
        let t_p_push_u32 = a.ty(Op::TypePointer, &[sc_push, t_u32]);
        let t_p_push_f32 = a.ty(Op::TypePointer, &[sc_push, t_f32]);
        let params = a.global(t_p_params, sc_push);

        // Storage buffers: A (0), B (1), and the output.
        let (t_out, binding_out) = match self.out {
            Out::W => (t_f32, BINDING_W),
            Out::F16 => (t_f16, BINDING_D),
            Out::Bf16 => (t_bf16.unwrap_or(t_f16), BINDING_D),
        };
        let t_acc_out = (self.out != Out::W).then(|| a.ty(Op::TypeCooperativeMatrixKHR, &[t_out, scope, bm, bn, c2]));
        let (buf_a, p_a) = a.buffer(t_in, 2, 0, true);
        let (buf_b, p_b) = a.buffer(t_in, 2, 1, true);
        let (buf_d, p_d) = a.buffer(t_out, if self.out == Out::W { 4 } else { 2 }, binding_out, false);

        let sc_input = spirv::StorageClass::Input as u32;
        let t_p_v3 = a.ty(Op::TypePointer, &[sc_input, t_v3]);
        let wg_id = a.global(t_p_v3, sc_input);
        a.deco.op(Op::Decorate, &[wg_id, spirv::Decoration::BuiltIn as u32, spirv::BuiltIn::WorkgroupId as u32]);

        // Entry point (SPIR-V 1.4+: every global the function uses is listed).
        let main = a.id();
        let mut entry = vec![spirv::ExecutionModel::GLCompute as u32, main];
        entry.extend(string("main"));
        entry.extend([wg_id, params, buf_a, buf_b, buf_d]);
        a.caps.op(Op::EntryPoint, &entry);
        // The workgroup size from specialization constant 3 (LocalSizeId: workgroup-scope
        // matrices need a size the compiler knows; Vulkan requires maintenance4 for it).
        a.caps.op(Op::ExecutionModeId, &[main, spirv::ExecutionMode::LocalSizeId as u32, wg, c1, c1]);

        // The function.
        let mut b = Words::default();
        let (entry_label, header, body, cont, exit) = (a.id(), a.id(), a.id(), a.id(), a.id());
        b.op(Op::Function, &[t_void, main, 0, t_fn]);
        b.op(Op::Label, &[entry_label]);
        let wid = a.id();
        b.op(Op::Load, &[t_v3, wid, wg_id]);
        let (wx, wy) = (a.id(), a.id());
        b.op(Op::CompositeExtract, &[t_u32, wx, wid, 0]);
        b.op(Op::CompositeExtract, &[t_u32, wy, wid, 1]);
        let (row0, col0) = (a.id(), a.id());
        b.op(Op::IMul, &[t_u32, row0, wy, bm]);
        b.op(Op::IMul, &[t_u32, col0, wx, bn]);
        let load_field = |a: &mut Asm, b: &mut Words, ty: u32, ptr_ty: u32, index: u32| {
            let (p, v) = (a.id(), a.id());
            b.op(Op::AccessChain, &[ptr_ty, p, params, index]);
            b.op(Op::Load, &[ty, v, p]);
            v
        };
        let m = load_field(&mut a, &mut b, t_u32, t_p_push_u32, c_m);
        let n = load_field(&mut a, &mut b, t_u32, t_p_push_u32, c_n);
        let k = load_field(&mut a, &mut b, t_u32, t_p_push_u32, c_k);
        let alpha = load_field(&mut a, &mut b, t_f32, t_p_push_f32, c_alpha);
        // Layouts: A is m×k (k×m when transposed), B k×n (n×k), D m×n, each row-major.
        let layout = |a: &mut Asm, b: &mut Words, d0: u32, d1: u32| {
            let (l0, l) = (a.id(), a.id());
            b.op(Op::CreateTensorLayoutNV, &[t_layout, l0]);
            b.op(Op::TensorLayoutSetDimensionNV, &[t_layout, l, l0, d0, d1]);
            l
        };
        let la = if self.ta { layout(&mut a, &mut b, k, m) } else { layout(&mut a, &mut b, m, k) };
        let lb = if self.tb { layout(&mut a, &mut b, n, k) } else { layout(&mut a, &mut b, k, n) };
        let ld = layout(&mut a, &mut b, m, n);
        let view = a.id();
        b.op(Op::CreateTensorViewNV, &[t_view, view]);
        let (acc0, za, zb) = (a.id(), a.id(), a.id());
        b.op(Op::CompositeConstruct, &[t_acc, acc0, f0]);
        b.op(Op::CompositeConstruct, &[t_ma, za, h0]);
        b.op(Op::CompositeConstruct, &[t_mb, zb, h0]);
        // Pointers to each buffer's first element.
        let first = |a: &mut Asm, b: &mut Words, ptr_ty: u32, buf: u32| {
            let p = a.id();
            b.op(Op::AccessChain, &[ptr_ty, p, buf, c0, c0]);
            p
        };
        let pa = first(&mut a, &mut b, p_a, buf_a);
        let pb = first(&mut a, &mut b, p_b, buf_b);
        let pd = first(&mut a, &mut b, p_d, buf_d);
        let load = |a: &mut Asm, b: &mut Words, ty: u32, ptr: u32, zero: u32, l: u32, slice: [u32; 4], t: bool| {
            let (s, v) = (a.id(), a.id());
            b.op(Op::TensorLayoutSliceNV, &[t_layout, s, l, slice[0], slice[1], slice[2], slice[3]]);
            // Memory operands None; tensor addressing operands None, or TensorView (1) + view.
            if t {
                b.op(Op::CooperativeMatrixLoadTensorNV, &[ty, v, ptr, zero, s, 0, 1, view]);
            } else {
                b.op(Op::CooperativeMatrixLoadTensorNV, &[ty, v, ptr, zero, s, 0, 0]);
            }
            v
        };
        // The tiles of op(A) and op(B) at step k0. A transposed operand's slice is in its
        // stored order; the view swaps it.
        let (ta, tb) = (self.ta, self.tb);
        let tiles = |a: &mut Asm, b: &mut Words, k0: u32| {
            let ma = if ta {
                load(a, b, t_ma, pa, za, la, [k0, bk, row0, bm], true)
            } else {
                load(a, b, t_ma, pa, za, la, [row0, bm, k0, bk], false)
            };
            let mb = if tb {
                load(a, b, t_mb, pb, zb, lb, [col0, bn, k0, bk], true)
            } else {
                load(a, b, t_mb, pb, zb, lb, [k0, bk, col0, bn], false)
            };
            (ma, mb)
        };
        // The first step's tiles are loaded before the loop, and each step loads the next
        // step's before multiplying its own (past the end they read as zeros): on the H200 that
        // took bf16 8192³ from 7.04 to 6.76 ms.
        let (ma0, mb0) = tiles(&mut a, &mut b, c0);
        b.op(Op::Branch, &[header]);

        // Loop header: k0, the accumulator and this step's tiles.
        b.op(Op::Label, &[header]);
        let (k0, acc, k0_next, acc_next, more) = (a.id(), a.id(), a.id(), a.id(), a.id());
        b.op(Op::Phi, &[t_u32, k0, c0, entry_label, k0_next, cont]);
        b.op(Op::Phi, &[t_acc, acc, acc0, entry_label, acc_next, cont]);
        let (ma_phi, mb_phi, ma_next, mb_next) = (a.id(), a.id(), a.id(), a.id());
        b.op(Op::Phi, &[t_ma, ma_phi, ma0, entry_label, ma_next, cont]);
        b.op(Op::Phi, &[t_mb, mb_phi, mb0, entry_label, mb_next, cont]);
        b.op(Op::ULessThan, &[t_bool, more, k0, k]);
        b.op(Op::LoopMerge, &[exit, cont, 0]);
        b.op(Op::BranchConditional, &[more, body, exit]);

        // Body: the next step's tiles loaded, this step's multiplied into the accumulator.
        b.op(Op::Label, &[body]);
        let step = a.id();
        b.op(Op::IAdd, &[t_u32, step, k0, bk]);
        let (na, nb) = tiles(&mut a, &mut b, step);
        // Under the ids the header's phis name.
        b.op(Op::CopyObject, &[t_ma, ma_next, na]);
        b.op(Op::CopyObject, &[t_mb, mb_next, nb]);
        b.op(Op::CooperativeMatrixMulAddKHR, &[t_acc, acc_next, ma_phi, mb_phi, acc]);
        b.op(Op::Branch, &[cont]);

        // Continue: the next k step.
        b.op(Op::Label, &[cont]);
        b.op(Op::IAdd, &[t_u32, k0_next, k0, bk]);
        b.op(Op::Branch, &[header]);

        // Exit: alpha·accumulator, converted to the output's type, stored through D's layout.
        b.op(Op::Label, &[exit]);
        let scaled = a.id();
        b.op(Op::MatrixTimesScalar, &[t_acc, scaled, acc, alpha]);
        let stored = match t_acc_out {
            None => scaled,
            Some(t) => {
                let v = a.id();
                b.op(Op::FConvert, &[t, v, scaled]);
                v
            }
        };
        let s = a.id();
        b.op(Op::TensorLayoutSliceNV, &[t_layout, s, ld, row0, bm, col0, bn]);
        b.op(Op::CooperativeMatrixStoreTensorNV, &[pd, stored, s, 0, 0]);
        b.op(Op::Return, &[]);
        b.op(Op::FunctionEnd, &[]);
        a.body = b;
        a.finish()
    }
}

/// A sequence of instruction words.
#[derive(Default)]
struct Words(Vec<u32>);

impl Words {
    fn op(&mut self, op: Op, operands: &[u32]) {
        self.0.push(((operands.len() as u32 + 1) << 16) | op as u32);
        self.0.extend_from_slice(operands);
    }
}

/// A module being assembled, by section (SPIR-V's logical layout).
struct Asm {
    /// Capabilities, extensions, the memory model, the entry point and its execution mode (in
    /// that order).
    caps: Words,
    /// Decorations.
    deco: Words,
    /// Types, constants and global variables.
    types: Words,
    /// The function.
    body: Words,
    next: u32,
}

impl Default for Asm {
    fn default() -> Self {
        Asm { caps: Words::default(), deco: Words::default(), types: Words::default(), body: Words::default(), next: 1 }
    }
}

impl Asm {
    fn id(&mut self) -> u32 {
        let i = self.next;
        self.next += 1;
        i
    }

    fn ty(&mut self, op: Op, operands: &[u32]) -> u32 {
        let i = self.id();
        let mut w = vec![i];
        w.extend_from_slice(operands);
        self.types.op(op, &w);
        i
    }

    fn constant(&mut self, ty: u32, bits: u32) -> u32 {
        let i = self.id();
        self.types.op(Op::Constant, &[ty, i, bits]);
        i
    }

    fn constant_false(&mut self, ty: u32) -> u32 {
        let i = self.id();
        self.types.op(Op::ConstantFalse, &[ty, i]);
        i
    }

    fn spec(&mut self, ty: u32, default: u32, spec_id: u32) -> u32 {
        let i = self.id();
        self.types.op(Op::SpecConstant, &[ty, i, default]);
        self.deco.op(Op::Decorate, &[i, spirv::Decoration::SpecId as u32, spec_id]);
        i
    }

    fn global(&mut self, ptr_ty: u32, storage: u32) -> u32 {
        let i = self.id();
        self.types.op(Op::Variable, &[ptr_ty, i, storage]);
        i
    }

    /// A storage buffer of `elem` (`elem_bytes` each) at `binding`: the variable and the
    /// pointer type of one element.
    fn buffer(&mut self, elem: u32, elem_bytes: u32, binding: u32, read_only: bool) -> (u32, u32) {
        let sc = spirv::StorageClass::StorageBuffer as u32;
        let arr = self.ty(Op::TypeRuntimeArray, &[elem]);
        self.deco.op(Op::Decorate, &[arr, spirv::Decoration::ArrayStride as u32, elem_bytes]);
        let st = self.ty(Op::TypeStruct, &[arr]);
        let ptr = self.ty(Op::TypePointer, &[sc, st]);
        let elem_ptr = self.ty(Op::TypePointer, &[sc, elem]);
        let var = self.global(ptr, sc);
        self.deco.op(Op::Decorate, &[st, spirv::Decoration::Block as u32]);
        self.deco.op(Op::MemberDecorate, &[st, 0, spirv::Decoration::Offset as u32, 0]);
        if read_only {
            self.deco.op(Op::MemberDecorate, &[st, 0, spirv::Decoration::NonWritable as u32]);
        }
        self.deco.op(Op::Decorate, &[var, spirv::Decoration::DescriptorSet as u32, 0]);
        self.deco.op(Op::Decorate, &[var, spirv::Decoration::Binding as u32, binding]);
        (var, elem_ptr)
    }

    fn finish(self) -> Vec<u32> {
        // Magic, version 1.6, generator 0, bound, schema 0.
        let mut out = vec![0x0723_0203, 0x0001_0600, 0, self.next, 0];
        for s in [self.caps, self.deco, self.types, self.body] {
            out.extend(s.0);
        }
        out
    }
}

/// A literal string operand: UTF-8, NUL-terminated, padded to whole words (also build.rs's
/// extension names).
pub fn string(s: &str) -> Vec<u32> {
    let mut bytes = s.as_bytes().to_vec();
    bytes.resize(bytes.len() / 4 * 4 + 4, 0);
    bytes.chunks(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}
