/*
 * expd.h - the constants of the vector e^x behind the element-wise kernels (sigmoid, silu) of avx512.c,
 * avx2.c and neon.c.
 *
 * A float x is widened to double and clamped to [QW_EXPD_LO, QW_EXPD_HI] (beyond them e^x rounds to 0 or
 * overflows in f32 either way); n = round(x / ln 2) (ties to even), r = x - n ln 2 in two FMA steps
 * (|r| <= 0.347), e^r by its Taylor series to r^11 (relative error below 6.2e-15) in Horner's order, times
 * 2^n, rounded once to f32. So the result is e^x correctly rounded except within about 1e-14 (relative) of
 * a rounding boundary. Against glibc's expf, itself within 0.502 ulp, it differs in 170,648 of the
 * 2,240,806,912 floats of (-110, 90), by one ulp each (counted once, over all of them). NaN stays NaN.
 *
 * qw_expd below is the one-lane form, which ref.c's sigmoid and silu use in place of libm's expf; the
 * vector forms do the same operations in the same order (every step is exact or one IEEE rounding), so
 * every table gives the reference's bits, on any libm.
 */
#ifndef QW_EXPD_H
#define QW_EXPD_H

#include <math.h>

#include "kernels/hostdev.h" /* the CUDA backend's sigmoid and silu use qw_expd too */

#define QW_EXPD_LO (-104.0)
#define QW_EXPD_HI 89.0
#define QW_EXPD_INV_LN2 1.4426950408889634
#define QW_EXPD_LN2_HI 0x1.62e42fefa39efp-1  /* ln 2 rounded to double */
#define QW_EXPD_LN2_LO 0x1.abc9e3b39803fp-56 /* ln 2 - QW_EXPD_LN2_HI */
#define QW_EXPD_N_COEF 12
/* 1 / k! for k = 11 down to 0 */
#define QW_EXPD_COEFS                                                                                              \
    {1.0 / 39916800, 1.0 / 3628800, 1.0 / 362880, 1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24,         \
     1.0 / 6,        0.5,           1.0,          1.0}


/* e^x of one float, as above */
static inline QW_HOST_DEVICE float qw_expd(float x) {
    const double c[QW_EXPD_N_COEF] = QW_EXPD_COEFS;
    if (x != x) return x;
    double xd = fmin(fmax((double)x, QW_EXPD_LO), QW_EXPD_HI);
    double n = nearbyint(xd * QW_EXPD_INV_LN2);
    double r = fma(-n, QW_EXPD_LN2_HI, xd);
    r = fma(-n, QW_EXPD_LN2_LO, r);
    double p = c[0];
    for (int i = 1; i < QW_EXPD_N_COEF; i++) p = fma(p, r, c[i]);
    return (float)ldexp(p, (int)n);
}

#endif
