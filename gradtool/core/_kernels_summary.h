/* The summary loop of _kernels_loops.h for one source type: _kernels_loops.h defines SUMMARY_NAME (the
 * function's name), SRC_T (the element type in memory), LOAD_VEC(dst, ptr) (H elements at ptr into a VF of
 * float32) and LOAD_ONE(ptr) (one element as a float) before each include; this file undefines them. */

/* min, max (NaN skipped), Σx, Σx² and #zeros of x[0:n] (as float32 values): see f32_summary in _kernels.c
 * for the contract.
 * Two chains of 16 logical lanes (2W = 32 elements a step), so that the loop is not bound by the latency
 * of one chain of additions; float32 partial sums per lane over BLOCK elements (32 per lane), then added
 * into float64 per logical lane; lanes 0-7 and 8-15 summed pairwise at the end; the tail in float64. */
TARGET static void SUMMARY_NAME(const SRC_T *x, Py_ssize_t n, float *lo_out, float *hi_out, double *sum_out,
                                double *sumsq_out, long long *zeros_out) {
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
                LOAD_VEC(a, x + i + p * H);
                LOAD_VEC(b, x + i + W + p * H);
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
        float v = LOAD_ONE(x + i);
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

#undef LOAD_ONE
#undef LOAD_VEC
#undef SRC_T
#undef SUMMARY_NAME
