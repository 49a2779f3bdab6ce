/* The Python binding of opwarden's compiled kernels: buffers in, buffers out, GIL released.
 *
 * Arguments arrive through the buffer protocol, so the build needs no NumPy headers; the
 * Python side (opwarden/native/__init__.py) hands over C-contiguous arrays of the right
 * dtypes and sizes and this file checks the sizes again before any kernel reads them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "native.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static int need(Py_buffer *b, Py_ssize_t bytes, const char *what) {
    if (b->len < bytes) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes given, %zd needed", what, b->len, bytes);
        return 0;
    }
    return 1;
}

static PyObject *py_forest_eval(PyObject *self, PyObject *args) {
    Py_buffer X, nodes, members, roots, leaf_off, leaf_tgt, leaf_w, S, H;
    int is_double, agg, mode_class, n_threads;
    long long n_rows, n_feat, n_targets;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iLLy*y*y*y*y*y*Liiw*w*i", &X, &is_double, &n_rows, &n_feat,
                          &nodes, &members, &roots, &leaf_off, &leaf_tgt, &leaf_w, &n_targets,
                          &agg, &mode_class, &S, &H, &n_threads))
        return NULL;
    forest_t f;
    f.nodes = nodes.buf;
    f.members = members.buf;
    f.roots = roots.buf;
    f.leaf_off = leaf_off.buf;
    f.leaf_tgt = leaf_tgt.buf;
    f.leaf_w = leaf_w.buf;
    f.n_trees = roots.len / 4;
    f.n_feat = n_feat;
    f.n_targets = n_targets;
    f.agg = agg;
    f.mode_class = mode_class;
    int ok = need(&X, (Py_ssize_t)(n_rows * n_feat * (is_double ? 8 : 4)), "X") &&
             need(&S, (Py_ssize_t)(n_rows * n_targets * 8), "scores") &&
             need(&H, (Py_ssize_t)(n_rows * n_targets), "has") &&
             need(&leaf_off, 4, "leaf offsets") && n_threads >= 1;
    if (ok && n_rows > 0) {
        Py_BEGIN_ALLOW_THREADS
        forest_eval(&f, X.buf, is_double, n_rows, S.buf, H.buf, n_threads);
        Py_END_ALLOW_THREADS
    } else if (!ok && !PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "forest_eval: bad arguments");
    }
    PyBuffer_Release(&X); PyBuffer_Release(&nodes); PyBuffer_Release(&members);
    PyBuffer_Release(&roots); PyBuffer_Release(&leaf_off); PyBuffer_Release(&leaf_tgt);
    PyBuffer_Release(&leaf_w); PyBuffer_Release(&S); PyBuffer_Release(&H);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_bias_act(PyObject *self, PyObject *args) {
    Py_buffer Y, B;
    long long rows, cols;
    int act, n_threads, has_bias;
    (void)self;
    if (!PyArg_ParseTuple(args, "w*y*iLLii", &Y, &B, &has_bias, &rows, &cols, &act, &n_threads))
        return NULL;
    int ok = need(&Y, (Py_ssize_t)(rows * cols * 4), "y") &&
             (!has_bias || need(&B, (Py_ssize_t)(cols * 4), "bias")) && n_threads >= 1;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        bias_act_f32(Y.buf, has_bias ? B.buf : NULL, rows, cols, act, n_threads);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "bias_act: bad arguments");
    }
    PyBuffer_Release(&Y); PyBuffer_Release(&B);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_depthwise_nhwc(PyObject *self, PyObject *args) {
    Py_buffer X, T, B, Z, Y;
    int has_bias, has_z, act, n_threads;
    long long g[14], q0, q1;
    float p0, p1;
    dw_args_t a;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*iiLLLLLLLLLLLLLLiffLLi", &X, &T, &B, &Z, &Y, &has_bias,
                          &has_z, &g[0], &g[1], &g[2], &g[3], &g[4], &g[5], &g[6], &g[7],
                          &g[8], &g[9], &g[10], &g[11], &g[12], &g[13], &act, &p0, &p1, &q0,
                          &q1, &n_threads))
        return NULL;
    a.n = g[0]; a.h = g[1]; a.w = g[2]; a.c = g[3]; a.oh = g[4]; a.ow = g[5]; a.kh = g[6];
    a.kw = g[7]; a.sh = g[8]; a.sw = g[9]; a.dh = g[10]; a.dw = g[11]; a.pt = g[12];
    a.pl = g[13];
    Py_ssize_t ybytes = (Py_ssize_t)(a.n * a.oh * a.ow * a.c * 4);
    int ok = a.n >= 0 && a.h >= 0 && a.w >= 0 && a.c >= 0 && a.oh >= 0 && a.ow >= 0 &&
             a.kh >= 1 && a.kw >= 1 && a.sh >= 1 && a.sw >= 1 && a.dh >= 1 && a.dw >= 1 &&
             need(&X, (Py_ssize_t)(a.n * a.h * a.w * a.c * 4), "x") &&
             need(&T, (Py_ssize_t)(a.kh * a.kw * a.c * 4), "taps") &&
             (!has_bias || need(&B, (Py_ssize_t)(a.c * 4), "bias")) &&
             (!has_z || need(&Z, ybytes, "z")) && need(&Y, ybytes, "y") && n_threads >= 1 &&
             q0 >= 0 && q0 <= q1 && q1 <= a.n * a.oh;
    if (ok) {
        a.x = X.buf; a.taps = T.buf; a.y = Y.buf;
        a.bias = has_bias ? B.buf : NULL;
        a.z = has_z ? Z.buf : NULL;
        a.act = act; a.p0 = p0; a.p1 = p1;
        Py_BEGIN_ALLOW_THREADS
        depthwise_nhwc_f32(&a, q0, q1, n_threads);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "depthwise_nhwc: bad arguments");
    }
    PyBuffer_Release(&X); PyBuffer_Release(&T); PyBuffer_Release(&B); PyBuffer_Release(&Z);
    PyBuffer_Release(&Y);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* A bias of softmax_rows: `has`, its float offset, head and row strides (floats, >= 0), and
 * the buffer holding every element an n x m x t block reads. */
static int bias_span(Py_buffer *b, int has, long long off, long long hs, long long rs,
                     long long n, long long m, long long t, const char *what,
                     const float **dst) {
    *dst = NULL;
    if (!has) return 1;
    if (off < 0 || hs < 0 || rs < 0) {
        PyErr_Format(PyExc_ValueError, "%s: negative offset or stride", what);
        return 0;
    }
    if (!need(b, (Py_ssize_t)((off + (n - 1) * hs + (m - 1) * rs + t) * 4), what)) return 0;
    *dst = (const float *)b->buf + off;
    return 1;
}

static PyObject *py_softmax_rows(PyObject *self, PyObject *args) {
    Py_buffer S, B0, B1, I;
    long long n, m, t, o0, hs0, rs0, o1, hs1, rs1;
    int has0, has1;
    float c;
    (void)self;
    if (!PyArg_ParseTuple(args, "w*LLLfy*iLLLy*iLLLw*", &S, &n, &m, &t, &c, &B0, &has0, &o0,
                          &hs0, &rs0, &B1, &has1, &o1, &hs1, &rs1, &I))
        return NULL;
    const float *b0 = NULL, *b1 = NULL;
    int ok = n >= 1 && m >= 1 && t >= 1 && need(&S, (Py_ssize_t)(n * m * t * 4), "scores") &&
             need(&I, (Py_ssize_t)(n * m * 4), "inv") &&
             bias_span(&B0, has0, o0, hs0, rs0, n, m, t, "bias 0", &b0) &&
             bias_span(&B1, has1, o1, hs1, rs1, n, m, t, "bias 1", &b1);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        softmax_rows_f32(S.buf, n, m, t, c, b0, hs0, rs0, b1, hs1, rs1, I.buf);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "softmax_rows: bad arguments");
    }
    PyBuffer_Release(&S); PyBuffer_Release(&B0); PyBuffer_Release(&B1); PyBuffer_Release(&I);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_swish(PyObject *self, PyObject *args) {
    Py_buffer X, Y;
    long long off, n;
    float alpha;
    int n_threads = 1;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*LLf|i", &X, &Y, &off, &n, &alpha, &n_threads))
        return NULL;
    int ok = off >= 0 && n >= 0 && need(&X, (Py_ssize_t)((off + n) * 4), "x") &&
             need(&Y, (Py_ssize_t)((off + n) * 4), "y") && n_threads >= 1;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        swish_f32_threads((const float *)X.buf + off, (float *)Y.buf + off, n, alpha,
                          n_threads);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "swish: bad arguments");
    }
    PyBuffer_Release(&X); PyBuffer_Release(&Y);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_gelu(PyObject *self, PyObject *args) {
    Py_buffer X, Y, B;
    long long off, n, cols;
    int has_bias, mode, n_threads = 1;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*y*iLLLi|i", &X, &Y, &B, &has_bias, &cols, &off, &n, &mode,
                          &n_threads))
        return NULL;
    int ok = off >= 0 && n >= 0 && mode >= GELU_ERF && mode <= GELU_PLAIN_ERF &&
             need(&X, (Py_ssize_t)((off + n) * 4), "x") &&
             need(&Y, (Py_ssize_t)((off + n) * 4), "y") &&
             (!has_bias || (cols >= 1 && need(&B, (Py_ssize_t)(cols * 4), "bias"))) &&
             n_threads >= 1;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        gelu_f32_threads(X.buf, Y.buf, has_bias ? B.buf : NULL, cols, off, off + n, mode,
                         n_threads);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "gelu: bad arguments");
    }
    PyBuffer_Release(&X); PyBuffer_Release(&Y); PyBuffer_Release(&B);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_layernorm(PyObject *self, PyObject *args) {
    Py_buffer X, Y, S, B, M, I;
    int has_scale, has_bias, n_threads;
    long long rows, cols, r0, r1;
    float eps;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*y*iy*iLLfw*w*LLi", &X, &Y, &S, &has_scale, &B, &has_bias,
                          &rows, &cols, &eps, &M, &I, &r0, &r1, &n_threads))
        return NULL;
    int ok = rows >= 0 && cols >= 1 && r0 >= 0 && r0 <= r1 && r1 <= rows &&
             need(&X, (Py_ssize_t)(rows * cols * 4), "x") &&
             need(&Y, (Py_ssize_t)(rows * cols * 4), "y") &&
             (!has_scale || need(&S, (Py_ssize_t)(cols * 4), "scale")) &&
             (!has_bias || need(&B, (Py_ssize_t)(cols * 4), "bias")) &&
             need(&M, (Py_ssize_t)(rows * 4), "mean") &&
             need(&I, (Py_ssize_t)(rows * 4), "inv") && n_threads >= 1;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        layernorm_f32(X.buf, Y.buf, has_scale ? S.buf : NULL, has_bias ? B.buf : NULL, rows,
                      cols, eps, M.buf, I.buf, r0, r1, n_threads);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "layernorm: bad arguments");
    }
    PyBuffer_Release(&X); PyBuffer_Release(&Y); PyBuffer_Release(&S); PyBuffer_Release(&B);
    PyBuffer_Release(&M); PyBuffer_Release(&I);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* Optional int32 vector of `count` entries: NULL when `has` is 0. */
static int opt_i32(Py_buffer *b, int has, Py_ssize_t count, const char *what,
                   const int32_t **dst) {
    *dst = NULL;
    if (!has) return 1;
    if (!need(b, count * 4, what)) return 0;
    *dst = b->buf;
    return 1;
}

static PyObject *py_qgemm_8bit(PyObject *self, PyObject *args) {
    Py_buffer A, Bp, CC, RC, U, V, S, FB, IB, O, SU;
    long long lda, m, n, k, ldo;
    int has_cc, has_rc, has_uv, swap, mode, sidx, bidx, has_fb, has_ib, zy, out_signed;
    int portable, n_threads, isa = 0, has_sums;
    qg_args_t p;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*LLLLy*iy*iy*y*iiiy*iy*iy*iiiiw*Liiy*i", &A, &Bp, &lda, &m,
                          &n, &k, &CC, &has_cc, &RC, &has_rc, &U, &V, &has_uv, &swap, &mode, &S,
                          &sidx, &FB, &has_fb, &IB, &has_ib, &bidx, &zy, &out_signed, &O, &ldo,
                          &portable, &n_threads, &SU, &has_sums))
        return NULL;
    int64_t panels = (n + QG_NR - 1) / QG_NR, groups = (k + 3) / 4;
    int osz = mode == QG_OUT_Q8 ? 1 : 4;
    Py_ssize_t bn = bidx == QG_PER_ROW ? m : n;
    Py_ssize_t sn = sidx == QG_PER_ROW ? m : (sidx == QG_PER_COL ? n : 1);
    int ok = m >= 0 && n >= 0 && k >= 0 && k % 4 == 0 && lda >= k && ldo >= n && mode >= 0 &&
             mode <= 2 && sidx >= 0 && sidx <= 2 && bidx >= 0 && bidx <= 2 && n_threads >= 1 &&
             (m == 0 || need(&A, (Py_ssize_t)((m - 1) * lda + k), "a")) &&
             need(&Bp, (Py_ssize_t)(panels * groups * QG_NR * 4), "packed b") &&
             opt_i32(&CC, has_cc, n, "colc", &p.colc) &&
             opt_i32(&RC, has_rc, m, "rowc", &p.rowc) &&
             opt_i32(&U, has_uv, m, "u", &p.u) && opt_i32(&V, has_uv, n, "v", &p.v) &&
             (mode == QG_OUT_I32 || need(&S, sn * 4, "scale")) &&
             (!has_fb || need(&FB, bn * 4, "fbias")) &&
             opt_i32(&IB, has_ib, bn, "ibias", &p.ibias) &&
             opt_i32(&SU, has_sums, swap ? m : n, "sums", &p.sums) &&
             (m == 0 || need(&O, (Py_ssize_t)(((m - 1) * ldo + n) * osz), "out"));
    if (ok) {
        p.a = A.buf; p.bp = Bp.buf; p.lda = lda; p.m = m; p.n = n; p.k = k; p.ldo = ldo;
        p.swap = swap; p.mode = mode; p.scale_idx = sidx; p.bias_idx = bidx;
        p.out_signed = out_signed; p.portable = portable; p.scale = S.buf;
        p.fbias = has_fb ? FB.buf : NULL; p.zy = zy; p.out = O.buf;
        Py_BEGIN_ALLOW_THREADS
        isa = qgemm_8bit(&p, n_threads);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "qgemm_8bit: bad arguments");
    }
    PyBuffer_Release(&A); PyBuffer_Release(&Bp); PyBuffer_Release(&CC); PyBuffer_Release(&RC);
    PyBuffer_Release(&U); PyBuffer_Release(&V); PyBuffer_Release(&S); PyBuffer_Release(&FB);
    PyBuffer_Release(&IB); PyBuffer_Release(&O); PyBuffer_Release(&SU);
    if (!ok) return NULL;
    return PyLong_FromLong(isa);
}

static PyObject *py_qg_pack_im2col(PyObject *self, PyObject *args) {
    Py_buffer X, P, CS;
    long long g[11];
    int has_cs, n_threads;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*LLLLLLLLLLLw*w*ii", &X, &g[0], &g[1], &g[2], &g[3], &g[4],
                          &g[5], &g[6], &g[7], &g[8], &g[9], &g[10], &P, &CS, &has_cs,
                          &n_threads))
        return NULL;
    long long c = g[0], hp = g[1], wp = g[2], kh = g[3], kw = g[4], sh = g[5], sw = g[6];
    long long dh = g[7], dw = g[8], oh = g[9], ow = g[10];
    long long pix = oh * ow, kk = c * kh * kw;
    int ok = c >= 0 && hp >= 0 && wp >= 0 && kh >= 1 && kw >= 1 && sh >= 1 && sw >= 1 &&
             dh >= 1 && dw >= 1 && oh >= 0 && ow >= 0 && n_threads >= 1 &&
             (oh == 0 || ow == 0 ||
              ((oh - 1) * sh + (kh - 1) * dh < hp && (ow - 1) * sw + (kw - 1) * dw < wp)) &&
             need(&X, (Py_ssize_t)(c * hp * wp), "x") &&
             need(&P, (Py_ssize_t)(((pix + QG_NR - 1) / QG_NR) * ((kk + 3) / 4) * QG_NR * 4),
                  "packed") &&
             (!has_cs || need(&CS, (Py_ssize_t)(pix * 4), "colsum"));
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        qg_pack_im2col_u8(X.buf, c, hp, wp, kh, kw, sh, sw, dh, dw, oh, ow, P.buf,
                          has_cs ? CS.buf : NULL, n_threads);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "qg_pack_im2col: bad arguments");
    }
    PyBuffer_Release(&X); PyBuffer_Release(&P); PyBuffer_Release(&CS);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_requantize_8bit(PyObject *self, PyObject *args) {
    Py_buffer A, B, M, O;
    int acc_f64, has_bias, per_col, out_signed, n_threads;
    long long rows, cols, period;
    float zf;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iy*iy*LLLifiw*i", &A, &acc_f64, &B, &has_bias, &M, &rows,
                          &cols, &period, &per_col, &zf, &out_signed, &O, &n_threads))
        return NULL;
    long long groups = per_col ? cols : period;
    int ok = rows >= 0 && cols >= 0 && period >= 1 && n_threads >= 1 &&
             (per_col || period == 1 || rows % period == 0) &&
             need(&A, (Py_ssize_t)(rows * cols * (acc_f64 ? 8 : 4)), "accumulator") &&
             need(&M, (Py_ssize_t)((per_col || period > 1 ? groups : 1) * 4), "multipliers") &&
             (!has_bias || need(&B, (Py_ssize_t)(groups * 4), "bias")) &&
             need(&O, (Py_ssize_t)(rows * cols), "out");
    if (ok && rows * cols > 0) {
        Py_BEGIN_ALLOW_THREADS
        requantize_8bit(A.buf, acc_f64, has_bias ? (const int32_t *)B.buf : NULL,
                        (const float *)M.buf, rows, cols, period, per_col, zf, out_signed,
                        O.buf, n_threads);
        Py_END_ALLOW_THREADS
    } else if (!ok && !PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "requantize_8bit: bad arguments");
    }
    PyBuffer_Release(&A); PyBuffer_Release(&B); PyBuffer_Release(&M); PyBuffer_Release(&O);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_qconv_im2col(PyObject *self, PyObject *args) {
    Py_buffer X, C;
    int is_signed, n_threads;
    long long off, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow;
    float zp;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*LiLLLLLLLLLLLLLfw*i", &X, &off, &is_signed, &c, &h, &w, &kh,
                          &kw, &sh, &sw, &dh, &dw, &pt, &pl, &oh, &ow, &zp, &C, &n_threads))
        return NULL;
    int ok = off >= 0 && c >= 0 && h >= 1 && w >= 1 && kh >= 1 && kw >= 1 && sh >= 1 &&
             sw >= 1 && dh >= 1 && dw >= 1 && pt >= 0 && pl >= 0 && oh >= 0 && ow >= 0 &&
             n_threads >= 1 && need(&X, (Py_ssize_t)(off + c * h * w), "x") &&
             need(&C, (Py_ssize_t)(c * kh * kw * oh * ow * 4), "cols");
    if (ok && c * oh * ow > 0) {
        Py_BEGIN_ALLOW_THREADS
        qconv_im2col_f32((const uint8_t *)X.buf + off, is_signed, c, h, w, kh, kw, sh, sw, dh,
                         dw, pt, pl, oh, ow, zp, (float *)C.buf, n_threads);
        Py_END_ALLOW_THREADS
    } else if (!ok && !PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "qconv_im2col: bad arguments");
    }
    PyBuffer_Release(&X); PyBuffer_Release(&C);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_quantize_8bit(PyObject *self, PyObject *args) {
    Py_buffer X, Y;
    long long off, n;
    float scale;
    int zp, is_signed, to_8bit;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*LLfiii", &X, &Y, &off, &n, &scale, &zp, &is_signed,
                          &to_8bit))
        return NULL;
    Py_ssize_t fbytes = (Py_ssize_t)((off + n) * 4), qbytes = (Py_ssize_t)(off + n);
    int ok = off >= 0 && n >= 0 && need(&X, to_8bit ? fbytes : qbytes, "x") &&
             need(&Y, to_8bit ? qbytes : fbytes, "y");
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        if (to_8bit)
            quantize_f32_8bit((const float *)X.buf + off, (uint8_t *)Y.buf + off, n, scale, zp,
                              is_signed);
        else
            dequantize_8bit_f32((const uint8_t *)X.buf + off, (float *)Y.buf + off, n, scale, zp,
                                is_signed);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "quantize_8bit: bad arguments");
    }
    PyBuffer_Release(&X); PyBuffer_Release(&Y);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_qlinear_add(PyObject *self, PyObject *args) {
    Py_buffer X, Y, O;
    long long n;
    float rx, ry, fixed;
    int is_signed;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*w*Lfffi", &X, &Y, &O, &n, &rx, &ry, &fixed, &is_signed))
        return NULL;
    int ok = n >= 0 && need(&X, (Py_ssize_t)n, "x") && need(&Y, (Py_ssize_t)n, "y") &&
             need(&O, (Py_ssize_t)n, "out");
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        qlinear_add_8bit(X.buf, Y.buf, O.buf, n, rx, ry, fixed, is_signed);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "qlinear_add: bad arguments");
    }
    PyBuffer_Release(&X); PyBuffer_Release(&Y); PyBuffer_Release(&O);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_sgemm_packed(PyObject *self, PyObject *args) {
    Py_buffer A, Of, Bp, Bi, C;
    long long lda, m, k, n, ldc;
    int has_bias, accumulate, n_threads;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*Ly*LLy*Ly*iw*Lii", &A, &lda, &Of, &m, &k, &Bp, &n, &Bi,
                          &has_bias, &C, &ldc, &accumulate, &n_threads))
        return NULL;
    int64_t panels = (n + 31) / 32, ntaps = Of.len / 8;
    const int64_t *offs = Of.buf;
    int ok = m >= 0 && k >= 0 && n >= 0 && lda >= k && ldc >= n && n_threads >= 1 &&
             ntaps >= 1 && ntaps <= 1 << 20 && Of.len % 8 == 0 && sgemm_packed_isa() &&
             need(&Bp, (Py_ssize_t)(panels * ntaps * k * 32 * 4), "packed b") &&
             (!has_bias || need(&Bi, (Py_ssize_t)(n * 4), "bias")) &&
             (m == 0 || need(&C, (Py_ssize_t)(((m - 1) * ldc + n) * 4), "c"));
    for (int64_t t = 0; ok && m > 0 && t < ntaps; t++) /* every tap's rows inside a */
        ok = offs[t] >= 0 && need(&A, (Py_ssize_t)((offs[t] + (m - 1) * lda + k) * 4), "a");
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        sgemm_packed(A.buf, lda, offs, (int)ntaps, m, k, Bp.buf, n, has_bias ? Bi.buf : NULL,
                     C.buf, ldc, accumulate, n_threads);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "sgemm_packed: bad arguments or no AVX-512F");
    }
    PyBuffer_Release(&A); PyBuffer_Release(&Of); PyBuffer_Release(&Bp); PyBuffer_Release(&Bi);
    PyBuffer_Release(&C);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_sgemm_packed_isa(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    return PyLong_FromLong(sgemm_packed_isa());
}

static PyObject *py_qgemm_isa(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    return PyLong_FromLong(qgemm_isa());
}

static PyObject *py_conv_epilogue(PyObject *self, PyObject *args) {
    Py_buffer Y, B, Z;
    int has_bias, has_z, act, n_threads;
    long long rows, cols;
    float p0, p1;
    (void)self;
    if (!PyArg_ParseTuple(args, "w*y*y*iiLLiffi", &Y, &B, &Z, &has_bias, &has_z, &rows, &cols,
                          &act, &p0, &p1, &n_threads))
        return NULL;
    int ok = rows >= 0 && cols >= 0 && act >= 0 && act <= 6 &&
             need(&Y, (Py_ssize_t)(rows * cols * 4), "y") &&
             (!has_bias || need(&B, (Py_ssize_t)(cols * 4), "bias")) &&
             (!has_z || need(&Z, (Py_ssize_t)(rows * cols * 4), "z")) && n_threads >= 1;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        conv_epilogue_f32(Y.buf, has_bias ? B.buf : NULL, has_z ? Z.buf : NULL, rows, cols,
                          act, p0, p1, n_threads);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "conv_epilogue: bad arguments");
    }
    PyBuffer_Release(&Y); PyBuffer_Release(&B); PyBuffer_Release(&Z);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_cast_f16(PyObject *self, PyObject *args) {
    Py_buffer X, Y;
    long long off, n;
    int to_half, isa, n_threads;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*LLiii", &X, &Y, &off, &n, &to_half, &isa, &n_threads))
        return NULL;
    Py_ssize_t xs = to_half ? 4 : 2, ys = to_half ? 2 : 4;
    int ok = off >= 0 && n >= 0 && isa >= -1 && n_threads >= 1 &&
             need(&X, (Py_ssize_t)((off + n) * xs), "x") &&
             need(&Y, (Py_ssize_t)((off + n) * ys), "y");
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        cast_f16_f32(X.buf, Y.buf, off, off + n, to_half, isa, n_threads);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "cast_f16: bad arguments");
    }
    PyBuffer_Release(&X); PyBuffer_Release(&Y);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_cast_f16_isa(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    return PyLong_FromLong(cast_f16_isa());
}

static PyObject *py_grouped_nhwc(PyObject *self, PyObject *args) {
    Py_buffer X, W, B, Z, Y;
    int has_bias, has_z, pair, act, n_threads;
    long long g[18], q0, q1;
    float p0, p1;
    gc_args_t a;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*iiiLLLLLLLLLLLLLLLLLLiffLLi", &X, &W, &B, &Z, &Y,
                          &has_bias, &has_z, &pair, &g[0], &g[1], &g[2], &g[3], &g[4], &g[5],
                          &g[6], &g[7], &g[8], &g[9], &g[10], &g[11], &g[12], &g[13], &g[14],
                          &g[15], &g[16], &g[17], &act, &p0, &p1, &q0, &q1, &n_threads))
        return NULL;
    a.n = g[0]; a.h = g[1]; a.wd = g[2]; a.c = g[3]; a.oh = g[4]; a.ow = g[5]; a.m = g[6];
    a.group = g[7]; a.cg = g[8]; a.mg = g[9]; a.kh = g[10]; a.kw = g[11]; a.sh = g[12];
    a.sw = g[13]; a.dh = g[14]; a.dw = g[15]; a.pt = g[16]; a.pl = g[17];
    Py_ssize_t ybytes = (Py_ssize_t)(a.n * a.oh * a.ow * a.m * 4);
    int ok = a.n >= 0 && a.h >= 0 && a.wd >= 0 && a.oh >= 0 && a.ow >= 0 && a.group >= 1 &&
             a.cg >= 1 && a.mg >= 1 && a.c == a.group * a.cg && a.m == a.group * a.mg &&
             a.kh >= 1 && a.kw >= 1 && a.sh >= 1 && a.sw >= 1 && a.dh >= 1 && a.dw >= 1 &&
             (!pair || grouped_nhwc_pair_ok(a.group, a.cg, a.mg)) &&
             need(&X, (Py_ssize_t)(a.n * a.h * a.wd * a.c * 4), "x") &&
             need(&W, (Py_ssize_t)(a.m * a.cg * a.kh * a.kw * 4), "weights") &&
             (!has_bias || need(&B, (Py_ssize_t)(a.m * 4), "bias")) &&
             (!has_z || need(&Z, ybytes, "z")) && need(&Y, ybytes, "y") && n_threads >= 1 &&
             q0 >= 0 && q0 <= q1 && q1 <= a.n * a.oh;
    if (ok) {
        a.x = X.buf; a.wp = W.buf; a.y = Y.buf;
        a.bias = has_bias ? B.buf : NULL;
        a.z = has_z ? Z.buf : NULL;
        a.pair = pair; a.act = act; a.p0 = p0; a.p1 = p1;
        Py_BEGIN_ALLOW_THREADS
        grouped_nhwc_f32(&a, q0, q1, n_threads);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "grouped_nhwc: bad arguments");
    }
    PyBuffer_Release(&X); PyBuffer_Release(&W); PyBuffer_Release(&B); PyBuffer_Release(&Z);
    PyBuffer_Release(&Y);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_maxpool_nhwc(PyObject *self, PyObject *args) {
    Py_buffer X, Y;
    long long n, h, w, c, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl;
    int n_threads;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*LLLLLLLLLLLLLLi", &X, &Y, &n, &h, &w, &c, &oh, &ow, &kh,
                          &kw, &sh, &sw, &dh, &dw, &pt, &pl, &n_threads))
        return NULL;
    int ok = n >= 0 && h > 0 && w > 0 && c >= 0 && oh >= 0 && ow >= 0 && kh > 0 && kw > 0 &&
             sh > 0 && sw > 0 && dh > 0 && dw > 0 && n_threads >= 1 &&
             need(&X, (Py_ssize_t)(n * h * w * c * 4), "x") &&
             need(&Y, (Py_ssize_t)(n * oh * ow * c * 4), "y");
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        maxpool_nhwc_f32(X.buf, Y.buf, n, h, w, c, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl,
                         n_threads);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "maxpool_nhwc: bad arguments");
    }
    PyBuffer_Release(&X); PyBuffer_Release(&Y);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_channel_shuffle(PyObject *self, PyObject *args) {
    Py_buffer X, Y;
    long long rows, c, g;
    int n_threads;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*LLLi", &X, &Y, &rows, &c, &g, &n_threads)) return NULL;
    int ok = rows >= 0 && c >= 0 && g >= 1 && c % g == 0 && n_threads >= 1 &&
             need(&X, (Py_ssize_t)(rows * c * 4), "x") &&
             need(&Y, (Py_ssize_t)(rows * c * 4), "y");
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        channel_shuffle_f32(X.buf, Y.buf, rows, c, g, n_threads);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "channel_shuffle: bad arguments");
    }
    PyBuffer_Release(&X); PyBuffer_Release(&Y);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_blas_pool_set(PyObject *self, PyObject *args) {
    unsigned long long setter;
    int on;
    (void)self;
    if (!PyArg_ParseTuple(args, "Kp", &setter, &on)) return NULL;
    int done;
    Py_BEGIN_ALLOW_THREADS /* (waits for a job set in flight) */
    done = blas_pool_set((void *)(uintptr_t)setter, on);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(done);
}

static PyObject *py_blas_pool_counts(PyObject *self, PyObject *args) {
    int64_t team, threads;
    (void)self; (void)args;
    blas_pool_counts(&team, &threads);
    return Py_BuildValue("(LL)", (long long)team, (long long)threads);
}

static PyObject *py_blas_pool_call_in_team(PyObject *self, PyObject *args) {
    unsigned long long fn;
    int n;
    (void)self;
    if (!PyArg_ParseTuple(args, "Ki", &fn, &n)) return NULL;
    if (!fn || n < 1) {
        PyErr_SetString(PyExc_ValueError, "blas_pool_call_in_team: bad arguments");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    blas_pool_call_in_team((void (*)(int))(uintptr_t)fn, n);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_openmp(PyObject *self, PyObject *args) {
    (void)self; (void)args;
#ifdef _OPENMP
    return PyLong_FromLong(_OPENMP);
#else
    return PyLong_FromLong(0);
#endif
}

static PyMethodDef methods[] = {
    {"forest_eval", py_forest_eval, METH_VARARGS,
     "forest_eval(X, is_double, n_rows, n_feat, nodes, members, roots, leaf_off, leaf_tgt, "
     "leaf_w, n_targets, agg, mode_class, scores, has, n_threads)"},
    {"bias_act", py_bias_act, METH_VARARGS,
     "bias_act(y, bias, has_bias, rows, cols, act, n_threads): y = act(y + bias) in place"},
    {"depthwise_nhwc", py_depthwise_nhwc, METH_VARARGS,
     "depthwise_nhwc(x, taps, bias, z, y, has_bias, has_z, n, h, w, c, oh, ow, kh, kw, sh, sw, "
     "dh, dw, pad_top, pad_left, act, p0, p1, row0, row1, n_threads): output rows row0..row1-1 "
     "of an NHWC depthwise conv + epilogue"},
    {"grouped_nhwc", py_grouped_nhwc, METH_VARARGS,
     "grouped_nhwc(x, wp, bias, z, y, has_bias, has_z, pair, n, h, w, c, oh, ow, m, group, cg, "
     "mg, kh, kw, sh, sw, dh, dw, pad_top, pad_left, act, p0, p1, row0, row1, n_threads): "
     "output rows row0..row1-1 of an NHWC grouped conv + epilogue"},
    {"softmax_rows", py_softmax_rows, METH_VARARGS,
     "softmax_rows(s, n, m, t, c, b0, has_b0, off0, hs0, rs0, b1, has_b1, off1, hs1, rs1, inv): "
     "the rows of an n x m x t float32 score block: s = e^(c s + b0 + b1 - max), inv = 1/sum"},
    {"swish", py_swish, METH_VARARGS,
     "swish(x, y, offset, n, alpha[, n_threads]): y[i] = x[i] * sigmoid(alpha x[i]) for i in "
     "offset..offset+n-1 (y may be x)"},
    {"gelu", py_gelu, METH_VARARGS,
     "gelu(x, y, bias, has_bias, cols, offset, n, mode[, n_threads]): y[i] = f(x[i] + "
     "bias[i % cols]) for i in offset..offset+n-1, f Gelu's erf form (mode 0), its tanh form "
     "(1) or erf (2); y may be x"},
    {"layernorm", py_layernorm, METH_VARARGS,
     "layernorm(x, y, scale, has_scale, bias, has_bias, rows, cols, eps, mean, inv, row0, row1, "
     "n_threads): LayerNormalization of rows row0..row1-1 of a [rows, cols] float32 x"},
    {"qgemm_8bit", py_qgemm_8bit, METH_VARARGS,
     "qgemm_8bit(a, packed, lda, m, n, k, colc, has_colc, rowc, has_rowc, u, v, has_uv, swap, "
     "mode, scale, scale_idx, fbias, has_fbias, ibias, has_ibias, bias_idx, zy, out_signed, "
     "out, ldo, portable, n_threads, sums, has_sums) -> the instruction set it ran on: 8-bit rows times packed "
     "panels, int32 exact, epilogue"},
    {"qg_pack_im2col", py_qg_pack_im2col, METH_VARARGS,
     "qg_pack_im2col(x, c, hp, wp, kh, kw, sh, sw, dh, dw, oh, ow, packed, colsum, has_colsum, "
     "n_threads): a padded uint8 image's im2col columns in qgemm_8bit's panel layout"},
    {"requantize_8bit", py_requantize_8bit, METH_VARARGS,
     "requantize_8bit(acc, acc_f64, bias, has_bias, mult, rows, cols, period, per_col, zf, "
     "out_signed, out, n_threads): an exact integer accumulator to 8 bits in one pass"},
    {"qconv_im2col", py_qconv_im2col, METH_VARARGS,
     "qconv_im2col(x, offset, is_signed, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, zp, "
     "cols, n_threads): an 8-bit image's float32 im2col columns less the zero point"},
    {"quantize_8bit", py_quantize_8bit, METH_VARARGS,
     "quantize_8bit(x, y, offset, n, scale, zp, is_signed, to_8bit): per-tensor "
     "QuantizeLinear (to_8bit 1: float32 x -> 8-bit y) or DequantizeLinear (0) of n elements "
     "from offset"},
    {"qlinear_add", py_qlinear_add, METH_VARARGS,
     "qlinear_add(x, y, out, n, rx, ry, fixed, is_signed): com.microsoft QLinearAdd of two "
     "same-shape 8-bit tensors (the reference's fma32 steps)"},
    {"sgemm_packed", py_sgemm_packed, METH_VARARGS,
     "sgemm_packed(a, lda, offs, m, k, packed_b, n, bias, has_bias, c, ldc, accumulate, "
     "n_threads): float32 C (+)= sum over taps of A_t B_t (+ bias row), A_t at a + offs[t] "
     "(int64), B packed in 32-column panels, taps stacked along k"},
    {"sgemm_packed_isa", py_sgemm_packed_isa, METH_NOARGS, "1 if sgemm_packed runs (AVX-512F)."},
    {"qgemm_isa", py_qgemm_isa, METH_NOARGS, "qgemm_8bit's instruction set: 1 AVX512-VNNI, 2 AVX2, 0 portable."},
    {"conv_epilogue", py_conv_epilogue, METH_VARARGS,
     "conv_epilogue(y, bias, z, has_bias, has_z, rows, cols, act, p0, p1, n_threads): "
     "y = act(y + bias + z) in place over a [rows, cols] float32 output"},
    {"cast_f16", py_cast_f16, METH_VARARGS,
     "cast_f16(x, y, offset, n, to_half, isa, n_threads): elements offset..offset+n-1 of "
     "float32 x into float16 y (to_half 1) or of float16 x into float32 y (0), as NumPy's "
     "astype; isa -1 the best path, else at most 0 scalar, 1 F16C, 2 AVX512F"},
    {"cast_f16_isa", py_cast_f16_isa, METH_NOARGS,
     "The float16 conversion path the CPU runs: 2 AVX512F, 1 F16C, 0 scalar."},
    {"channel_shuffle", py_channel_shuffle, METH_VARARGS,
     "channel_shuffle(x, y, rows, c, g, n_threads): ChannelShuffle of float32 rows"},
    {"maxpool_nhwc", py_maxpool_nhwc, METH_VARARGS,
     "maxpool_nhwc(x, y, n, h, w, c, oh, ow, kh, kw, sh, sw, dh, dw, pad_top, pad_left, "
     "n_threads): 2-D MaxPool of an NHWC float32 x"},
    {"blas_pool_set", py_blas_pool_set, METH_VARARGS,
     "blas_pool_set(setter_address, on): OpenBLAS's threading callback through its setter; "
     "False when not set"},
    {"blas_pool_counts", py_blas_pool_counts, METH_NOARGS,
     "(job sets run on an OpenMP team, job sets run on plain threads)"},
    {"blas_pool_call_in_team", py_blas_pool_call_in_team, METH_VARARGS,
     "blas_pool_call_in_team(fn_address, n): fn(thread number) on each thread of a team of n "
     "(a test hook)"},
    {"openmp", py_openmp, METH_NOARGS, "The _OPENMP version the module was built with, or 0."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_native",
                                    "opwarden's compiled kernels", -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&moddef); }
