/* A device's timers (softnic.core.timers.Timers), compiled.

   ``Timers.arm``, ``Timers.get_timer``, ``Timers.handle_timer`` and
   ``Timers._arm_ready``, statement for statement, over the device's and its QPs'
   own Python objects: the heap is the device's list of ``(deadline, seq, qp)``
   tuples in heapq's order (objects.h's ``heap_push`` and ``heap_pop``), a QP's
   ``timer_times`` its set, the ready QPs the device's dict.  What a timer does is
   not here: the completer's ``on_timeout``, a controller's ``next_timer`` and
   ``on_timer``, the device's ``drain_idle`` and the CM agent's timers are called
   as the Python calls them (``on_timeout`` looked up in its module at each call,
   as the Python's global is).  The rules (when a QP is due, which entry stands
   for it, when a QP is left to the drain) live in timers.py; this file is a
   faster way through them.

   ``device_methods(cls, ...)`` makes ``arm``, ``get_timer`` and ``handle_timer``
   (and output.c's drain) methods of a device class; ``softnic.accel.give_compiled``
   makes them the class's in place of the Python's (a device class that overrides
   any of the timers keeps its own; a subclass's own ``arm`` is called as
   ``self.arm`` would).  Methods of the class, not attributes of each device:
   CPython caches a method's and an attribute's lookup at each reading site only
   while the device's class and its instances' keys stay as they are.  A device's ``Timers`` object
   (made on the first call, kept at ``dev._ctimers``) holds its heap (the list at
   ``dev._timers``, which a device never replaces) and counts its seqs on from
   ``dev._tseq`` (where the Python's ``arm`` counts them).
   tests/test_timers.py drives both with the same random armings, controllers and
   clock and compares every answer. */

#include "objects.h"

static PyObject *completer_module;

/* one device's timers */
typedef struct {
    PyObject_HEAD
    PyObject *dev;
    PyObject *heap;                     /* dev._timers: (deadline, seq, qp) in heapq's order */
    long long seq;                      /* the last seq given an entry */
} Timers;
static PyObject *s_comp, *s_rto_at, *s_probe_at, *s_rnr_at, *s_cc, *s_ccs, *s_pace_at,
    *s_next_timer, *s_timer_at, *s_timer_times, *s_tseq, *s_timers, *s_ready, *s_gsi,
    *s_get_timer, *s_handle_timer, *s_closed, *s_on_timer, *s_drain_idle, *s_rnr_wait,
    *s_on_timeout, *s_ctimers, *s_arm, *kw_now;

static int arm_self(Timers *self, PyObject *qp);

/* ``if a is not None and (t is None or a < t): t = a``, with a (a new reference)
   taken: *t holds a new reference throughout.  -1: error. */
static inline int earlier(PyObject **t, PyObject *a)
{
    if (a == NULL)
        return -1;
    if (a != Py_None) {
        int lt = 1;
        if (*t != Py_None && (lt = compare(a, *t, Py_LT)) < 0) {
            Py_DECREF(a);
            return -1;
        }
        if (lt) {
            Py_SETREF(*t, a);
            return 0;
        }
    }
    Py_DECREF(a);
    return 0;
}

/* Timers.arm(dev, qp) */
static int arm_qp(Timers *self, PyObject *qp)
{
    int r = -1;
    PyObject *t = NULL, *cc = NULL, *ccs = NULL, *cur = NULL, *times = NULL, *seq = NULL;
    PyObject *comp = GA(qp, s_comp);
    if (comp == NULL)
        return -1;
    t = GA(comp, s_rto_at);
    if (t == NULL || earlier(&t, GA(comp, s_probe_at)) < 0
        || earlier(&t, GA(comp, s_rnr_at)) < 0)
        goto out;
    if ((cc = GA(qp, s_cc)) == NULL)
        goto out;
    if (cc != Py_None) {
        if ((ccs = GA(qp, s_ccs)) == NULL || earlier(&t, GA(ccs, s_pace_at)) < 0
            || earlier(&t, call0(cc, s_next_timer)) < 0)
            goto out;
    }
    if ((cur = GA(qp, s_timer_at)) == NULL)
        goto out;
    int same = compare(t, cur, Py_EQ);          /* if t == qp.timer_at: return */
    if (same) {
        r = same < 0 ? -1 : 0;
        goto out;
    }
    if (SA(qp, s_timer_at, t) < 0)
        goto out;
    if (t != Py_None) {
        if ((times = GA(qp, s_timer_times)) == NULL)
            goto out;
        int in;                                 /* if t not in times: times.add(t), push */
        if (PySet_CheckExact(times)) {          /* (one lookup: the add, and whether it grew) */
            Py_ssize_t n = PySet_GET_SIZE(times);
            if (PySet_Add(times, t) < 0)
                goto out;
            in = PySet_GET_SIZE(times) == n;
        } else {
            if ((in = PySequence_Contains(times, t)) < 0)
                goto out;
            if (!in) {
                PyObject *res = PyObject_CallMethod(times, "add", "O", t);
                if (res == NULL)
                    goto out;
                Py_DECREF(res);
            }
        }
        if (!in) {                              /* self._tseq = seq = self._tseq + 1 */
            if ((seq = PyLong_FromLongLong(self->seq + 1)) == NULL)
                goto out;
            self->seq++;
            PyObject *e = PyTuple_Pack(3, t, seq, qp);
            if (e == NULL || heap_push(self->heap, e) < 0) {
                Py_XDECREF(e);
                goto out;
            }
            Py_DECREF(e);
        }
    }
    r = 0;
out:
    Py_DECREF(comp);
    Py_XDECREF(t);
    Py_XDECREF(cc);
    Py_XDECREF(ccs);
    Py_XDECREF(cur);
    Py_XDECREF(times);
    Py_XDECREF(seq);
    return r;
}

/* qp.timer_times.discard(t): -1 on error */
static int discard(PyObject *qp, PyObject *t)
{
    PyObject *times = GA(qp, s_timer_times);
    if (times == NULL)
        return -1;
    int d;
    if (PySet_Check(times))
        d = PySet_Discard(times, t);
    else {
        PyObject *res = PyObject_CallMethod(times, "discard", "O", t);
        d = res == NULL ? -1 : 0;
        Py_XDECREF(res);
    }
    Py_DECREF(times);
    return d < 0 ? -1 : 0;
}

/* ``if self._ready: self._arm_ready()``: for qp in self._ready, if qp.cc is not None
   and not qp.closed, arm it (the dict changing size meanwhile is the error
   Python's iteration gives) */
static int arm_ready(Timers *self)
{
    PyObject *ready = GA(self->dev, s_ready);
    if (ready == NULL)
        return -1;
    int r = 0;
    if (!PyDict_CheckExact(ready)) {
        PyErr_SetString(PyExc_TypeError, "a device's ready QPs must be a dict");
        r = -1;
    } else if (PyDict_GET_SIZE(ready)) {
        Py_ssize_t pos = 0, n = PyDict_GET_SIZE(ready);
        PyObject *qp, *v;
        while (r == 0 && PyDict_Next(ready, &pos, &qp, &v)) {
            Py_INCREF(qp);
            PyObject *cc = GA(qp, s_cc), *closed = cc ? GA(qp, s_closed) : NULL;
            if (closed == NULL)
                r = -1;
            else if (cc != Py_None) {
                int c = PyObject_IsTrue(closed);
                r = c < 0 ? -1 : c ? 0 : arm_self(self, qp);
            }
            Py_XDECREF(cc);
            Py_XDECREF(closed);
            Py_DECREF(qp);
            if (r == 0 && PyDict_GET_SIZE(ready) != n) {
                PyErr_SetString(PyExc_RuntimeError, "dictionary changed size during iteration");
                r = -1;
            }
        }
    }
    Py_DECREF(ready);
    return r;
}

/* Timers.arm(qp) */
static PyObject *timers_arm(Timers *self, PyObject *const *args, Py_ssize_t n)
{
    if (n != 1) {
        PyErr_SetString(PyExc_TypeError, "arm(qp)");
        return NULL;
    }
    if (arm_qp(self, args[0]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Timers.get_timer() */
static PyObject *timers_get_timer(Timers *self, PyObject *unused)
{
    if (arm_ready(self) < 0)
        return NULL;
    PyObject *h = self->heap, *t = Py_NewRef(Py_None), *gsi = NULL;
    while (PyList_GET_SIZE(h)) {
        PyObject *e = PyList_GET_ITEM(h, 0);
        if (!PyTuple_CheckExact(e) || PyTuple_GET_SIZE(e) != 3) {
            PyErr_SetString(PyExc_TypeError, "a timer entry is (deadline, seq, qp)");
            goto fail;
        }
        Py_INCREF(e);
        PyObject *et = PyTuple_GET_ITEM(e, 0), *qp = PyTuple_GET_ITEM(e, 2);
        PyObject *at = GA(qp, s_timer_at);
        int live = at == NULL ? -1 : compare(at, et, Py_EQ);
        Py_XDECREF(at);
        if (live > 0) {                         /* and not qp.closed */
            PyObject *closed = GA(qp, s_closed);
            int c = closed == NULL ? -1 : PyObject_IsTrue(closed);
            Py_XDECREF(closed);
            live = c < 0 ? -1 : !c;
        }
        if (live < 0) {
            Py_DECREF(e);
            goto fail;
        }
        if (live) {
            Py_SETREF(t, Py_NewRef(et));
            Py_DECREF(e);
            break;
        }
        Py_XDECREF(heap_pop(h));                /* heappop(h): e itself */
        int d = PyErr_Occurred() ? -1 : discard(qp, et);  /* qp.timer_times.discard(t) */
        Py_DECREF(e);
        if (d < 0)
            goto fail;
    }
    if ((gsi = GA(self->dev, s_gsi)) == NULL)
        goto fail;
    if (gsi != Py_None) {
        PyObject *g = call0(gsi, s_get_timer);
        if (g == NULL)
            goto fail;
        int lt = 1;
        if (g != Py_None && t != Py_None && (lt = compare(g, t, Py_LT)) < 0) {
            Py_DECREF(g);
            goto fail;
        }
        if (g != Py_None && lt)
            Py_SETREF(t, g);
        else
            Py_DECREF(g);
    }
    Py_DECREF(gsi);
    return t;
fail:
    Py_XDECREF(t);
    Py_XDECREF(gsi);
    return NULL;
}

/* the controller's part of a QP due at ``now`` (handle_timer's ``if cc is not
   None`` block): *ready set as there.  -1: error. */
static int fire_cc(Timers *self, PyObject *qp, PyObject *cc, PyObject *now, int *ready)
{
    int r = -1;
    PyObject *c = NULL, *ccs = GA(qp, s_ccs);
    if (ccs == NULL)
        return -1;
    PyObject *pace = GA(ccs, s_pace_at);
    if (pace == NULL)
        goto out;
    if (pace != Py_None) {                      /* ccs.pace_at <= now: ccs.pace_at = None */
        int due = compare(pace, now, Py_LE);
        if (due < 0 || (due && SA(ccs, s_pace_at, Py_None) < 0)) {
            Py_DECREF(pace);
            goto out;
        }
        *ready = due;
    }
    Py_DECREF(pace);
    if ((c = call0(cc, s_next_timer)) == NULL)
        goto out;
    if (c != Py_None) {
        int due = compare(c, now, Py_LE);
        if (due < 0)
            goto out;
        if (due) {
            PyObject *args[3] = {NULL, cc, now};      /* cc.on_timer(now=now) */
            PyObject *res = PyObject_VectorcallMethod(s_on_timer, args + 1,
                                                      1 | PY_VECTORCALL_ARGUMENTS_OFFSET, kw_now);
            if (res == NULL)
                goto out;
            Py_DECREF(res);
            if (!*ready) {                      /* ready = not self.drain_idle(qp, now) */
                PyObject *dargs[4] = {NULL, self->dev, qp, now};
                res = PyObject_VectorcallMethod(s_drain_idle, dargs + 1,
                                                3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
                if (res == NULL)
                    goto out;
                int idle = PyObject_IsTrue(res);
                Py_DECREF(res);
                if (idle < 0)
                    goto out;
                *ready = !idle;
            }
        }
    }
    if (*ready) {                               /* self._ready[qp] = None */
        PyObject *rd = GA(self->dev, s_ready);
        int s = rd == NULL ? -1 : PyObject_SetItem(rd, qp, Py_None);
        Py_XDECREF(rd);
        if (s < 0)
            goto out;
    }
    r = 0;
out:
    Py_DECREF(ccs);
    Py_XDECREF(c);
    return r;
}

/* ``comp.rnr_wait or comp.probe_at is not None or (comp.rto_at is not None and
   comp.rto_at <= now)``: 1, 0, or -1 (error) */
static int timed_out(PyObject *qp, PyObject *now)
{
    PyObject *comp = GA(qp, s_comp);
    if (comp == NULL)
        return -1;
    int r;
    PyObject *v = GA(comp, s_rnr_wait);
    r = v == NULL ? -1 : PyObject_IsTrue(v);
    Py_XDECREF(v);
    if (r == 0) {
        v = GA(comp, s_probe_at);
        r = v == NULL ? -1 : v != Py_None;
        Py_XDECREF(v);
    }
    if (r == 0) {
        v = GA(comp, s_rto_at);
        r = v == NULL ? -1 : v == Py_None ? 0 : compare(v, now, Py_LE);
        Py_XDECREF(v);
    }
    Py_DECREF(comp);
    return r;
}

/* Timers.handle_timer(now) */
static PyObject *timers_handle_timer(Timers *self, PyObject *now)
{
    PyObject *dev = self->dev, *h = self->heap, *e = NULL;
    if (arm_ready(self) < 0)
        return NULL;
    PyObject *gsi = GA(dev, s_gsi);
    if (gsi == NULL)
        return NULL;
    if (gsi != Py_None) {                       /* the CM agent's timer */
        PyObject *g = call0(gsi, s_get_timer);
        int due = g == NULL ? -1 : g == Py_None ? 0 : compare(g, now, Py_LE);
        Py_XDECREF(g);
        if (due > 0) {
            PyObject *gargs[3] = {NULL, gsi, now};
            PyObject *res = PyObject_VectorcallMethod(s_handle_timer, gargs + 1,
                                                      2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            due = res == NULL ? -1 : 0;
            Py_XDECREF(res);
        }
        if (due < 0) {
            Py_DECREF(gsi);
            return NULL;
        }
    }
    Py_DECREF(gsi);
    unsigned turns = 0;
    while (PyList_GET_SIZE(h)) {                /* while h and h[0][0] <= now */
        if ((++turns & 4095) == 0 && PyErr_CheckSignals() < 0)    /* (Ctrl-C, as Python's) */
            goto fail;
        PyObject *top = PyList_GET_ITEM(h, 0);
        if (!PyTuple_CheckExact(top) || PyTuple_GET_SIZE(top) != 3) {
            PyErr_SetString(PyExc_TypeError, "a timer entry is (deadline, seq, qp)");
            goto fail;
        }
        int due = compare(PyTuple_GET_ITEM(top, 0), now, Py_LE);
        if (due < 0)
            goto fail;
        if (!due)
            break;
        if ((e = heap_pop(h)) == NULL || PyErr_Occurred())
            goto fail;
        PyObject *t = PyTuple_GET_ITEM(e, 0), *qp = PyTuple_GET_ITEM(e, 2);
        if (discard(qp, t) < 0)                 /* qp.timer_times.discard(t) */
            goto fail;
        PyObject *at = GA(qp, s_timer_at);      /* if qp.timer_at != t or qp.closed: continue */
        int stale = at == NULL ? -1 : compare(at, t, Py_NE);
        Py_XDECREF(at);
        if (stale == 0) {
            PyObject *closed = GA(qp, s_closed);
            stale = closed == NULL ? -1 : PyObject_IsTrue(closed);
            Py_XDECREF(closed);
        }
        if (stale < 0)
            goto fail;
        if (stale) {
            Py_CLEAR(e);
            continue;
        }
        if (SA(qp, s_timer_at, Py_None) < 0)
            goto fail;
        int ready = 0;
        PyObject *cc = GA(qp, s_cc);
        if (cc == NULL)
            goto fail;
        int f = cc == Py_None ? 0 : fire_cc(self, qp, cc, now, &ready);
        Py_DECREF(cc);
        if (f < 0)
            goto fail;
        int to = timed_out(qp, now);
        if (to < 0)
            goto fail;
        if (to) {                               /* completer.on_timeout(self, qp, now) */
            PyObject *fn = PyObject_GetAttr(completer_module, s_on_timeout);
            if (fn == NULL)
                goto fail;
            PyObject *cargs[3] = {dev, qp, now};
            PyObject *res = PyObject_Vectorcall(fn, cargs, 3, NULL);
            Py_DECREF(fn);
            if (res == NULL)
                goto fail;
            Py_DECREF(res);
        }
        if (!ready && arm_self(self, qp) < 0)   /* else the drain arms it (timers.py) */
            goto fail;
        Py_CLEAR(e);
    }
    Py_RETURN_NONE;
fail:
    Py_XDECREF(e);
    return NULL;
}

static int timers_traverse(Timers *self, visitproc visit, void *arg)
{
    Py_VISIT(self->dev);
    Py_VISIT(self->heap);
    return 0;
}

static int timers_clear(Timers *self)
{
    Py_CLEAR(self->dev);
    Py_CLEAR(self->heap);
    return 0;
}

static void timers_dealloc(Timers *self)
{
    PyObject_GC_UnTrack(self);
    timers_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *timers_seq(Timers *self, void *unused)
{
    return PyLong_FromLongLong(self->seq);
}

static PyGetSetDef timers_getset[] = {
    {"seq", (getter)timers_seq, NULL, "the last seq given a heap entry (Python's dev._tseq)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TimersType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_softnic_fabric.Timers",
    .tp_doc = "one device's timers (softnic.core.timers.Timers, compiled)",
    .tp_basicsize = sizeof(Timers),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)timers_traverse,
    .tp_clear = (inquiry)timers_clear,
    .tp_dealloc = (destructor)timers_dealloc,
    .tp_getset = timers_getset,
};

/* The device's own methods, as a device class's (``device_methods``): each finds the
   device's Timers at ``dev._ctimers``. */
static PyObject *timers_new(PyObject *dev);

static Timers *timers_of(PyObject *dev)
{
    PyObject *t = GA(dev, s_ctimers);
    if (t == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();                          /* the first call: made now */
        t = timers_new(dev);
        if (t != NULL && SA(dev, s_ctimers, t) < 0)
            Py_CLEAR(t);
    }
    if (t != NULL && Py_TYPE(t) != &TimersType) {
        PyErr_SetString(PyExc_TypeError, "dev._ctimers is not a device's compiled Timers");
        Py_CLEAR(t);
    }
    return (Timers *)t;
}

static PyObject *dev_arm(PyObject *dev, PyObject *const *args, Py_ssize_t n)
{
    Timers *t = timers_of(dev);
    if (t == NULL)
        return NULL;
    PyObject *r = timers_arm(t, args, n);
    Py_DECREF(t);
    return r;
}

static PyObject *dev_get_timer(PyObject *dev, PyObject *unused)
{
    Timers *t = timers_of(dev);
    if (t == NULL)
        return NULL;
    PyObject *r = timers_get_timer(t, NULL);
    Py_DECREF(t);
    return r;
}

static PyObject *dev_handle_timer(PyObject *dev, PyObject *now)
{
    Timers *t = timers_of(dev);
    if (t == NULL)
        return NULL;
    PyObject *r = timers_handle_timer(t, now);
    Py_DECREF(t);
    return r;
}

/* Is the device's class's ``arm`` the compiled one?  (A subclass of a class given
   it may have its own, which ``self.arm(qp)`` calls.) */
static inline int own_arm(PyObject *dev)
{
    PyObject *d = _PyType_Lookup(Py_TYPE(dev), s_arm);
    return d != NULL && Py_IS_TYPE(d, &PyMethodDescr_Type)
        && ((PyMethodDescrObject *)d)->d_method->ml_meth == (PyCFunction)(void (*)(void))dev_arm;
}

/* dev.arm(qp), however the device's class has it */
static int call_arm(PyObject *dev, PyObject *qp)
{
    PyObject *r = call1(dev, s_arm, qp);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* self.arm(qp) from the timers' own methods */
static int arm_self(Timers *self, PyObject *qp)
{
    return own_arm(self->dev) ? arm_qp(self, qp) : call_arm(self->dev, qp);
}

/* dev.arm(qp), for output.c */
int sn_arm(PyObject *dev, PyObject *qp)
{
    if (!own_arm(dev))
        return call_arm(dev, qp);
    Timers *t = timers_of(dev);
    if (t == NULL)
        return -1;
    int r = arm_qp(t, qp);
    Py_DECREF(t);
    return r;
}

static PyMethodDef dev_methods[] = {
    {"arm", (PyCFunction)(void (*)(void))dev_arm, METH_FASTCALL, "Timers.arm(qp), compiled"},
    {"get_timer", (PyCFunction)dev_get_timer, METH_NOARGS, "Timers.get_timer(), compiled"},
    {"handle_timer", (PyCFunction)dev_handle_timer, METH_O, "Timers.handle_timer(now), compiled"},
    {NULL, NULL, 0, NULL},
};

/* dev's Timers: its heap ``dev._timers`` (a list) and its seqs from ``dev._tseq`` on */
static PyObject *timers_new(PyObject *dev)
{
    PyObject *heap = PyObject_GetAttr(dev, s_timers);
    if (heap == NULL)
        return NULL;
    if (!PyList_CheckExact(heap)) {
        PyErr_SetString(PyExc_TypeError, "a device's timers must be a list");
        Py_DECREF(heap);
        return NULL;
    }
    PyObject *seq = PyObject_GetAttr(dev, s_tseq);
    long long s = seq == NULL ? -1 : PyLong_AsLongLong(seq);
    Py_XDECREF(seq);
    if (s == -1 && PyErr_Occurred()) {
        Py_DECREF(heap);
        return NULL;
    }
    Timers *t = PyObject_GC_New(Timers, &TimersType);
    if (t == NULL) {
        Py_DECREF(heap);
        return NULL;
    }
    t->dev = Py_NewRef(dev);
    t->heap = heap;
    t->seq = s;
    PyObject_GC_Track(t);
    return (PyObject *)t;
}

extern PyMethodDef sn_output_methods[];        /* output.c */
extern PyMethodDef sn_responder_dev_methods[]; /* responder.c */
extern PyMethodDef sn_completer_dev_methods[]; /* completer.c */
int sn_output_setup(PyObject *requester, PyObject *completer, PyObject *output);
int sn_completer_setup(PyObject *completer);

/* device_methods(cls, completer, requester, output): {name: method descriptor of cls}
   for the timers' ``arm``, ``get_timer`` and ``handle_timer``, the drain's
   ``datagrams_to_send`` and ``_outgoing`` (output.c) and the receive's ``_send_run``
   and ``_send_only`` (responder.c) and ``_ack`` (completer.c), to be the device
   class's own;
   the modules are those the compiled methods call into */
static PyObject *device_methods(PyObject *mod, PyObject *const *args, Py_ssize_t n)
{
    if (n != 4 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "device_methods(cls, completer, requester, output)");
        return NULL;
    }
    if (sn_output_setup(args[2], args[1], args[3]) < 0 || sn_completer_setup(args[1]) < 0)
        return NULL;
    Py_XSETREF(completer_module, Py_NewRef(args[1]));
    PyObject *d = PyDict_New();
    PyMethodDef *tables[] = {dev_methods, sn_output_methods, sn_responder_dev_methods,
                             sn_completer_dev_methods};
    for (int k = 0; k < 4; k++)
        for (PyMethodDef *m = tables[k]; d != NULL && m->ml_name != NULL; m++) {
            PyObject *descr = PyDescr_NewMethod((PyTypeObject *)args[0], m);
            if (descr == NULL || PyDict_SetItemString(d, m->ml_name, descr) < 0)
                Py_CLEAR(d);
            Py_XDECREF(descr);
        }
    return d;
}

PyMethodDef sn_timers_methods[] = {
    {"device_methods", (PyCFunction)(void (*)(void))device_methods, METH_FASTCALL,
     "device_methods(cls, completer, requester, output) -> {name: method of cls}"},
    {NULL, NULL, 0, NULL},
};

int sn_timers_init(void)
{
    if (PyType_Ready(&TimersType) < 0)
        return -1;
    INTERN(s_comp, "comp"); INTERN(s_rto_at, "rto_at"); INTERN(s_probe_at, "probe_at");
    INTERN(s_rnr_at, "rnr_at"); INTERN(s_cc, "cc"); INTERN(s_ccs, "ccs");
    INTERN(s_pace_at, "pace_at"); INTERN(s_next_timer, "next_timer");
    INTERN(s_timer_at, "timer_at"); INTERN(s_timer_times, "timer_times");
    INTERN(s_tseq, "_tseq"); INTERN(s_timers, "_timers"); INTERN(s_ready, "_ready");
    INTERN(s_gsi, "gsi"); INTERN(s_get_timer, "get_timer"); INTERN(s_handle_timer, "handle_timer");
    INTERN(s_closed, "closed"); INTERN(s_on_timer, "on_timer"); INTERN(s_drain_idle, "drain_idle");
    INTERN(s_rnr_wait, "rnr_wait"); INTERN(s_on_timeout, "on_timeout");
    INTERN(s_ctimers, "_ctimers"); INTERN(s_arm, "arm");
    PyObject *now = PyUnicode_InternFromString("now");
    if (now == NULL || (kw_now = PyTuple_Pack(1, now)) == NULL)
        return -1;
    Py_DECREF(now);
    return 0;
}
