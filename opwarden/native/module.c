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

static PyObject *py_swish(PyObject *self, PyObject *args) {
    Py_buffer X, Y;
    long long off, n;
    float alpha;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*LLf", &X, &Y, &off, &n, &alpha)) return NULL;
    int ok = off >= 0 && n >= 0 && need(&X, (Py_ssize_t)((off + n) * 4), "x") &&
             need(&Y, (Py_ssize_t)((off + n) * 4), "y");
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        swish_f32((const float *)X.buf + off, (float *)Y.buf + off, n, alpha);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "swish: bad arguments");
    }
    PyBuffer_Release(&X); PyBuffer_Release(&Y);
    if (!ok) return NULL;
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
    {"swish", py_swish, METH_VARARGS,
     "swish(x, y, offset, n, alpha): y[i] = x[i] * sigmoid(alpha x[i]) for i in offset.."
     "offset+n-1 (y may be x)"},
    {"openmp", py_openmp, METH_NOARGS, "The _OPENMP version the module was built with, or 0."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_native",
                                    "opwarden's compiled kernels", -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&moddef); }
