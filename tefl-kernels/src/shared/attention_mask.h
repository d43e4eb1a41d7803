// Sequences, masks and dropout of attention, target-neutral (any attention kernel of any
// backend shares them). Uses the attention defines: LAYOUT (0 bshd, 1 sbhd, 2 thd), PADDING,
// CAUSAL, BOTTOM_RIGHT, WIN_LEFT, WIN_RIGHT (-1: unbounded), DROPOUT.

struct Seq {
    int lq, lk;     // valid lengths
    long long qb, kb; // token row of position 0
    int rs;         // token rows between positions
};

__device__ __forceinline__ Seq seq_of(int b, int batch, int sq, int sk, const i32* cu_q, const i32* cu_k) {
    Seq s;
#if LAYOUT == 2
    s.qb = cu_q[b]; s.kb = cu_k[b];
    s.lq = cu_q[b + 1] - cu_q[b]; s.lk = cu_k[b + 1] - cu_k[b];
    s.rs = 1;
#else
#if LAYOUT == 0
    s.qb = (long long)b * sq; s.kb = (long long)b * sk; s.rs = 1;
#else
    s.qb = b; s.kb = b; s.rs = batch;
#endif
#if PADDING
    s.lq = cu_q[b + 1] - cu_q[b]; s.lk = cu_k[b + 1] - cu_k[b];
#else
    s.lq = sq; s.lk = sk;
#endif
#endif
    return s;
}

// The (row, head) index of lse: per head of the total rows for thd, else [batch, hq, sq].
__device__ __forceinline__ long long lse_index(const Seq& s, int b, int h, int hq, int sq, int tq, int i) {
    return LAYOUT == 2 ? (long long)h * tq + s.qb + i : ((long long)b * hq + h) * sq + i;
}

// The row a Hopper tensor map addresses for position `pos` of a sequence whose position 0 is
// token row `base`: the token row for thd (maps of D x heads x tokens), else the position.
__device__ __forceinline__ int map_row(long long base, int pos) { return LAYOUT == 2 ? (int)(base + pos) : pos; }

// Keys [lo, hi) query i sees (empty when hi <= lo).
__device__ __forceinline__ void key_range(const Seq& s, int i, int* lo, int* hi) {
    const int diag = BOTTOM_RIGHT ? s.lk - s.lq : 0;
    int l = 0, h = s.lk;
    if (i >= s.lq) { *lo = 0; *hi = 0; return; }
    if (CAUSAL) h = min(h, i + diag + 1);
    if (WIN_LEFT >= 0) l = max(l, i + diag - WIN_LEFT);
    if (WIN_RIGHT >= 0) h = min(h, i + diag + WIN_RIGHT + 1);
    *lo = l; *hi = max(h, l);
}

// The union of the key ranges of query rows [q0, q0 + rows) (lo >= hi when none sees a key).
// The bounds are monotone in the row, so the first and last rows with keys decide.
__device__ __forceinline__ void tile_keys(const Seq& s, int q0, int rows, int* lo, int* hi) {
    int l = 0x7fffffff, h = 0;
    for (int i = q0; i < min(q0 + rows, s.lq); ++i) {
        int a, b;
        key_range(s, i, &a, &b);
        if (b > a) { l = a; break; }
    }
    for (int i = min(q0 + rows, s.lq) - 1; i >= q0; --i) {
        int a, b;
        key_range(s, i, &a, &b);
        if (b > a) { h = b; break; }
    }
    *lo = l; *hi = h;
}

// Work item w of `tiles` tiles per head row (one head of one sequence) x `rows` head rows, in
// an order that ends a launch evenly: within groups of `group` head rows (few enough that the
// tiles they all read stay in L2 while the group runs), every row's rank-0 tile (the one with
// the most work under causal masks) first, then every row's rank 1, and so on; the last group
// may be smaller. Gives the item's rank and head row.
__device__ __forceinline__ void heavy_first(int w, int tiles, int rows, int group, int* rank, int* row) {
    const int first = w / (tiles * group) * group;
    const int n = min(group, rows - first);
    const int r = w - first * tiles;
    *rank = r / n;
    *row = first + r % n;
}

// A run of query rows [first, first + rows) see every key of [j0, j0 + n): no per-element
// mask. The key bounds are monotone in the query, so the first row's hi and the last row's
// lo decide (a row past the sequence has hi = 0).
struct WarpRows {
    int lo_last, hi_first, hi_last;
    __device__ __forceinline__ WarpRows(const Seq& s, int first, int rows) {
        int unused;
        key_range(s, first, &unused, &hi_first);
        key_range(s, first + rows - 1, &lo_last, &hi_last);
    }
    __device__ __forceinline__ bool all_see(int j0, int n) const {
        return lo_last <= j0 && hi_first >= j0 + n && hi_last >= j0 + n;
    }
};

__device__ __forceinline__ float keep_factor(u64 seed, u64 offset, float p, int b, int h, int hq, int sq, int sk, int i, int j) {
#if DROPOUT
    const u64 idx = (((u64)b * hq + h) * sq + i) * (u64)sk + j;
    return philox_uniform(seed, offset, idx) >= p ? 1.0f / (1.0f - p) : 0.0f;
#else
    return 1.0f;
#endif
}
