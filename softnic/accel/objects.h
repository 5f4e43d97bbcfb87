/* What softnic's CPython extensions share (fabric.c, timers.c, output.c,
   requester.c): heapq's order and moves on a list of (time, seq, ...) tuples,
   numbers compared without the generic path, and attribute reads and writes that
   find a ``__slots__`` slot in place.  Each function here does what the Python it
   names does, with the same answers.  Everything is static: each file that
   includes this has its own copies (and each place that uses GA or SA its own
   cache). */

#ifndef SOFTNIC_OBJECTS_H
#define SOFTNIC_OBJECTS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>


/* ------------------------------------------------------------------ the heap */

/* float(v) of a number (a float or an int as such, without the generic path) */
static inline double as_double(PyObject *v)
{
    if (PyFloat_CheckExact(v))
        return PyFloat_AS_DOUBLE(v);
    if (PyLong_CheckExact(v))
        return PyLong_AsDouble(v);
    return PyFloat_AsDouble(v);
}

static inline double entry_time(PyObject *e)
{
    return as_double(PyTuple_GET_ITEM(e, 0));
}

/* op's answer from a comparison's three outcomes (a NaN: none of them) */
static inline int answer(int lt, int eq, int gt, int op)
{
    switch (op) {
    case Py_LT: return lt;
    case Py_LE: return lt || eq;
    case Py_EQ: return eq;
    case Py_NE: return !eq;
    case Py_GT: return gt;
    default: return gt || eq;
    }
}

/* PyObject_RichCompareBool(a, b, op), the same answer without the generic path for
   two floats or two ints of a long long (times, deadlines and seqs), and for == and
   != of such a number and None (a deadline not set); for == and != an object is
   equal to itself first, as there. */
static inline int compare(PyObject *a, PyObject *b, int op)
{
    if (a == b && (op == Py_EQ || op == Py_NE))
        return op == Py_EQ;
    if ((a == Py_None) != (b == Py_None) && (op == Py_EQ || op == Py_NE)) {
        PyObject *o = a == Py_None ? b : a;     /* a number is never None */
        if (PyFloat_CheckExact(o) || PyLong_CheckExact(o))
            return op == Py_NE;
    }
    if (PyFloat_CheckExact(a) && PyFloat_CheckExact(b)) {
        double x = PyFloat_AS_DOUBLE(a), y = PyFloat_AS_DOUBLE(b);
        return answer(x < y, x == y, x > y, op);
    }
    if (PyLong_CheckExact(a) && PyLong_CheckExact(b)) {
        int oa, ob;
        long long i = PyLong_AsLongLongAndOverflow(a, &oa), j = PyLong_AsLongLongAndOverflow(b, &ob);
        if (!oa && !ob && !((i == -1 || j == -1) && PyErr_Occurred()))
            return answer(i < j, i == j, i > j, op);
        PyErr_Clear();
    }
    return PyObject_RichCompareBool(a, b, op);
}

/* heapq's order on (time, seq, ...) with unique seqs: time, then seq.  -1: error. */
static inline int entry_lt(PyObject *a, PyObject *b)
{
    double ta = entry_time(a), tb = entry_time(b);
    if (ta != tb)
        return ta < tb;
    return compare(PyTuple_GET_ITEM(a, 1), PyTuple_GET_ITEM(b, 1), Py_LT);
}

/* heapq.heappush: steals nothing; the list takes its own reference. */
static inline int heap_push(PyObject *heap, PyObject *e)
{
    if (PyList_Append(heap, e) < 0)
        return -1;
    PyObject **a = ((PyListObject *)heap)->ob_item;
    Py_ssize_t pos = PyList_GET_SIZE(heap) - 1;
    PyObject *item = a[pos];
    while (pos > 0) {
        Py_ssize_t parent = (pos - 1) >> 1;
        int lt = entry_lt(item, a[parent]);
        if (lt < 0)
            return -1;
        if (!lt)
            break;
        a[pos] = a[parent];
        pos = parent;
    }
    a[pos] = item;
    return 0;
}

/* heapq.heappop (the heap is not empty): a new reference. */
static inline PyObject *heap_pop(PyObject *heap)
{
    Py_ssize_t n = PyList_GET_SIZE(heap) - 1;
    PyObject **a = ((PyListObject *)heap)->ob_item;
    PyObject *last = a[n];              /* the list's reference becomes ours: */
    Py_SET_SIZE(heap, n);               /* as list.pop() shrinks it (the allocation kept) */
    if (n == 0)
        return last;
    a = ((PyListObject *)heap)->ob_item;
    PyObject *top = a[0];               /* the list's reference becomes the caller's */
    /* heapq's _siftup: the smaller child up to a leaf, then last down from there */
    Py_ssize_t pos = 0, child;
    while ((child = 2 * pos + 1) < n) {
        Py_ssize_t right = child + 1;
        if (right < n) {
            int lt = entry_lt(a[child], a[right]);
            if (lt < 0)
                goto fail;
            if (!lt)
                child = right;
        }
        a[pos] = a[child];
        pos = child;
    }
    while (pos > 0) {
        Py_ssize_t parent = (pos - 1) >> 1;
        int lt = entry_lt(last, a[parent]);
        if (lt < 0)
            goto fail;
        if (!lt)
            break;
        a[pos] = a[parent];
        pos = parent;
    }
    a[pos] = last;                      /* the reference taken above */
    return top;
fail:
    a[pos] = last;
    return top;                         /* (the error is set; the caller checks) */
}

/* ------------------------------------------------------------------ attributes */

/* The member a slot of ``__slots__`` is (T_OBJECT_EX), as generic attribute access
   finds it: a data descriptor of the type, which no instance dict overrides. */
static inline PyObject **slot(PyObject *o, PyObject *name, int writing)
{
    PyTypeObject *t = Py_TYPE(o);
    if (writing ? t->tp_setattro != PyObject_GenericSetAttr
                : t->tp_getattro != PyObject_GenericGetAttr)
        return NULL;
    PyObject *d = _PyType_Lookup(t, name);              /* borrowed; the type's cache */
    if (d == NULL || Py_TYPE(d) != &PyMemberDescr_Type)
        return NULL;
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != T_OBJECT_EX || (writing && (m->flags & READONLY)))
        return NULL;
    return (PyObject **)((char *)o + m->offset);
}

/* Each place that reads or writes an attribute keeps what it last found there (a
   ``site``: the type, the name, the type's version tag, the slot's offset or -1),
   so a place that sees one type, as most do, finds its slot without a lookup;
   another type or name, or the type changed, goes through ``slot`` again.  (A
   version tag is never reused, so a type freed and another made at its address
   cannot match.) */
struct site {
    PyTypeObject *type;
    PyObject *name;                     /* (a place may ask for one of two names) */
    unsigned int tag;
    Py_ssize_t offset;                  /* -1: not a slot (or not to be read in place) */
};

static inline PyObject **site_slot(struct site *s, PyObject *o, PyObject *name, int writing)
{
    PyTypeObject *t = Py_TYPE(o);
    if (s->type != t || s->name != name || s->tag != t->tp_version_tag
        || !(t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) {
        PyObject **p = slot(o, name, writing);
        if (t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) {
            s->type = t;
            s->name = name;
            s->tag = t->tp_version_tag;
            s->offset = p == NULL ? -1 : (Py_ssize_t)((char *)p - (char *)o);
        }
        return p;
    }
    return s->offset < 0 ? NULL : (PyObject **)((char *)o + s->offset);
}

/* getattr(o, name): a slot read in place, anything else as Python reads it. */
static inline PyObject *ga(struct site *s, PyObject *o, PyObject *name)
{
    PyObject **p = site_slot(s, o, name, 0);
    if (p != NULL && *p != NULL)
        return Py_NewRef(*p);
    return PyObject_GetAttr(o, name);       /* (an unset slot raises there) */
}

/* setattr(o, name, v) */
static inline int sa(struct site *s, PyObject *o, PyObject *name, PyObject *v)
{
    PyObject **p = site_slot(s, o, name, 1);
    if (p == NULL)
        return PyObject_SetAttr(o, name, v);
    Py_XSETREF(*p, Py_NewRef(v));
    return 0;
}

/* v = the interned string s, or fail the init function it stands in (-1) */
#define INTERN(v, s) if ((v = PyUnicode_InternFromString(s)) == NULL) return -1

/* GA and SA are ga and sa with a site of their own where they are written (as are
   the helpers below that read or write an attribute) */
#define GA(o, name) ({ static struct site site_; ga(&site_, (o), (name)); })
#define SA(o, name, v) ({ static struct site site_; sa(&site_, (o), (name), (v)); })

/* ------------------------------------------------------------------ helpers */

static inline int take_double(PyObject *v, double *out)
{
    if (v == NULL)
        return -1;
    *out = as_double(v);
    Py_DECREF(v);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* *out = float(o.name) */
#define get_double(o, name, out) take_double(GA(o, name), (out))

/* int(v), v taken (a new reference), as a long long in *out; -1: error */
static inline int take_ll(PyObject *v, long long *out)
{
    if (v == NULL)
        return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* *out = int(o.name) */
#define get_ll(o, name, out) take_ll(GA(o, name), (out))

/* o.name = v (an int) */
#define set_ll(o, name, v) ({ PyObject *v_ = PyLong_FromLongLong(v); \
    int r_ = v_ == NULL ? -1 : SA(o, name, v_); Py_XDECREF(v_); r_; })

/* int(v) as 32 bits unsigned in *out, v taken (NULL: the error already set); -1: error */
static inline int take_u32(PyObject *v, uint32_t *out)
{
    if (v == NULL)
        return -1;
    unsigned long c = PyLong_AsUnsignedLong(v);
    Py_DECREF(v);
    if (c == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    *out = (uint32_t)c;
    return 0;
}

/* memo[key], memo taken (a dict; NULL: the error already set): a new reference, or
   NULL with no error where it holds none (or is not a dict: the caller's Python asks) */
static inline PyObject *memo_get(PyObject *memo, PyObject *key)
{
    PyObject *v = memo != NULL && PyDict_CheckExact(memo)
        ? Py_XNewRef(PyDict_GetItemWithError(memo, key)) : NULL;
    Py_XDECREF(memo);
    return v;
}

/* The ICRC starts a device remembers (``dev.tx_starts``, ``dev.rx_starts``: each a
   pure function of its key, an address and four numbers, and of the device's
   own address, fixed), asked the same few keys for every packet: the last
   START_WAYS answers each file's compiled paths found, kept in C in front of the
   dict (whose tuple key costs more to build, hash and compare than the answer
   costs to find here).  An entry holds its memo and address, so neither's
   identity is reused while it is kept; an address equal to the entry's, not the
   same object, matches as in the dict. */
#define START_WAYS 8
struct start_way { PyObject *memo, *addr; long long k[4]; uint32_t v; };
static struct start_way start_ways[START_WAYS];
static unsigned start_next;

static inline int start_known(PyObject *memo, PyObject *addr, const long long k[4],
                              uint32_t *out)
{
    for (int i = 0; i < START_WAYS; i++) {
        struct start_way *w = &start_ways[i];
        if (w->memo != memo || w->k[0] != k[0] || w->k[1] != k[1] || w->k[2] != k[2]
                || w->k[3] != k[3])
            continue;
        int eq = w->addr == addr ? 1 : PyObject_RichCompareBool(w->addr, addr, Py_EQ);
        if (eq < 0) {
            PyErr_Clear();
            continue;
        }
        if (eq) {
            *out = w->v;
            return 1;
        }
    }
    return 0;
}

static inline void start_keep(PyObject *memo, PyObject *addr, const long long k[4], uint32_t v)
{
    struct start_way *w = &start_ways[start_next++ % START_WAYS];
    Py_XSETREF(w->memo, Py_NewRef(memo));
    Py_XSETREF(w->addr, Py_NewRef(addr));
    memcpy(w->k, k, sizeof(w->k));
    w->v = v;
}

/* module.name(args...), the function looked up at each call (a test's stand-in or a
   tracer put in the module's place is the one called) */
static inline PyObject *call_fn(PyObject *module, PyObject *name, PyObject *const *args,
                                Py_ssize_t n)
{
    PyObject *f = PyObject_GetAttr(module, name);
    if (f == NULL)
        return NULL;
    PyObject *r = PyObject_Vectorcall(f, args, n, NULL);
    Py_DECREF(f);
    return r;
}

/* An ICRC start a device remembers (``dev.tx_starts`` or ``dev.rx_starts``, named
   ``memo_name``): from the C cache (``start_known``), else from that dict by its
   key ``(addr, k[0], ..., k[nk - 1])``, else ``module.fn_name(dev, addr, k...)``
   (the Python's, which keeps it there); kept in the C cache then */
static inline int icrc_start_memo(PyObject *dev, PyObject *memo_name, PyObject *module,
                                  PyObject *fn_name, PyObject *addr, const long long k[4],
                                  int nk, uint32_t *out)
{
    PyObject *memo = GA(dev, memo_name);
    if (memo == NULL)
        return -1;
    if (start_known(memo, addr, k, out)) {
        Py_DECREF(memo);
        return 0;
    }
    PyObject *key = PyTuple_New(1 + nk), *v = NULL;
    if (key == NULL) {
        Py_DECREF(memo);
        return -1;
    }
    PyTuple_SET_ITEM(key, 0, Py_NewRef(addr));
    for (int i = 0; i < nk; i++) {
        PyObject *x = PyLong_FromLongLong(k[i]);
        if (x == NULL) {
            Py_DECREF(key);
            Py_DECREF(memo);
            return -1;
        }
        PyTuple_SET_ITEM(key, 1 + i, x);
    }
    v = memo_get(Py_NewRef(memo), key);
    if (v == NULL && !PyErr_Occurred()) {
        PyObject *args[6] = {dev, addr};
        for (int i = 0; i < nk; i++)
            args[2 + i] = PyTuple_GET_ITEM(key, 1 + i);
        v = call_fn(module, fn_name, args, 2 + nk);
    }
    Py_DECREF(key);
    int r = take_u32(v, out);
    if (r == 0)
        start_keep(memo, addr, k, *out);
    Py_DECREF(memo);
    return r;
}

/* bool(v), v taken: 1, 0, -1 */
static inline int take_truth(PyObject *v)
{
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* bool(o.name): 1, 0, -1 */
#define get_truth(o, name) take_truth(GA(o, name))

static inline int set_double_at(struct site *s, PyObject *o, PyObject *name, double v)
{
    PyObject *f = PyFloat_FromDouble(v);
    if (f == NULL)
        return -1;
    int r = sa(s, o, name, f);
    Py_DECREF(f);
    return r;
}

/* o.name = v (a float) */
#define set_double(o, name, v) ({ static struct site site_; set_double_at(&site_, (o), (name), (v)); })

/* v + by: a new reference (an int that fits in a long long added as one) */
static inline PyObject *plus(PyObject *v, long long by)
{
    if (PyLong_CheckExact(v)) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (!overflow && !(x == -1 && PyErr_Occurred()) && x < (1LL << 62) && x > -(1LL << 62))
            return PyLong_FromLongLong(x + by);
        PyErr_Clear();
    }
    PyObject *b = PyLong_FromLongLong(by);
    if (b == NULL)
        return NULL;
    PyObject *r = PyNumber_Add(v, b);
    Py_DECREF(b);
    return r;
}

/* d[key] += by, or d[key] = by (an int) */
static inline int dict_add(PyObject *d, PyObject *key, long long by)
{
    PyObject *v = PyDict_GetItemWithError(d, key);
    if (v == NULL) {
        if (PyErr_Occurred())
            return -1;
        v = PyLong_FromLongLong(by);
    } else {
        v = plus(v, by);
    }
    if (v == NULL)
        return -1;
    int r = PyDict_SetItem(d, key, v);
    Py_DECREF(v);
    return r;
}

/* Does ``tp``, a subclass of dict, keep dict's own ``__getitem__`` and
   ``__setitem__`` (``device.Counters``, which adds ``__missing__`` only; or a
   ``collections.Counter``, whose ``__delitem__`` makes CPython route every item
   write through a method lookup)?  Then reading and writing its items as a
   dict's is what its own ``[]`` does.  The answer for the last such type asked
   is kept. */
static inline int dict_items_plain(PyTypeObject *tp)
{
    static PyTypeObject *plain;
    if (tp == plain)
        return 1;
    int r = 0;
    PyObject *get = PyObject_GetAttrString((PyObject *)tp, "__getitem__"),
             *set = get ? PyObject_GetAttrString((PyObject *)tp, "__setitem__") : NULL,
             *dget = set ? PyObject_GetAttrString((PyObject *)&PyDict_Type, "__getitem__") : NULL,
             *dset = dget ? PyObject_GetAttrString((PyObject *)&PyDict_Type, "__setitem__") : NULL;
    if (dset == NULL)
        PyErr_Clear();
    else if (get == dget && set == dset) {
        plain = tp;
        r = 1;
    }
    Py_XDECREF(get);
    Py_XDECREF(set);
    Py_XDECREF(dget);
    Py_XDECREF(dset);
    return r;
}

/* counters[name] += by (a device's counters: ``device.Counters``, so a name
   missing counts from 0), as a dict's where its type reads and writes items as
   dict does (``dict_items_plain``), item by item otherwise */
static inline int counter_add(PyObject *counters, PyObject *name, long long by)
{
    if (PyDict_CheckExact(counters)
            || (PyDict_Check(counters) && dict_items_plain(Py_TYPE(counters))))
        return dict_add(counters, name, by);
    PyObject *c = PyObject_GetItem(counters, name), *c1 = c ? plus(c, by) : NULL;
    int r = c1 == NULL ? -1 : PyObject_SetItem(counters, name, c1);
    Py_XDECREF(c);
    Py_XDECREF(c1);
    return r;
}

/* dev.counters[name] += by (``counter_add`` on the device's counters) */
static inline int dev_count(PyObject *dev, PyObject *name, long long by)
{
    static PyObject *s_counters_;
    if (s_counters_ == NULL && (s_counters_ = PyUnicode_InternFromString("counters")) == NULL)
        return -1;
    PyObject *counters = GA(dev, s_counters_);
    if (counters == NULL)
        return -1;
    int r = counter_add(counters, name, by);
    Py_DECREF(counters);
    return r;
}

static inline int attr_add_at(struct site *r, struct site *w, PyObject *o, PyObject *name, long long by)
{
    PyObject *v = ga(r, o, name);
    if (v == NULL)
        return -1;
    PyObject *s = plus(v, by);
    Py_DECREF(v);
    if (s == NULL)
        return -1;
    int res = sa(w, o, name, s);
    Py_DECREF(s);
    return res;
}

/* o.name += by */
#define attr_add(o, name, by) \
    ({ static struct site read_, write_; attr_add_at(&read_, &write_, (o), (name), (by)); })

/* o.name(), as Python calls a method (no bound method made) */
static inline PyObject *call0(PyObject *o, PyObject *name)
{
    PyObject *args[2] = {NULL, o};
    return PyObject_VectorcallMethod(name, args + 1, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* o.name(a) */
static inline PyObject *call1(PyObject *o, PyObject *name, PyObject *a)
{
    PyObject *args[3] = {NULL, o, a};
    return PyObject_VectorcallMethod(name, args + 1, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* dev.mark_ready(qp): where dev's class has Device's own method, its one line
   (``self._ready[qp] = None``), without the call; a subclass's method or a
   stand-in put in its place is called.  Device's method is looked up once. */
static inline int mark_ready(PyObject *dev, PyObject *qp)
{
    static PyObject *s_mark_ready_, *s_ready_, *own;
    static int looked;
    if (!looked) {
        looked = 1;
        PyObject *m = PyImport_ImportModule("softnic.core.device"),
                 *c = m ? PyObject_GetAttrString(m, "Device") : NULL;
        s_mark_ready_ = PyUnicode_InternFromString("mark_ready");
        s_ready_ = PyUnicode_InternFromString("_ready");
        if (c != NULL && PyType_Check(c) && s_mark_ready_ != NULL && s_ready_ != NULL)
            own = Py_XNewRef(_PyType_Lookup((PyTypeObject *)c, s_mark_ready_));
        Py_XDECREF(m);
        Py_XDECREF(c);
        if (s_mark_ready_ == NULL)
            return -1;
        PyErr_Clear();
    }
    if (own != NULL && _PyType_Lookup(Py_TYPE(dev), s_mark_ready_) == own) {
        PyObject *ready = GA(dev, s_ready_);
        if (ready == NULL)
            return -1;
        int r = PyDict_CheckExact(ready) ? PyDict_SetItem(ready, qp, Py_None)
                                         : PyObject_SetItem(ready, qp, Py_None);
        Py_DECREF(ready);
        return r;
    }
    PyObject *r = call1(dev, s_mark_ready_, qp);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* dev.qps.get(qpn): the QP, a new reference, or NULL (with no error where there is
   none such) */
static inline PyObject *qp_of(PyObject *dev, long long qpn)
{
    static PyObject *s_qps_;
    if (s_qps_ == NULL && (s_qps_ = PyUnicode_InternFromString("qps")) == NULL)
        return NULL;
    PyObject *qps = GA(dev, s_qps_), *key = NULL, *qp = NULL;
    if (qps != NULL && (key = PyLong_FromLongLong(qpn)) != NULL)
        qp = PyDict_CheckExact(qps) ? Py_XNewRef(PyDict_GetItemWithError(qps, key))
                                    : PyObject_CallMethod(qps, "get", "O", key);
    if (qp == Py_None)
        Py_CLEAR(qp);
    Py_XDECREF(qps);
    Py_XDECREF(key);
    return qp;
}

/* tuple(src) == qp.dest: is the datagram from the QP's peer?  1, 0, -1 */
static inline int from_peer(PyObject *qp, PyObject *src)
{
    static PyObject *s_dest_;
    if (s_dest_ == NULL && (s_dest_ = PyUnicode_InternFromString("dest")) == NULL)
        return -1;
    PyObject *s = PyTuple_CheckExact(src) ? Py_NewRef(src) : PySequence_Tuple(src), *d = NULL;
    int ok = s == NULL || (d = GA(qp, s_dest_)) == NULL ? -1 : PyObject_RichCompareBool(s, d, Py_EQ);
    Py_XDECREF(s);
    Py_XDECREF(d);
    return ok;
}

/* A WQE's ``sges`` (a list of (addr, length, lkey) tuples, as posts make it): 1 and
   its one SGE's fields; 2 a list of another count; 0 another shape; -1 an error */
static inline int one_sge(PyObject *sges, long long *addr, long long *length, long long *lkey)
{
    if (!PyList_CheckExact(sges))
        return 0;
    if (PyList_GET_SIZE(sges) != 1)
        return 2;
    PyObject *sge = PyList_GET_ITEM(sges, 0);
    if (!PyTuple_CheckExact(sge) || PyTuple_GET_SIZE(sge) != 3)
        return 0;
    if (take_ll(Py_NewRef(PyTuple_GET_ITEM(sge, 0)), addr) < 0
        || take_ll(Py_NewRef(PyTuple_GET_ITEM(sge, 1)), length) < 0
        || take_ll(Py_NewRef(PyTuple_GET_ITEM(sge, 2)), lkey) < 0)
        return -1;
    return 1;
}

#endif
