/* The storage tier's data syscalls, each timed where it is made.
 *
 * Every function releases the GIL, reads CLOCK_MONOTONIC (the clock behind time.perf_counter_ns on
 * Linux), makes the syscall, reads the clock again and only then waits to take the GIL back: the
 * duration it returns is the kernel's, without the interpreter's wait.  A Python bracket
 * (perf_counter_ns(); os.preadv(); perf_counter_ns()) takes its stop timestamp after the GIL is won back,
 * so under load, or beside a CPU-bound thread, it holds up to a switch interval (5 ms) of GIL wait.
 *
 * EINTR is retried as os.preadv does (PEP 475), after running the signal handlers; the retried call's
 * time counts, the handlers' does not.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_IOV 16

static inline long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* `result = call`, timed into `ns` with the GIL released, `err` = its errno; retried while `failed` with
 * EINTR and the signal handlers raised nothing.  A macro, so each syscall's timed path is written out in its
 * function as before (the same machine code), once in the source. */
#define TIMED_RETRY(result, call, failed)                                         \
    for (;;) {                                                                    \
        Py_BEGIN_ALLOW_THREADS                                                    \
        long long t0 = now_ns();                                                  \
        result = call;                                                            \
        ns = now_ns() - t0;                                                       \
        err = errno;                                                              \
        Py_END_ALLOW_THREADS                                                      \
        if ((failed) && err == EINTR && PyErr_CheckSignals() == 0) continue;      \
        break;                                                                    \
    }

/* OSError from `err`, unless a signal handler's exception is already set. */
static void set_os_error(int err) {
    if (!PyErr_Occurred()) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
    }
}

/* pwritev(fd, buffers, offset) -> (bytes written, ns) */
static PyObject *timed_pwritev(PyObject *self, PyObject *args) {
    int fd;
    PyObject *seq;
    long long offset;
    if (!PyArg_ParseTuple(args, "iOL:pwritev", &fd, &seq, &offset)) return NULL;
    PyObject *fast = PySequence_Fast(seq, "pwritev: buffers must be a sequence");
    if (fast == NULL) return NULL;
    Py_ssize_t cnt = PySequence_Fast_GET_SIZE(fast);
    if (cnt < 1 || cnt > MAX_IOV) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "pwritev: 1 to %d buffers, got %zd", MAX_IOV, cnt);
        return NULL;
    }
    Py_buffer views[MAX_IOV];
    struct iovec iov[MAX_IOV];
    Py_ssize_t got = 0;
    for (; got < cnt; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, got), &views[got], PyBUF_SIMPLE) < 0) break;
        iov[got].iov_base = views[got].buf;
        iov[got].iov_len = (size_t)views[got].len;
    }
    PyObject *out = NULL;
    if (got == cnt) {
        ssize_t n;
        long long ns;
        int err;
        TIMED_RETRY(n, pwritev(fd, iov, (int)cnt, (off_t)offset), n < 0)
        if (n < 0) {
            set_os_error(err);
        } else {
            out = Py_BuildValue("(nL)", (Py_ssize_t)n, ns);
        }
    }
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    Py_DECREF(fast);
    return out;
}

/* preadv(fd, buffer, offset) -> (bytes read, ns): one writable buffer */
static PyObject *timed_preadv(PyObject *self, PyObject *args) {
    int fd;
    Py_buffer view;
    long long offset;
    if (!PyArg_ParseTuple(args, "iw*L:preadv", &fd, &view, &offset)) return NULL;
    struct iovec iov = {view.buf, (size_t)view.len};
    ssize_t n;
    long long ns;
    int err;
    TIMED_RETRY(n, preadv(fd, &iov, 1, (off_t)offset), n < 0)
    PyBuffer_Release(&view);
    if (n < 0) {
        set_os_error(err);
        return NULL;
    }
    return Py_BuildValue("(nL)", (Py_ssize_t)n, ns);
}

/* fdatasync(fd) -> ns */
static PyObject *timed_fdatasync(PyObject *self, PyObject *args) {
    int fd, r, err;
    long long ns;
    if (!PyArg_ParseTuple(args, "i:fdatasync", &fd)) return NULL;
    TIMED_RETRY(r, fdatasync(fd), r < 0)
    if (r < 0) {
        set_os_error(err);
        return NULL;
    }
    return PyLong_FromLongLong(ns);
}

/* The OSError of a failed call on `path` (errno `err`, unless a signal handler already raised), with the
 * path's reference (from PyUnicode_FSConverter) given back: NULL, for the caller to return. */
static PyObject *path_error(int err, PyObject *path) {
    if (!PyErr_Occurred()) {
        errno = err;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
    }
    Py_DECREF(path);
    return NULL;
}

/* open(path, flags, mode) -> (fd, ns) */
static PyObject *timed_open(PyObject *self, PyObject *args) {
    PyObject *path;
    int flags, mode = 0777, fd, err;
    long long ns;
    if (!PyArg_ParseTuple(args, "O&i|i:open", PyUnicode_FSConverter, &path, &flags, &mode)) return NULL;
    const char *p = PyBytes_AS_STRING(path);
    TIMED_RETRY(fd, open(p, flags | O_CLOEXEC, mode), fd < 0)
    if (fd < 0) {
        return path_error(err, path);
    }
    Py_DECREF(path);
    return Py_BuildValue("(iL)", fd, ns);
}

/* unlink(path) -> ns (a replaced entry's file, removed inside the write's device time) */
static PyObject *timed_unlink(PyObject *self, PyObject *args) {
    PyObject *path;
    int r, err;
    long long ns;
    if (!PyArg_ParseTuple(args, "O&:unlink", PyUnicode_FSConverter, &path)) return NULL;
    const char *p = PyBytes_AS_STRING(path);
    TIMED_RETRY(r, unlink(p), r < 0)
    if (r < 0) {
        return path_error(err, path);
    }
    Py_DECREF(path);
    return PyLong_FromLongLong(ns);
}

#ifdef POSIX_FADV_DONTNEED
/* fadvise_dontneed(fd) -> ns: posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), the buffered mode's page-cache
 * drop; it returns its error rather than setting errno, and is retried on EINTR as os.posix_fadvise is. */
static PyObject *timed_fadvise_dontneed(PyObject *self, PyObject *args) {
    int fd, r, err;
    long long ns;
    if (!PyArg_ParseTuple(args, "i:fadvise_dontneed", &fd)) return NULL;
    TIMED_RETRY(r, posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), (err = r) != 0)
    if (r != 0) {
        set_os_error(r);
        return NULL;
    }
    return PyLong_FromLongLong(ns);
}
#endif

/* close(fd) -> ns (never retried: Linux closes the descriptor even when close reports EINTR) */
static PyObject *timed_close(PyObject *self, PyObject *args) {
    int fd, r, err;
    long long ns;
    if (!PyArg_ParseTuple(args, "i:close", &fd)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    long long t0 = now_ns();
    r = close(fd);
    ns = now_ns() - t0;
    err = errno;
    Py_END_ALLOW_THREADS
    if (r < 0 && err != EINTR) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLongLong(ns);
}

static PyMethodDef methods[] = {
    {"pwritev", timed_pwritev, METH_VARARGS, "pwritev(fd, buffers, offset) -> (bytes, ns), timed in C"},
    {"preadv", timed_preadv, METH_VARARGS, "preadv(fd, buffer, offset) -> (bytes, ns), timed in C"},
    {"fdatasync", timed_fdatasync, METH_VARARGS, "fdatasync(fd) -> ns, timed in C"},
    {"open", timed_open, METH_VARARGS, "open(path, flags, mode=0o777) -> (fd, ns), timed in C"},
    {"close", timed_close, METH_VARARGS, "close(fd) -> ns, timed in C"},
    {"unlink", timed_unlink, METH_VARARGS, "unlink(path) -> ns, timed in C"},
#ifdef POSIX_FADV_DONTNEED
    {"fadvise_dontneed", timed_fadvise_dontneed, METH_VARARGS,
     "fadvise_dontneed(fd) -> ns: posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), timed in C"},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_timedio",
    "The storage tier's syscalls timed in C with the GIL released (see timedio.py).", -1, methods,
};

#ifndef TIMEDIO_SOURCE_SHA256
#define TIMEDIO_SOURCE_SHA256 "" /* built without setup.py: timedio.py cannot tell it is current */
#endif

/* SOURCE_SHA256: this source's SHA-256 as setup.py computed it (timedio.py compares it with the source). */
PyMODINIT_FUNC PyInit__timedio(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "SOURCE_SHA256", TIMEDIO_SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
