/* The two hot loops of _kernels.c, written once for native vectors of H float lanes and included by
 * _kernels.c once per vector width: H = 16 (AVX-512), 8 (AVX2), 4 (SSE2, NEON, and any other build).
 * Before including, _kernels.c defines H, VARIANT(name) (a name suffix per width) and TARGET (the
 * instruction set the functions are compiled for; empty for the portable build); this file undefines
 * them at its end, ready for the next width.
 *
 * Every width does the arithmetic of the same W = 16 logical lanes, each logical vector held as P = W / H
 * native vectors: element i of a step of 2W goes to chain i / W, logical lane i % W, exactly as before the
 * split. With -ffp-contract=off every width therefore gives the same bits. Vectors must not be wider than
 * the hardware's registers: GCC 12 lowers a 64-byte vector on AVX2 or SSE2 into spilled, partly scalar
 * code (measured on an AMD EPYC, AVX2: 1,200-1,600 us per MiB chunk against 58 us with native halves).
 */

#define P (W / H)
#define VF VARIANT(vf)
#define VI VARIANT(vi)
typedef float VF __attribute__((vector_size(H * 4)));
typedef int VI __attribute__((vector_size(H * 4)));
/* mask ? a : b, lane by lane (a macro: vector arguments of a helper would change the ABI per width) */
#define SELECT(mask, a, b) ((VF)(((VI)(a) & (mask)) | ((VI)(b) & ~(mask))))

/* min, max (NaN skipped), Σx, Σx² and #zeros of x[0:n]: see f32_summary in _kernels.c for the contract.
 * Two chains of 16 logical lanes (2W = 32 elements a step), so that the loop is not bound by the latency
 * of one chain of additions; float32 partial sums per lane over BLOCK elements (32 per lane), then added
 * into float64 per logical lane; lanes 0-7 and 8-15 summed pairwise at the end; the tail in float64. */
TARGET static void VARIANT(f32_summary_loop)(const float *x, Py_ssize_t n, float *lo_out, float *hi_out,
                                             double *sum_out, double *sumsq_out, long long *zeros_out) {
    VF pinf;
    for (int k = 0; k < H; k++) pinf[k] = INFINITY;
    VF lo0[P], lo1[P], hi0[P], hi1[P];
    for (int p = 0; p < P; p++) {
        lo0[p] = lo1[p] = pinf;
        hi0[p] = hi1[p] = -pinf;
    }
    double sum[W] = {0}, sumsq[W] = {0};
    long long zeros = 0;
    Py_ssize_t i = 0;
    Py_ssize_t vec_end = n - n % (2 * W);
    while (i < vec_end) {
        Py_ssize_t end = i + BLOCK < vec_end ? i + BLOCK : vec_end;
        VF s0[P], s1[P], q0[P], q1[P];
        VI z[P];
        for (int p = 0; p < P; p++) {
            s0[p] = s1[p] = q0[p] = q1[p] = (VF){0};
            z[p] = (VI){0};
        }
        for (; i < end; i += 2 * W) {
            for (int p = 0; p < P; p++) {
                VF a, b;
                memcpy(&a, x + i + p * H, sizeof a); /* unaligned loads */
                memcpy(&b, x + i + W + p * H, sizeof b);
                lo0[p] = SELECT(a < lo0[p], a, lo0[p]); /* NaN compares false: skipped */
                lo1[p] = SELECT(b < lo1[p], b, lo1[p]);
                hi0[p] = SELECT(a > hi0[p], a, hi0[p]);
                hi1[p] = SELECT(b > hi1[p], b, hi1[p]);
                z[p] -= (a == 0); /* true is -1 */
                z[p] -= (b == 0);
                s0[p] += a;
                s1[p] += b;
                q0[p] += a * a;
                q1[p] += b * b;
            }
        }
        for (int p = 0; p < P; p++) {
            VF s = s0[p] + s1[p], q = q0[p] + q1[p];
            for (int k = 0; k < H; k++) {
                sum[p * H + k] += (double)s[k];
                sumsq[p * H + k] += (double)q[k];
                zeros += z[p][k];
            }
        }
    }
    double total = 0.0, total_sq = 0.0;
    for (int k = 0; k < W / 2; k++) {
        total += sum[k] + sum[k + W / 2];
        total_sq += sumsq[k] + sumsq[k + W / 2];
    }
    float slo = INFINITY, shi = -INFINITY;
    for (int k = 0; k < W; k++) { /* this order decides which of -0.0 and 0.0 is reported */
        int p = k / H, l = k % H;
        if (lo0[p][l] < slo) slo = lo0[p][l];
        if (lo1[p][l] < slo) slo = lo1[p][l];
        if (hi0[p][l] > shi) shi = hi0[p][l];
        if (hi1[p][l] > shi) shi = hi1[p][l];
    }
    for (; i < n; i++) { /* the tail (< 32 elements), in float64 */
        float v = x[i];
        if (v < slo) slo = v;
        if (v > shi) shi = v;
        zeros += (v == 0.0f);
        total += (double)v;
        total_sq += (double)v * (double)v;
    }
    *lo_out = slo;
    *hi_out = shi;
    *sum_out = total;
    *sumsq_out = total_sq;
    *zeros_out = zeros;
}

/* y = x · scale (one float32 multiply per element) and, in the same pass, Σy² with exactly the arithmetic of
 * f32_summary_loop's Σx² (so it has the bits of f32_summary(y)'s), and #changed = #(y != x) - #(x is NaN)
 * (x NaN makes y NaN, which is not a change). Two counters, not one AND of two comparisons: GCC 12 turns
 * that AND into scalar code in the AVX-512 build (measured 25x slower). */
TARGET static void VARIANT(f32_scale_loop)(const float *x, float *y, Py_ssize_t n, float scale,
                                           double *sumsq_out, long long *changed_out) {
    VF sv;
    for (int k = 0; k < H; k++) sv[k] = scale;
    double sumsq[W] = {0};
    long long changed = 0;
    Py_ssize_t i = 0;
    Py_ssize_t vec_end = n - n % (2 * W);
    while (i < vec_end) {
        Py_ssize_t end = i + BLOCK < vec_end ? i + BLOCK : vec_end;
        VF q0[P], q1[P];
        VI c[P];
        for (int p = 0; p < P; p++) {
            q0[p] = q1[p] = (VF){0};
            c[p] = (VI){0};
        }
        for (; i < end; i += 2 * W) {
            for (int p = 0; p < P; p++) {
                VF a, b;
                memcpy(&a, x + i + p * H, sizeof a);
                memcpy(&b, x + i + W + p * H, sizeof b);
                VF oa = a * sv, ob = b * sv;
                memcpy(y + i + p * H, &oa, sizeof oa);
                memcpy(y + i + W + p * H, &ob, sizeof ob);
                c[p] -= (oa != a);
                c[p] += (a != a);
                c[p] -= (ob != b);
                c[p] += (b != b);
                q0[p] += oa * oa;
                q1[p] += ob * ob;
            }
        }
        for (int p = 0; p < P; p++) {
            VF q = q0[p] + q1[p];
            for (int k = 0; k < H; k++) {
                sumsq[p * H + k] += (double)q[k];
                changed += c[p][k];
            }
        }
    }
    double total_sq = 0.0;
    for (int k = 0; k < W / 2; k++) total_sq += sumsq[k] + sumsq[k + W / 2];
    for (; i < n; i++) { /* the tail, in float64, as f32_summary_loop */
        float v = x[i], o = v * scale;
        y[i] = o;
        changed += (o != v) && !(o != o && v != v);
        total_sq += (double)o * (double)o;
    }
    *sumsq_out = total_sq;
    *changed_out = changed;
}

#undef SELECT
#undef VI
#undef VF
#undef P
#undef TARGET
#undef VARIANT
#undef H
