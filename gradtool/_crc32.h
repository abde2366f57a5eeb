/* zlib's CRC-32, shared by both C extensions (core/_kernels.c: an npz member's CRC in the same pass as its
 * statistics; io/_logscan.c: zlib.crc32's values for the readers). Include once per extension, after
 * Python.h; call crc32_setup() in the module's init.
 *
 *   crc32_with(crc, p, n, simd)   zlib.crc32(p[0:n], crc): carry-less multiplication where the CPU has
 *                                 PCLMULQDQ (eight lanes in 256-bit vectors with VPCLMULQDQ, sixteen in
 *                                 512-bit ones with AVX-512 too) and `simd` allows it, the slicing-by-8
 *                                 tables otherwise
 *   crc32_combine(c1, c2, len2)   zlib's crc32_combine: the CRC of A+B from c1 = CRC(A), c2 = CRC(B) and
 *                                 len2 = len(B), so that pieces of one member may be taken by two threads
 */
#ifndef GRADTOOL_CRC32_H
#define GRADTOOL_CRC32_H

#include <stdint.h>

#define CRC32_POLY 0xEDB88320u /* zlib's polynomial, bit-reflected */

typedef uint32_t crc_tables_t[8][256];
static crc_tables_t crc32_tables; /* zlib's CRC-32 */
static uint32_t crc32_x2n[32];     /* x^(2^k) modulo the polynomial, for crc32_combine */

/* The slicing-by-8 tables of the reflected CRC of polynomial `poly`. */
static void crc_init(crc_tables_t t, uint32_t poly) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? poly ^ (c >> 1) : c >> 1;
        t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int k = 1; k < 8; k++) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
}

/* The CRC of the tables `t` continued over p[0:n] from `crc` (zlib's crc32(data, crc) with crc32_tables):
 * slicing by 8. */
static uint32_t crc_update(const crc_tables_t t, uint32_t crc, const unsigned char *p, Py_ssize_t n) {
    crc = ~crc;
    while (n >= 8) {
        uint32_t a = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                            (uint32_t)p[3] << 24);
        crc = t[7][a & 0xFF] ^ t[6][(a >> 8) & 0xFF] ^ t[5][(a >> 16) & 0xFF] ^ t[4][a >> 24] ^ t[3][p[4]] ^
              t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--) crc = t[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CLMUL_CRC 1
static int clmul_crc = 0;  /* the CPU has PCLMULQDQ and SSE4.1 (set by crc32_setup) */
static int vclmul_crc = 0; /* ... and VPCLMULQDQ with AVX2 */
static int zclmul_crc = 0; /* ... and with AVX-512 (the OS saving its registers: __builtin_cpu_supports) */
/* Folding 128 bits ahead, 16 bytes: x^(128-32) and x^(128+32) modulo the polynomial, bit-reflected (the
 * fold into the next 16-byte lane, in every loop below) */
#define CRC32_K3 0x00ccaa009e
#define CRC32_K4 0x01751997d0

/* The end of a fold (crc32_clmul's, crc32_vclmul's): the 16-byte blocks of p[0:n] (n a multiple of 16)
 * folded into the 128 bits x1, then 128 bits to 64, Barrett-reduced to the 32 of the CRC state. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc32_clmul_finish(__m128i x1, const unsigned char *p,
                                                                            Py_ssize_t n) {
    const __m128i k3k4 = _mm_set_epi64x(CRC32_K3, CRC32_K4);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124);
    const __m128i poly = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x0, x2, x5;
    while (n >= 16) {
        x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
        x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), _mm_loadu_si128((const __m128i *)p));
        x1 = _mm_xor_si128(x1, x5);
        p += 16;
        n -= 16;
    }
    x2 = _mm_clmulepi64_si128(x1, k3k4, 0x10); /* 128 bits to 64 */
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, low32);
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, k5k0, 0x00), x2);
    x0 = _mm_and_si128(x1, low32); /* Barrett reduction to 32 bits */
    x0 = _mm_and_si128(_mm_clmulepi64_si128(x0, poly, 0x10), low32);
    x0 = _mm_clmulepi64_si128(x0, poly, 0x00);
    x1 = _mm_xor_si128(x1, x0);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}

/* zlib's CRC-32 state (inverted) continued over p[0:n], n >= 64 and a multiple of 16, by folding with
 * carry-less multiplication (Intel, "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ
 * Instruction", 2009; its bit-reflected constants for the CRC-32 polynomial, as Chromium's zlib and
 * Linux use them): 64 bytes per step in four lanes, folded to 128 then 64 bits, Barrett-reduced to 32. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc32_clmul(uint32_t crc, const unsigned char *p,
                                                                     Py_ssize_t n) {
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
    const __m128i k3k4 = _mm_set_epi64x(CRC32_K3, CRC32_K4);
    __m128i x1 = _mm_loadu_si128((const __m128i *)p), x2 = _mm_loadu_si128((const __m128i *)(p + 0x10));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 0x20));
    __m128i x4 = _mm_loadu_si128((const __m128i *)(p + 0x30));
    __m128i x5, x6, x7, x8;
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    p += 64;
    n -= 64;
    while (n >= 64) { /* four lanes folded 64 bytes ahead */
        x5 = _mm_clmulepi64_si128(x1, k1k2, 0x00);
        x6 = _mm_clmulepi64_si128(x2, k1k2, 0x00);
        x7 = _mm_clmulepi64_si128(x3, k1k2, 0x00);
        x8 = _mm_clmulepi64_si128(x4, k1k2, 0x00);
        x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, k1k2, 0x11), x5);
        x2 = _mm_xor_si128(_mm_clmulepi64_si128(x2, k1k2, 0x11), x6);
        x3 = _mm_xor_si128(_mm_clmulepi64_si128(x3, k1k2, 0x11), x7);
        x4 = _mm_xor_si128(_mm_clmulepi64_si128(x4, k1k2, 0x11), x8);
        x1 = _mm_xor_si128(x1, _mm_loadu_si128((const __m128i *)(p + 0x00)));
        x2 = _mm_xor_si128(x2, _mm_loadu_si128((const __m128i *)(p + 0x10)));
        x3 = _mm_xor_si128(x3, _mm_loadu_si128((const __m128i *)(p + 0x20)));
        x4 = _mm_xor_si128(x4, _mm_loadu_si128((const __m128i *)(p + 0x30)));
        p += 64;
        n -= 64;
    }
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00); /* the four lanes into one, 16 bytes apart */
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x2), x5);
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x3), x5);
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x4), x5);
    return crc32_clmul_finish(x1, p, n);
}

/* crc32_clmul with VPCLMULQDQ on 256-bit vectors (AMD Zen 3 on, Intel Ice Lake on): eight lanes of 16
 * bytes in four vectors, 128 bytes per step, each lane folded 1024 bits ahead (its constants x^(1024-32)
 * and x^(1024+32) modulo the polynomial, bit-reflected, as crc32_clmul's are for 512 bits); then the eight
 * lanes into one, 16 bytes apart, and crc32_clmul_finish. Twice the bytes a step: ~2x crc32_clmul's speed
 * on data in the cache. n >= 128 and a multiple of 16. */
__attribute__((target("avx2,vpclmulqdq,pclmul,sse4.1"))) static uint32_t crc32_vclmul(uint32_t crc,
                                                                                       const unsigned char *p,
                                                                                       Py_ssize_t n) {
    const __m256i k = _mm256_set_epi64x(0x014a7fe880, 0x01e88ef372, 0x014a7fe880, 0x01e88ef372);
    const __m128i k3k4 = _mm_set_epi64x(CRC32_K3, CRC32_K4);
    __m256i y0 = _mm256_loadu_si256((const __m256i *)p), y1 = _mm256_loadu_si256((const __m256i *)(p + 32));
    __m256i y2 = _mm256_loadu_si256((const __m256i *)(p + 64)), y3 = _mm256_loadu_si256((const __m256i *)(p + 96));
    y0 = _mm256_xor_si256(y0, _mm256_setr_epi32((int)crc, 0, 0, 0, 0, 0, 0, 0));
    p += 128;
    n -= 128;
    while (n >= 128) {
        y0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(y0, k, 0x00),
                                               _mm256_clmulepi64_epi128(y0, k, 0x11)),
                              _mm256_loadu_si256((const __m256i *)p));
        y1 = _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(y1, k, 0x00),
                                               _mm256_clmulepi64_epi128(y1, k, 0x11)),
                              _mm256_loadu_si256((const __m256i *)(p + 32)));
        y2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(y2, k, 0x00),
                                               _mm256_clmulepi64_epi128(y2, k, 0x11)),
                              _mm256_loadu_si256((const __m256i *)(p + 64)));
        y3 = _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(y3, k, 0x00),
                                               _mm256_clmulepi64_epi128(y3, k, 0x11)),
                              _mm256_loadu_si256((const __m256i *)(p + 96)));
        p += 128;
        n -= 128;
    }
    const __m128i lanes[8] = {_mm256_castsi256_si128(y0), _mm256_extracti128_si256(y0, 1),
                              _mm256_castsi256_si128(y1), _mm256_extracti128_si256(y1, 1),
                              _mm256_castsi256_si128(y2), _mm256_extracti128_si256(y2, 1),
                              _mm256_castsi256_si128(y3), _mm256_extracti128_si256(y3, 1)};
    __m128i x1 = lanes[0];
    for (int i = 1; i < 8; i++)
        x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), lanes[i]),
                           _mm_clmulepi64_si128(x1, k3k4, 0x00));
    return crc32_clmul_finish(x1, p, n);
}

/* crc32_clmul with VPCLMULQDQ on 512-bit vectors (AMD Zen 4 on, Intel Ice Lake on): sixteen lanes of 16
 * bytes in four vectors, 256 bytes per step, each lane folded 2048 bits ahead (x^(2048-32), x^(2048+32)
 * modulo the polynomial, bit-reflected), the two products and the next bytes xored in one vpternlogq; then
 * the four vectors into the last, 512 bits ahead (crc32_clmul's constants), its whole 64-byte blocks left
 * folded in the same way, its four lanes into one and crc32_clmul_finish. On Zen 4, ~2x crc32_vclmul (its
 * 256-bit multiplications are one a cycle, the 512-bit ones too: ~50 against ~24 GB/s in the cache).
 * n >= 256 and a multiple of 16. */
#define ZFOLD(z, k, next)                                                                                   \
    _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(z, k, 0x00), _mm512_clmulepi64_epi128(z, k, 0x11), \
                              next, 0x96)
__attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.1"))) static uint32_t crc32_zclmul(uint32_t crc,
                                                                                       const unsigned char *p,
                                                                                       Py_ssize_t n) {
    const __m512i k2048 = _mm512_broadcast_i32x4(_mm_set_epi64x(0x01322d1430, 0x011542778a));
    const __m512i k512 = _mm512_broadcast_i32x4(_mm_set_epi64x(0x01c6e41596, 0x0154442bd4));
    const __m128i k3k4 = _mm_set_epi64x(CRC32_K3, CRC32_K4);
    __m512i z0 = _mm512_loadu_si512((const void *)p), z1 = _mm512_loadu_si512((const void *)(p + 64));
    __m512i z2 = _mm512_loadu_si512((const void *)(p + 128)), z3 = _mm512_loadu_si512((const void *)(p + 192));
    z0 = _mm512_xor_si512(z0, _mm512_castsi128_si512(_mm_cvtsi32_si128((int)crc)));
    p += 256;
    n -= 256;
    while (n >= 256) {
        z0 = ZFOLD(z0, k2048, _mm512_loadu_si512((const void *)p));
        z1 = ZFOLD(z1, k2048, _mm512_loadu_si512((const void *)(p + 64)));
        z2 = ZFOLD(z2, k2048, _mm512_loadu_si512((const void *)(p + 128)));
        z3 = ZFOLD(z3, k2048, _mm512_loadu_si512((const void *)(p + 192)));
        p += 256;
        n -= 256;
    }
    z3 = ZFOLD(ZFOLD(ZFOLD(z0, k512, z1), k512, z2), k512, z3);
    for (; n >= 64; p += 64, n -= 64) z3 = ZFOLD(z3, k512, _mm512_loadu_si512((const void *)p));
    __m128i x1 = _mm512_castsi512_si128(z3);
    const __m128i rest[3] = {_mm512_extracti32x4_epi32(z3, 1), _mm512_extracti32x4_epi32(z3, 2),
                             _mm512_extracti32x4_epi32(z3, 3)};
    for (int i = 0; i < 3; i++)
        x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), rest[i]),
                           _mm_clmulepi64_si128(x1, k3k4, 0x00));
    return crc32_clmul_finish(x1, p, n);
}
#undef ZFOLD
#endif

#define ZCLMUL_MIN 256 /* bytes from which crc32_zclmul runs (as fast as crc32_vclmul at 256, faster above) */
#define VCLMUL_MIN 256 /* bytes from which crc32_vclmul pays for its eight lanes' reduction */
#define CRC_SIMD_BEST 3 /* crc32_with's `simd`: 0 the tables alone, 1 PCLMULQDQ at most, 2 VPCLMULQDQ on
                          * 256-bit vectors at most, 3 the best here (512-bit ones) */

/* zlib's crc32(data, crc) of p[0:n]: by carry-less multiplication where the CPU has it (and `simd` allows
 * it: see CRC_SIMD_BEST), for the whole 16-byte blocks of at least 64 bytes (VPCLMULQDQ from VCLMUL_MIN and
 * ZCLMUL_MIN), the slicing-by-8 tables for the rest. */
static uint32_t crc32_with(uint32_t crc, const unsigned char *p, Py_ssize_t n, int simd) {
#ifdef CLMUL_CRC
    if (simd && clmul_crc && n >= 64) {
        Py_ssize_t whole = n & ~(Py_ssize_t)15;
        crc = ~(simd > 2 && zclmul_crc && whole >= ZCLMUL_MIN   ? crc32_zclmul
                : simd > 1 && vclmul_crc && whole >= VCLMUL_MIN ? crc32_vclmul
                                                                : crc32_clmul)(~crc, p, whole);
        p += whole;
        n -= whole;
    }
#else
    (void)simd;
#endif
    return crc_update((const uint32_t(*)[256])crc32_tables, crc, p, n);
}

/* a * b modulo the polynomial, both bit-reflected polynomials, a != 0 (zlib's multmodp). */
static inline uint32_t crc32_multmodp(uint32_t a, uint32_t b) {
    uint32_t m = (uint32_t)1 << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0) return p;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ CRC32_POLY : b >> 1;
    }
}

/* zlib's crc32_combine: crc1 * x^(8 len2) + crc2 modulo the polynomial, x^(8 len2) the product of the
 * x^(2^k) of len2's bits (k from 3: eight bits a byte). */
static inline uint32_t crc32_combine(uint32_t crc1, uint32_t crc2, uint64_t len2) {
    uint32_t p = (uint32_t)1 << 31; /* x^0 */
    for (unsigned k = 3; len2; len2 >>= 1, k++)
        if (len2 & 1) p = crc32_multmodp(crc32_x2n[k & 31], p);
    return crc32_multmodp(p, crc1) ^ crc2;
}

/* The tables, x^(2^k), and whether the CPU multiplies carry-less: once, in the module's init. */
static void crc32_setup(void) {
    crc_init(crc32_tables, CRC32_POLY);
    uint32_t p = (uint32_t)1 << 30; /* x^1 */
    crc32_x2n[0] = p;
    for (int k = 1; k < 32; k++) crc32_x2n[k] = p = crc32_multmodp(p, p);
#ifdef CLMUL_CRC
    __builtin_cpu_init();
    clmul_crc = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    vclmul_crc = clmul_crc && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("vpclmulqdq");
    zclmul_crc = vclmul_crc && __builtin_cpu_supports("avx512f");
#endif
}

#endif
