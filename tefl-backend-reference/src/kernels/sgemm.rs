//! f32 GEMM: C += alpha·op(A)·op(B), row-major C.
//!
//! On x86-64 with AVX-512F, our own cache-blocked kernel: C is split into a grid of blocks,
//! one task each on rayon's pool (rows and columns both split, so that every thread gets a
//! share of a short, wide product too); a task packs its B columns in KC×NC panels of
//! 32-column strips and its A rows in MC×KC blocks of 12-row strips into its thread's scratch,
//! and a 12×32 register-tile micro-kernel does the FMAs. Elsewhere the `gemm` crate's kernels
//! run.

use rayon::prelude::*;

/// Strided read-only matrix: element (i, j) at `data[i·rs + j·cs]`.
#[derive(Clone, Copy)]
pub struct MatRef<'a> {
    /// The elements.
    pub data: &'a [f32],
    /// Row stride.
    pub rs: usize,
    /// Column stride.
    pub cs: usize,
}

impl MatRef<'_> {
    #[inline]
    fn at(&self, i: usize, j: usize) -> f32 {
        self.data[i * self.rs + j * self.cs]
    }
}

/// C[m×n] (row-major, contiguous) += alpha · A[m×k] · B[k×n], on rayon's pool.
pub fn sgemm(m: usize, n: usize, k: usize, alpha: f32, a: MatRef<'_>, b: MatRef<'_>, c: &mut [f32]) {
    sgemm_on(Job { m, n, k, alpha, a, b, serial: false, set: false, pa: None, pb: None }, c);
}

/// C[m×n] = alpha · A[m×k] · B[k×n] on rayon's pool: C's earlier contents are never read, so
/// it needs no zeroing first.
pub fn sgemm_set(m: usize, n: usize, k: usize, alpha: f32, a: MatRef<'_>, b: MatRef<'_>, c: &mut [f32]) {
    sgemm_on(Job { m, n, k, alpha, a, b, serial: false, set: true, pa: None, pb: None }, c);
}

/// [`sgemm`] on the calling thread only: for the small products of a loop that is already
/// parallel (attention's tiles), where splitting each product again over the pool costs more
/// than it gains.
pub fn sgemm_serial(m: usize, n: usize, k: usize, alpha: f32, a: MatRef<'_>, b: MatRef<'_>, c: &mut [f32]) {
    sgemm_on(Job { m, n, k, alpha, a, b, serial: true, set: false, pa: None, pb: None }, c);
}

/// An operand packed once for many products: attention's tiles multiply each Q, K, V and dO
/// block with many others, and packing a block again for every product took a sixth of the
/// backward (`transpose_lines`). The kernel's layout: A as strips of 12 rows, B as strips of 32
/// columns, k in steps of 256. Without AVX-512 nothing is packed (the `gemm` crate's path reads
/// the matrix itself).
#[derive(Default)]
pub struct Packed {
    /// Which side of a product this is, and its rows × columns (A: m × k, B: k × n); `None`
    /// until packed.
    shape: Option<(Side, usize, usize)>,
    data: Vec<f32>,
}

/// The side of a product an operand is packed for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    A,
    B,
}

impl Packed {
    /// Packs `a` (m × k) as a product's left operand, reusing this buffer's memory.
    pub fn pack_a(&mut self, m: usize, k: usize, a: MatRef<'_>) {
        self.pack(Side::A, m, k, a);
    }
    /// Packs `b` (k × n) as a product's right operand, reusing this buffer's memory.
    pub fn pack_b(&mut self, k: usize, n: usize, b: MatRef<'_>) {
        self.pack(Side::B, k, n, b);
    }
    fn pack(&mut self, side: Side, rows: usize, cols: usize, x: MatRef<'_>) {
        self.shape = Some((side, rows, cols));
        self.data.clear();
        if rows == 0 || cols == 0 {
            return;
        }
        assert!((rows - 1) * x.rs + (cols - 1) * x.cs < x.data.len(), "packed operand too small");
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                avx512::pack_whole(side, rows, cols, x, &mut self.data);
            }
        }
    }
}

/// A product's operand: the matrix, and its packed form when the caller has one (a
/// [`Packed`] of this very matrix, on the side it is used).
#[derive(Clone, Copy)]
pub struct Operand<'a> {
    /// The matrix.
    pub mat: MatRef<'a>,
    /// Its packed form, if any.
    pub packed: Option<&'a Packed>,
}

impl<'a> Operand<'a> {
    /// `mat` with its packed form `packed`.
    pub fn packed(mat: MatRef<'a>, packed: &'a Packed) -> Self {
        Operand { mat, packed: Some(packed) }
    }
}

impl<'a> From<MatRef<'a>> for Operand<'a> {
    fn from(mat: MatRef<'a>) -> Self {
        Operand { mat, packed: None }
    }
}

/// [`sgemm_serial`] with operands that may come packed ([`Packed`]): those are not packed
/// again.
pub fn sgemm_serial_with(m: usize, n: usize, k: usize, alpha: f32, a: Operand<'_>, b: Operand<'_>, c: &mut [f32]) {
    for (op, side, rows, cols) in [(&a, Side::A, m, k), (&b, Side::B, k, n)] {
        if let Some(p) = op.packed {
            assert_eq!(p.shape, Some((side, rows, cols)), "packed operand of another shape");
        }
    }
    let job = Job { m, n, k, alpha, a: a.mat, b: b.mat, serial: true, set: false, pa: a.packed, pb: b.packed };
    sgemm_on(job, c);
}

/// One product: C[m×n] (+)= alpha · A · B, on the calling thread only when `serial`, storing
/// instead of adding (C never read) when `set`; `pa` / `pb`: A / B packed ahead.
#[derive(Clone, Copy)]
struct Job<'a> {
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: MatRef<'a>,
    b: MatRef<'a>,
    serial: bool,
    set: bool,
    pa: Option<&'a Packed>,
    pb: Option<&'a Packed>,
}

fn sgemm_on(job: Job<'_>, c: &mut [f32]) {
    let Job { m, n, k, a, b, set, .. } = job;
    assert!(c.len() >= m * n, "C too small");
    if set && k == 0 {
        c[..m * n].fill(0.0);
    }
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    assert!((m - 1) * a.rs + (k - 1) * a.cs < a.data.len(), "A too small");
    assert!((k - 1) * b.rs + (n - 1) * b.cs < b.data.len(), "B too small");
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            avx512::sgemm(job, c);
            return;
        }
    }
    fallback(job, c);
}

fn fallback(job: Job<'_>, c: &mut [f32]) {
    let Job { m, n, k, alpha, a, b, serial, set, .. } = job;
    let parallelism =
        if serial { gemm::Parallelism::None } else { gemm::Parallelism::Rayon(rayon::current_num_threads()) };
    // SAFETY: the asserts in `sgemm_on` bound every index the product reads (i·rs + l·cs for
    // i < m, l < k, and likewise for B) and C holds m·n elements with row stride n; the
    // buffers are distinct (C is uniquely borrowed).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            !set,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            1.0f32,
            alpha,
            false,
            false,
            false,
            parallelism,
        );
    }
}

// The packing scratch the AVX-512 kernel keeps per thread goes back with the host cache.
#[cfg(target_arch = "x86_64")]
inventory::submit! {
    tefl_core::device::HostScratchRelease { free: avx512::release_scratch }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    const MR: usize = 12;
    const NR: usize = 32;
    /// The k step: a packed B strip (KC·NR floats, 32 KiB) stays in L1 while the A strips of a
    /// block stream past it.
    const KC: usize = 256;
    /// Rows of a packed A block (MC·KC floats, 192 KiB: one core's L2 holds it).
    const MC: usize = 192;
    /// Columns of a packed B panel inside a task (KC·NC floats, 2 MiB at most; a narrower task
    /// packs only its own width). A is packed again for every panel, which cost a single
    /// thread 5–10% with panels of 512 columns.
    const NC: usize = 2048;
    /// The fewest multiply-adds a task is given: a smaller product runs on fewer threads (a
    /// task this size takes a few microseconds, about what handing it to another thread costs).
    const MIN_TASK_MACS: usize = 1 << 18;

    thread_local! {
        /// The packed B panel and A block, kept per thread between calls (pool workers keep
        /// theirs too, so a product allocates nothing once each thread has run one).
        static SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    }

    /// Frees this thread's packing scratch unless it is in use; the bytes it held.
    fn free_scratch() -> usize {
        SCRATCH.with(|s| match s.try_borrow_mut() {
            Ok(mut s) => {
                let bytes = (s.0.capacity() + s.1.capacity()) * std::mem::size_of::<f32>();
                *s = (Vec::new(), Vec::new());
                bytes
            }
            Err(_) => 0,
        })
    }

    /// Frees the packing scratch of every thread of the current rayon pool (the global one
    /// from outside any pool) and of the calling thread: `release_host_cache`'s hook.
    pub(super) fn release_scratch() -> usize {
        let pool: usize = rayon::broadcast(|_| free_scratch()).into_iter().sum();
        pool + if rayon::current_thread_index().is_none() { free_scratch() } else { 0 }
    }

    /// Runs `f` with this thread's packing scratch (fresh buffers if it is already in use,
    /// which only a product nested inside another on one thread would see).
    fn with_scratch(f: impl FnOnce(&mut Vec<f32>, &mut Vec<f32>)) {
        SCRATCH.with(|s| match s.try_borrow_mut() {
            Ok(mut s) => {
                let (bpack, apack) = &mut *s;
                f(bpack, apack);
            }
            Err(_) => f(&mut Vec::new(), &mut Vec::new()),
        });
    }

    /// Rows and columns of C each task computes when `tasks` tasks share an m×n product: the
    /// grid (rows split `tm` ways, columns `tn` ways, tm·tn ≤ tasks) whose largest task is the
    /// cheapest, counting its multiply-adds (whole MR×NR tiles) and its packing (B once a
    /// task, A once per NC columns, each packed element costing about 16 multiply-adds).
    pub(super) fn task_shape(m: usize, n: usize, tasks: usize) -> (usize, usize) {
        let mut best = (usize::MAX, m.div_ceil(MR) * MR, n.div_ceil(NR) * NR);
        for tm in 1..=tasks.min(m.div_ceil(MR)).max(1) {
            let tn = (tasks / tm).clamp(1, n.div_ceil(NR));
            let rows = m.div_ceil(tm).div_ceil(MR) * MR;
            let cols = n.div_ceil(tn).div_ceil(NR) * NR;
            let cost = rows * cols + 16 * (rows * cols.div_ceil(NC) + cols);
            if cost < best.0 {
                best = (cost, rows, cols);
            }
        }
        (best.1, best.2)
    }

    pub fn sgemm(job: Job<'_>, c: &mut [f32]) {
        let Job { m, n, k, serial, .. } = job;
        let c = &mut c[..m * n];
        let most = (m.saturating_mul(n).saturating_mul(k) / MIN_TASK_MACS).max(1);
        let tasks = if serial { 1 } else { rayon::current_num_threads().clamp(1, most) };
        if tasks == 1 {
            let mut rows: Vec<&mut [f32]> = c.chunks_mut(n).collect();
            with_scratch(|bpack, apack| task(job, 0, 0, &mut rows, bpack, apack));
            return;
        }
        let (rows_t, cols_t) = task_shape(m, n, tasks);
        // Row blocks of C, and in each the column blocks as lists of row segments, so that every
        // task holds its own part of C (disjoint slices) and nothing else.
        c.par_chunks_mut(rows_t * n).enumerate().for_each(|(bi, cblk)| {
            let mut blocks: Vec<Vec<&mut [f32]>> =
                (0..n.div_ceil(cols_t)).map(|_| Vec::with_capacity(cblk.len() / n)).collect();
            for row in cblk.chunks_mut(n) {
                for (bj, seg) in row.chunks_mut(cols_t).enumerate() {
                    blocks[bj].push(seg);
                }
            }
            blocks.into_par_iter().enumerate().for_each(|(bj, mut rows)| {
                with_scratch(|bpack, apack| task(job, bi * rows_t, bj * cols_t, &mut rows, bpack, apack));
            });
        });
    }

    /// Grows `v` to at least `len` elements (new ones zero) and returns its first `len`.
    fn at_least(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
        if v.len() < len {
            v.resize(len, 0.0);
        }
        &mut v[..len]
    }

    /// One task: the block of C whose rows are `c` (each as wide as the block) at rows i0.. and
    /// columns j0.. of the product, on the calling thread, packing into `bscratch` / `ascratch`.
    fn task(
        job: Job<'_>,
        i0: usize,
        j0: usize,
        c: &mut [&mut [f32]],
        bscratch: &mut Vec<f32>,
        ascratch: &mut Vec<f32>,
    ) {
        let Job { m, n, k, alpha, a, b, set, pa, pb, .. } = job;
        let (rows, cols) = (c.len(), c.first().map_or(0, |r| r.len()));
        for jc in (0..cols).step_by(NC) {
            let nc = NC.min(cols - jc);
            let strips = nc.div_ceil(NR);
            for pc in (0..k).step_by(KC) {
                let kc = KC.min(k - pc);
                // B[pc.., j0 + jc..] as strips of NR columns: strip s, row p at s·kc·NR + p·NR
                // (packed ahead: the same strips inside the whole operand's, see pack_whole).
                let bp: &[f32] = match pb {
                    Some(p) => &p.data[pc * n.div_ceil(NR) * NR + (j0 + jc) / NR * kc * NR..][..strips * kc * NR],
                    None => {
                        let bp = at_least(bscratch, strips * kc * NR);
                        for (s, buf) in bp.chunks_mut(kc * NR).enumerate() {
                            pack_b(b, pc, kc, j0 + jc + s * NR, NR.min(nc - s * NR), buf);
                        }
                        bp
                    }
                };
                // The first k step of a set product stores; every other one adds.
                let store = set && pc == 0;
                for ic in (0..rows).step_by(MC) {
                    let mc = MC.min(rows - ic);
                    let astrips = mc.div_ceil(MR);
                    let ap: &[f32] = match pa {
                        Some(p) => &p.data[pc * m.div_ceil(MR) * MR + (i0 + ic) / MR * kc * MR..][..astrips * kc * MR],
                        None => {
                            let ap = at_least(ascratch, astrips * kc * MR);
                            for (t, buf) in ap.chunks_mut(kc * MR).enumerate() {
                                pack_a(a, i0 + ic + t * MR, MR.min(mc - t * MR), pc, kc, buf);
                            }
                            ap
                        }
                    };
                    let mut tile = [0.0f32; MR * NR];
                    for s in 0..strips {
                        let bs = &bp[s * kc * NR..(s + 1) * kc * NR];
                        let (col, ncols) = (jc + s * NR, NR.min(nc - s * NR));
                        for t in 0..astrips {
                            let at = &ap[t * kc * MR..(t + 1) * kc * MR];
                            let crows = &mut c[ic + t * MR..][..MR.min(mc - t * MR)];
                            if crows.len() == MR && ncols == NR {
                                // SAFETY: avx512f was detected by the caller; `at` holds kc·MR
                                // and `bs` kc·NR packed floats; `crows` are MR rows of C, each
                                // with NR columns from `col` (checked inside).
                                unsafe { kernel_into(kc, at, bs, crows, col, alpha, store) };
                                continue;
                            }
                            // SAFETY: as above, with the MR·NR scratch `tile` as destination.
                            unsafe { kernel(kc, at, bs, &mut tile, alpha) };
                            for (ii, crow) in crows.iter_mut().enumerate() {
                                let crow = &mut crow[col..col + ncols];
                                let tv = &tile[ii * NR..ii * NR + ncols];
                                if store {
                                    crow.copy_from_slice(tv);
                                } else {
                                    crow.iter_mut().zip(tv).for_each(|(cv, tv)| *cv += tv);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The whole of `x` (rows × cols) packed for `side` into `out`: per k step of KC, every
    /// strip (A: MR rows, m × k; B: NR columns, k × n), each as `task` packs one, so that step
    /// pc's strip t starts at pc · (strips · width) + t · kc · width.
    pub(super) fn pack_whole(side: Side, rows: usize, cols: usize, x: MatRef<'_>, out: &mut Vec<f32>) {
        let (lines, k, width) = match side {
            Side::A => (rows, cols, MR),
            Side::B => (cols, rows, NR),
        };
        let strips = lines.div_ceil(width);
        out.resize(strips * width * k, 0.0);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            let step = &mut out[pc * strips * width..][..strips * kc * width];
            for (t, buf) in step.chunks_mut(kc * width).enumerate() {
                let (first, count) = (t * width, width.min(lines - t * width));
                match side {
                    Side::A => pack_a(x, first, count, pc, kc, buf),
                    Side::B => pack_b(x, pc, kc, first, count, buf),
                }
            }
        }
    }

    /// Packs rows i0..i0+nrows, columns pc..pc+kc of A as kc groups of MR (rows past nrows: 0).
    fn pack_a(a: MatRef<'_>, i0: usize, nrows: usize, pc: usize, kc: usize, buf: &mut [f32]) {
        if a.cs == 1 {
            // SAFETY: avx512f was detected by the caller (`sgemm_on`, or `Packed::pack` for
            // `pack_whole`), which also checked that every element (i, l) of A with i < m,
            // l < k is in `a.data`; these rows and columns are inside that range; `buf` holds
            // kc groups of MR floats.
            unsafe { transpose_lines(a.data, (i0 * a.rs + pc, a.rs), nrows, kc, MR, buf) };
            return;
        }
        if a.rs == 1 {
            for (p, dst) in buf.chunks_mut(MR).take(kc).enumerate() {
                dst[..nrows].copy_from_slice(&a.data[(pc + p) * a.cs + i0..][..nrows]);
            }
        } else {
            for p in 0..kc {
                for ii in 0..nrows {
                    buf[p * MR + ii] = a.at(i0 + ii, pc + p);
                }
            }
        }
        if nrows < MR {
            for dst in buf.chunks_mut(MR).take(kc) {
                dst[nrows..].fill(0.0);
            }
        }
    }

    /// Packs rows pc..pc+kc, columns j0..j0+ncols of B as kc rows of NR (columns past ncols: 0).
    fn pack_b(b: MatRef<'_>, pc: usize, kc: usize, j0: usize, ncols: usize, buf: &mut [f32]) {
        if b.rs == 1 && b.cs != 1 {
            // B's columns are contiguous (a transposed operand, as Kᵀ in attention's scores).
            // SAFETY: as in `pack_a`, for B's elements (l, j), l < k, j < n; `buf` holds kc rows
            // of NR floats.
            unsafe { transpose_lines(b.data, (j0 * b.cs + pc, b.cs), ncols, kc, NR, buf) };
            return;
        }
        if b.cs == 1 {
            for (p, dst) in buf.chunks_mut(NR).take(kc).enumerate() {
                dst[..ncols].copy_from_slice(&b.data[(pc + p) * b.rs + j0..][..ncols]);
            }
        } else {
            for (p, dst) in buf.chunks_mut(NR).take(kc).enumerate() {
                for (jj, v) in dst[..ncols].iter_mut().enumerate() {
                    *v = b.at(pc + p, j0 + jj);
                }
            }
        }
        if ncols < NR {
            for dst in buf.chunks_mut(NR).take(kc) {
                dst[ncols..].fill(0.0);
            }
        }
    }

    /// The 16×16 transpose of `r` (row i, lane j → row j, lane i): the off-diagonal b×b blocks
    /// swapped for b = 8, 4, 2, 1, each level one two-source permute a row.
    #[target_feature(enable = "avx512f")]
    fn transpose16(r: &mut [__m512; 16]) {
        for b in [8usize, 4, 2, 1] {
            let lane = |f: &dyn Fn(usize) -> usize| {
                let v: [i32; 16] = std::array::from_fn(|j| f(j) as i32);
                // SAFETY: reads 16 i32 from a local array of 16.
                unsafe { _mm512_loadu_si512(v.as_ptr().cast()) }
            };
            // Row i (bit b clear) keeps its lanes without bit b and takes row i + b's lanes
            // j - b; row i + b takes row i's lanes j + b and keeps its own with bit b.
            let lo = lane(&|j| if j & b == 0 { j } else { 16 + j - b });
            let hi = lane(&|j| if j & b == 0 { j + b } else { 16 + j });
            for i in (0..16).filter(|i| i & b == 0) {
                let (x, y) = (r[i], r[i + b]);
                r[i] = _mm512_permutex2var_ps(x, lo, y);
                r[i + b] = _mm512_permutex2var_ps(x, hi, y);
            }
        }
    }

    /// Packs `lines` (at most 32) strided lines of `kc` contiguous floats as kc groups of
    /// `width` (12 or 32): group p holds element p of every line, lines past `lines` as zeros.
    /// `(start, stride)`: line t's element p is `data[start + t·stride + p]`. Blocks of 16 lines
    /// by 16 elements are loaded a line at a time and transposed in registers, where the scalar
    /// loops moved one float at a time (most of attention's GEMM packing; AVX-512 gathers were
    /// no faster than those loops on the machines measured, 2026-12-04).
    ///
    /// # Safety
    /// The CPU has AVX-512F; every `data[start + t·stride + p]` for t < lines, p < kc is in
    /// bounds; `buf` holds kc·width floats; width is 12 or 32 and lines ≤ width.
    #[target_feature(enable = "avx512f")]
    unsafe fn transpose_lines(
        data: &[f32],
        (start, stride): (usize, usize),
        lines: usize,
        kc: usize,
        width: usize,
        buf: &mut [f32],
    ) {
        debug_assert!(lines <= width && (width == MR || width == NR) && buf.len() >= kc * width);
        let base = data.as_ptr();
        let out = buf.as_mut_ptr();
        // The lanes a group's store writes: 12 for A's groups, 16 for each half of B's.
        let keep: __mmask16 = if width == MR { (1 << MR) - 1 } else { 0xFFFF };
        for p0 in (0..kc).step_by(16) {
            let np = (kc - p0).min(16);
            let pmask: __mmask16 = ((1u32 << np) - 1) as __mmask16;
            for h in 0..width.div_ceil(16) {
                let mut r = [_mm512_setzero_ps(); 16];
                for (t, row) in r.iter_mut().enumerate() {
                    let line = 16 * h + t;
                    if line < lines {
                        // SAFETY: the caller's bound: elements p0..p0 + np of this line are in
                        // `data` (the masked lanes past np are not read).
                        *row = unsafe { _mm512_maskz_loadu_ps(pmask, base.add(start + line * stride + p0)) };
                    }
                }
                transpose16(&mut r);
                for (q, row) in r.iter().take(np).enumerate() {
                    // SAFETY: group p0 + q < kc, floats 16h.. (12 or 16 of them) of its `width`.
                    unsafe { _mm512_mask_storeu_ps(out.add((p0 + q) * width + 16 * h), keep, *row) };
                }
            }
        }
    }

    /// The MR×NR product of a packed A strip and B strip, in 24 zmm accumulators.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn product(kc: usize, a: &[f32], b: &[f32]) -> [[__m512; 2]; MR] {
        assert!(a.len() >= kc * MR && b.len() >= kc * NR);
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        let (ap, bp) = (a.as_ptr(), b.as_ptr());
        for p in 0..kc {
            // SAFETY: p < kc, so p·NR + 16 + 16 ≤ kc·NR and p·MR + i < kc·MR (asserted above).
            unsafe {
                let b0 = _mm512_loadu_ps(bp.add(p * NR));
                let b1 = _mm512_loadu_ps(bp.add(p * NR + 16));
                for (i, row) in acc.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*ap.add(p * MR + i));
                    row[0] = _mm512_fmadd_ps(av, b0, row[0]);
                    row[1] = _mm512_fmadd_ps(av, b1, row[1]);
                }
            }
        }
        acc
    }

    /// C[MR×NR tile: rows `c`, columns col..col + NR] += alpha · product, or = when `store`.
    #[target_feature(enable = "avx512f")]
    fn kernel_into(kc: usize, a: &[f32], b: &[f32], c: &mut [&mut [f32]], col: usize, alpha: f32, store: bool) {
        assert!(c.len() == MR && c.iter().all(|r| r.len() >= col + NR));
        let acc = product(kc, a, b);
        let al = _mm512_set1_ps(alpha);
        for (crow, row) in c.iter_mut().zip(&acc) {
            // SAFETY: the row holds col + NR = col + 32 floats or more (asserted above).
            unsafe {
                let p0 = crow.as_mut_ptr().add(col);
                if store {
                    _mm512_storeu_ps(p0, _mm512_mul_ps(al, row[0]));
                    _mm512_storeu_ps(p0.add(16), _mm512_mul_ps(al, row[1]));
                } else {
                    _mm512_storeu_ps(p0, _mm512_fmadd_ps(al, row[0], _mm512_loadu_ps(p0)));
                    _mm512_storeu_ps(p0.add(16), _mm512_fmadd_ps(al, row[1], _mm512_loadu_ps(p0.add(16))));
                }
            }
        }
    }

    /// tile = alpha · product (edge tiles).
    #[target_feature(enable = "avx512f")]
    fn kernel(kc: usize, a: &[f32], b: &[f32], tile: &mut [f32; MR * NR], alpha: f32) {
        let acc = product(kc, a, b);
        let al = _mm512_set1_ps(alpha);
        let tp = tile.as_mut_ptr();
        for (i, row) in acc.iter().enumerate() {
            // SAFETY: i < MR, so i·NR + 32 ≤ MR·NR = tile.len().
            unsafe {
                _mm512_storeu_ps(tp.add(i * NR), _mm512_mul_ps(al, row[0]));
                _mm512_storeu_ps(tp.add(i * NR + 16), _mm512_mul_ps(al, row[1]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_naive_on_awkward_shapes_and_strides() {
        // (200, 600, 40): a task's rows past one A block (MC) and columns past one B panel (NC).
        for &(m, n, k) in
            &[(1, 1, 1), (13, 33, 7), (25, 65, 300), (130, 70, 513), (3, 4100, 5), (4, 5, 0), (200, 600, 40)]
        {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 37) % 17) as f32 / 17.0 - 0.5).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 11) % 13) as f32 / 13.0 - 0.5).collect();
            for (ta, tb, mode) in [
                (false, false, 0),
                (true, true, 0),
                (false, true, 1),
                (true, false, 1),
                (false, false, 2),
                (true, false, 2),
                (false, true, 3),
                (true, true, 4),
            ] {
                let am = if ta { MatRef { data: &a, rs: 1, cs: m } } else { MatRef { data: &a, rs: k, cs: 1 } };
                let bm = if tb { MatRef { data: &b, rs: 1, cs: k } } else { MatRef { data: &b, rs: n, cs: 1 } };
                // Modes: 0 pool, 1 serial (both add to C = 1), 2 set (C's NaNs never read); 3 and 4
                // the `gemm` crate's path (used without AVX-512), set and serial accumulate.
                let set = mode == 2 || mode == 3;
                let c0 = if set { f32::NAN } else { 1.0 };
                let mut c = vec![c0; m * n];
                match mode {
                    0 => sgemm(m, n, k, 0.5, am, bm, &mut c),
                    1 => sgemm_serial(m, n, k, 0.5, am, bm, &mut c),
                    2 => sgemm_set(m, n, k, 0.5, am, bm, &mut c),
                    3 if k == 0 => c.fill(0.0), // (sgemm_on's own k = 0 case, tested by mode 2)
                    3 => fallback(
                        Job { m, n, k, alpha: 0.5, a: am, b: bm, serial: false, set: true, pa: None, pb: None },
                        &mut c,
                    ),
                    _ => fallback(
                        Job { m, n, k, alpha: 0.5, a: am, b: bm, serial: true, set: false, pa: None, pb: None },
                        &mut c,
                    ),
                }
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 = if set { 0.0 } else { 1.0 }
                            + 0.5 * (0..k).map(|l| f64::from(am.at(i, l)) * f64::from(bm.at(l, j))).sum::<f64>();
                        assert!(
                            (f64::from(c[i * n + j]) - want).abs() < 1e-4 * (1.0 + want.abs()),
                            "{m}x{n}x{k} mode {mode} ({i},{j})"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn matches_naive_with_padded_strides() {
        // Rows and columns further apart than the product's k (as attention's per-head views
        // of bshd tensors): A row-major or column-major, B row-major or transposed (the strided
        // packing paths, lines past a strip's 12 rows or 32 columns included).
        for &(m, n, k, pad) in &[(13, 45, 300, 5), (30, 70, 17, 131), (1, 33, 9, 3), (25, 1, 40, 7)] {
            let a: Vec<f32> = (0..(m + pad) * (k + pad)).map(|i| ((i * 29) % 19) as f32 / 19.0 - 0.5).collect();
            let b: Vec<f32> = (0..(k + pad) * (n + pad)).map(|i| ((i * 13) % 23) as f32 / 23.0 - 0.5).collect();
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                let am =
                    if ta { MatRef { data: &a, rs: 1, cs: m + pad } } else { MatRef { data: &a, rs: k + pad, cs: 1 } };
                let bm =
                    if tb { MatRef { data: &b, rs: 1, cs: k + pad } } else { MatRef { data: &b, rs: n + pad, cs: 1 } };
                let mut c = vec![f32::NAN; m * n];
                sgemm_set(m, n, k, 1.0, am, bm, &mut c);
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 = (0..k).map(|l| f64::from(am.at(i, l)) * f64::from(bm.at(l, j))).sum();
                        assert!(
                            (f64::from(c[i * n + j]) - want).abs() < 1e-4 * (1.0 + want.abs()),
                            "{m}x{n}x{k} ta {ta} tb {tb} ({i},{j})"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn packed_operands_give_the_same_products() {
        // k past one step (KC), m past one A block (MC), n past one B panel (NC); operands
        // row-major or transposed; A, B or both packed ahead, one buffer packed again for
        // another shape in between (its memory reused).
        let mut pa = Packed::default();
        let mut pb = Packed::default();
        for &(m, n, k) in &[(1, 1, 1), (13, 33, 7), (25, 65, 300), (200, 45, 513), (3, 2100, 5), (128, 128, 128)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 31) % 23) as f32 / 23.0 - 0.5).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 7) % 19) as f32 / 19.0 - 0.5).collect();
            for (ta, tb) in [(false, false), (true, true), (false, true), (true, false)] {
                let am = if ta { MatRef { data: &a, rs: 1, cs: m } } else { MatRef { data: &a, rs: k, cs: 1 } };
                let bm = if tb { MatRef { data: &b, rs: 1, cs: k } } else { MatRef { data: &b, rs: n, cs: 1 } };
                pa.pack_a(m, k, am);
                pb.pack_b(k, n, bm);
                for (which, a_op, b_op) in [
                    ("A", Operand { mat: am, packed: Some(&pa) }, Operand::from(bm)),
                    ("B", Operand::from(am), Operand { mat: bm, packed: Some(&pb) }),
                    ("both", Operand { mat: am, packed: Some(&pa) }, Operand { mat: bm, packed: Some(&pb) }),
                ] {
                    let mut c = vec![1.0f32; m * n];
                    sgemm_serial_with(m, n, k, 0.5, a_op, b_op, &mut c);
                    for i in 0..m {
                        for j in 0..n {
                            let want = 1.0
                                + 0.5 * (0..k).map(|l| f64::from(am.at(i, l)) * f64::from(bm.at(l, j))).sum::<f64>();
                            assert!(
                                (f64::from(c[i * n + j]) - want).abs() < 1e-4 * (1.0 + want.abs()),
                                "{m}x{n}x{k} ta {ta} tb {tb} packed {which} ({i},{j})"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "packed operand of another shape")]
    fn a_packed_operand_of_another_shape_is_refused() {
        let a = vec![1.0f32; 12];
        let mut p = Packed::default();
        p.pack_a(3, 4, MatRef { data: &a, rs: 4, cs: 1 });
        let mut c = vec![0.0f32; 4 * 3];
        // Used as a 4×3 A: refused, not read out of its layout.
        sgemm_serial_with(
            4,
            3,
            3,
            1.0,
            Operand { mat: MatRef { data: &a, rs: 3, cs: 1 }, packed: Some(&p) },
            Operand::from(MatRef { data: &a, rs: 3, cs: 1 }),
            &mut c,
        );
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn task_grid_splits_rows_and_columns_into_whole_tiles() {
        use super::avx512::task_shape;
        // 16 tasks on 1024×1536: both dimensions split, all 16 used.
        let (r, c) = task_shape(1024, 1536, 16);
        assert!(r < 1024 && c < 1536 && 1024usize.div_ceil(r) * 1536usize.div_ceil(c) == 16, "{r}x{c}");
        // One task takes the whole product, rounded up to whole tiles.
        assert_eq!(task_shape(100, 70, 1), (108, 96));
        // One row: the columns are split, never the rows.
        assert_eq!(task_shape(1, 4096, 8), (12, 512));
        // One column: the rows are split.
        assert_eq!(task_shape(4096, 1, 8), (516, 32));
        for (m, n, t) in [(1024, 512, 16), (7, 9, 3), (5000, 3, 16), (48, 4096, 5)] {
            let (r, c) = task_shape(m, n, t);
            assert!(r % 12 == 0 && c % 32 == 0, "{m}x{n}/{t}: {r}x{c}");
            assert!(m.div_ceil(r) * n.div_ceil(c) <= t, "{m}x{n}/{t}: {r}x{c} makes too many tasks");
        }
    }
}
