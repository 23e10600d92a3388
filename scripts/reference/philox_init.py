"""titan's counter-based weight init, reimplemented in numpy from its definition.

An independent implementation of docs/architecture.md's "Weight init" (the C++ is
model/init_philox.h): element `index` of parameter `fqn` is

    key   = FNV-1a 64 of the fqn's UTF-8 bytes
    words = Philox-4x32-10(counter = (block lo32, block hi16 | attempt << 16, key lo32, key hi32),
                           key = (seed lo32, seed hi32)),  block = index // 2
    b     = top 52 bits of (words[w] << 32 | words[w + 1]),  w = 2 * (index % 2)
    u     = (2 b + 1) / 2^53
    value = float32(std * Phi^-1(u))   (Wichura AS 241; log by exponent split + atanh series)

redrawn with the next attempt while outside [lo, hi] (trunc_normal_'s absolute bounds). Every
float64 operation is the C++'s, in the same order (numpy does not fuse multiply-adds), so the
values are equal bit for bit.
"""
import numpy as np

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK32 = np.uint64(0xFFFFFFFF)


def fqn_hash(fqn):
    h = 0xCBF29CE484222325
    for byte in fqn.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Vectorized over uint64 arrays holding 32-bit values."""
    c = [np.asarray(x, dtype=np.uint64) for x in (c0, c1, c2, c3)]
    k0, k1 = int(k0), int(k1)
    for rnd in range(10):
        if rnd:
            k0, k1 = (k0 + W0) & 0xFFFFFFFF, (k1 + W1) & 0xFFFFFFFF
        p0, p1 = M0 * c[0], M1 * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0), p1 & MASK32,
             (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1), p0 & MASK32]
    return c


def log_positive(x):
    bits = x.view(np.uint64)
    e = ((bits >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64) - 1023
    m = ((bits & np.uint64(0x000FFFFFFFFFFFFF)) | np.uint64(0x3FF0000000000000)).view(np.float64)
    big = m > 1.4142135623730951
    m = np.where(big, m * 0.5, m)
    e = e + big
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    series = np.full_like(s, 1.0 / 23.0)
    for k in (21, 19, 17, 15, 13, 11, 9, 7, 5, 3):
        series = series * s2 + 1.0 / k
    log_m = 2.0 * s + 2.0 * s * (s2 * series)
    ed = e.astype(np.float64)
    return ed * 6.93147180369123816490e-01 + (ed * 1.90821492927058770002e-10 + log_m)


def horner(coeffs, r):
    acc = np.full_like(r, coeffs[0])
    for c in coeffs[1:]:
        acc = acc * r + c
    return acc


A = [2.5090809287301226727e+3, 3.3430575583588128105e+4, 6.7265770927008700853e+4,
     4.5921953931549871457e+4, 1.3731693765509461125e+4, 1.9715909503065514427e+3,
     1.3314166789178437745e+2, 3.3871328727963666080e0]
B = [5.2264952788528545610e+3, 2.8729085735721942674e+4, 3.9307895800092710610e+4,
     2.1213794301586595867e+4, 5.3941960214247511077e+3, 6.8718700749205790830e+2,
     4.2313330701600911252e+1, 1.0]
C = [7.74545014278341407640e-4, 2.27238449892691845833e-2, 2.41780725177450611770e-1,
     1.27045825245236838258e0, 3.64784832476320460504e0, 5.76949722146069140550e0,
     4.63033784615654529590e0, 1.42343711074968357734e0]
D = [1.05075007164441684324e-9, 5.47593808499534494600e-4, 1.51986665636164571966e-2,
     1.48103976427480074590e-1, 6.89767334985100004550e-1, 1.67638483018380384940e0,
     2.05319162663775882187e0, 1.0]
E = [2.01033439929228813265e-7, 2.71155556874348757815e-5, 1.24266094738807843860e-3,
     2.65321895265761230930e-2, 2.96560571828504891230e-1, 1.78482653991729133580e0,
     5.46378491116411436990e0, 6.65790464350110377720e0]
F = [2.04426310338993978564e-15, 1.42151175831644588870e-7, 1.84631831751005468180e-5,
     7.86869131145613259100e-4, 1.48753612908506148525e-2, 1.36929880922735805310e-1,
     5.99832206555887937690e-1, 1.0]


def normal_quantile(p):
    q = p - 0.5
    central = np.abs(q) <= 0.425
    r = 0.180625 - q * q
    out = q * horner(A, r) / horner(B, r)
    tail_p = np.where(q < 0, p, 1.0 - p)
    tail_p = np.where(central, 0.5, tail_p)  # keeps log's argument valid where unused
    rt = np.sqrt(-log_positive(tail_p))
    near = rt - 1.6
    far = rt - 5.0
    tail = np.where(rt <= 5.0, horner(C, near) / horner(D, near), horner(E, far) / horner(F, far))
    tail = np.where(q < 0, -tail, tail)
    return np.where(central, out, tail)


def init_values(seed, fqn, shape, std, lo=-np.inf, hi=np.inf):
    """The full parameter `fqn` of `shape` as float32 (numpy)."""
    n = int(np.prod(shape))
    key = fqn_hash(fqn)
    index = np.arange(n, dtype=np.uint64)
    block = index >> np.uint64(1)
    word = (index & np.uint64(1)).astype(bool)
    values = np.zeros(n, dtype=np.float64)
    todo = np.ones(n, dtype=bool)
    attempt = 0
    while todo.any():
        assert attempt < 0xFFFF, "rejection did not finish"
        b_blk, b_word = block[todo], word[todo]
        w = philox4x32_10(b_blk & MASK32,
                          ((b_blk >> np.uint64(32)) & np.uint64(0xFFFF)) | np.uint64(attempt << 16),
                          np.full_like(b_blk, key & 0xFFFFFFFF), np.full_like(b_blk, key >> 32),
                          seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)
        hi_word = np.where(b_word, w[2], w[0])
        lo_word = np.where(b_word, w[3], w[1])
        b = ((hi_word << np.uint64(32)) | lo_word) >> np.uint64(12)
        u = (np.uint64(2) * b + np.uint64(1)).astype(np.float64) * 2.0 ** -53
        v = std * normal_quantile(u)
        ok = (v >= lo) & (v <= hi)
        idx = np.nonzero(todo)[0]
        values[idx[ok]] = v[ok]
        todo[idx[ok]] = False
        attempt += 1
    return values.astype(np.float32).reshape(shape)
