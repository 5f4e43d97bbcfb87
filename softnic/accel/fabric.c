/* The simulated fabric's event loop (softnic.transport.sim.Fabric.run), compiled.

   The same loop as ``Fabric._run_python``, event for event: the heap is the
   fabric's own list of ``(time, seq, target, data, src)`` entries, ordered as
   heapq orders them (by time, then seq: seqs are unique), so Python's heapq and
   this file may push to it in turn; the devices, links, queues and drains are
   the fabric's Python objects, a slot of theirs read in place (``GA``), any other
   attribute as Python reads it.  Here, beside their Python: the loop itself (the
   pop, the choice of target, the timer entries' checks, the driver rule's drain
   of a device's output into the heap), a switch port's queue
   (``EgressQueue.arrive``: ``queue_arrive``, but for a queue with INT), a NIC's
   own (``EgressQueue.depart``: ``queue_depart``), RED's chance of a mark
   (``RED.probability``, in ``queue_arrive``), the copy of a datagram RED marks
   (``Datagram.with_(ecn=CE)``: ``marked``) and the arming of a port's timer
   entry (``Fabric._arm``: ``arm``).  Whatever is rarer goes back to the fabric's
   Python (``_send``, ``_compact``, a leaf-spine's ``event``).  A run with a trace
   is Python's alone.

   tests/test_sim_reference.py runs its workloads with both loops and compares
   each with a plain reference loop. */

#include "objects.h"         /* the heap, numbers, attributes */

/* timers.c: the device's timers, added to this module */
extern PyMethodDef sn_timers_methods[];
int sn_timers_init(void);
int sn_output_init(void);                       /* output.c: a device's drain */
int sn_requester_init(void);                    /* requester.c: generate's paced MIDDLEs */
extern PyMethodDef sn_requester_methods[];
extern PyMethodDef sn_responder_methods[];       /* responder.c */
int sn_responder_init(void);
extern PyMethodDef sn_completer_methods[];       /* completer.c: a plain ACK's receipt */
int sn_completer_init(void);
int sn_post_init(void);                         /* post.c: the C face's send records */
extern PyMethodDef sn_post_methods[];

static PyObject *PortType, *DrainType, *SwitchHopType, *DatagramType, *REDType, *CE;
#define TWO53 9007199254740992.0
static PyObject *s_device, *s_links, *s_armed, *s_entry_seq, *s_entry_time, *s_attached,
    *s_ect, *s_pending, *s_live, *s_dst, *s_queue, *s_drain, *s_delay, *s_fast, *s_counters,
    *s_nic, *s_hop, *s_address, *s_event, *s_now, *s_received, *s_dropped_unknown, *s_stale,
    *s_receive_datagram, *s_datagrams_to_send, *s_get_timer, *s_handle_timer, *s_send,
    *s_arm, *s_ecn, *s_echo, *s_hops, *s_popleft, *s_append, *s_arrive, *s_sent, *s_delivered,
    *s_busy_until, *s_rate_bps, *s_tx_bytes, *s_enqueued, *s_max_qlen, *s_dropped,
    *s_marked, *s_plain, *s_sample, *s_samples, *s_buffer_bytes, *s_red, *s_int_telemetry,
    *s_tx_by_src, *s_kmin, *s_kmax, *s_rng, *s_random, *s_probability, *s_pmax, *s_compact, *s_record;
static double wire_overhead = 28.0;
static long long compact_min_stale = 4096;

/* next_seq(): the fabric's ``itertools.count(1).__next__``.  A bound ``__next__`` is
   its iterator's tp_iternext, taken here without the call (the last fabric's
   kept, so a run looks it up once); anything else is called. */
static PyObject *seen_next, *seen_iter;

static PyObject *call_next(PyObject *next_seq)
{
    if (next_seq != seen_next) {
        PyObject *it = NULL;
        PyObject *name = PyObject_GetAttrString(next_seq, "__name__");
        if (name == NULL)
            PyErr_Clear();
        else if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "__next__") == 0) {
            it = PyObject_GetAttrString(next_seq, "__self__");
            if (it == NULL)
                PyErr_Clear();
            else if (Py_TYPE(it)->tp_iternext == NULL || Py_TYPE(it)->tp_iternext == _PyObject_NextNotImplemented)
                Py_CLEAR(it);
        }
        Py_XDECREF(name);
        Py_XSETREF(seen_iter, it);
        Py_XSETREF(seen_next, Py_NewRef(next_seq));
    }
    if (seen_iter == NULL)
        return PyObject_CallNoArgs(next_seq);
    PyObject *v = Py_TYPE(seen_iter)->tp_iternext(seen_iter);
    if (v == NULL && !PyErr_Occurred())
        PyErr_SetNone(PyExc_StopIteration);
    return v;
}

/* (at, next_seq(), target, data, src) */
static PyObject *make5(PyObject *next_seq, double at, PyObject *target, PyObject *data,
                       PyObject *src)
{
    PyObject *seq = call_next(next_seq);
    if (seq == NULL)
        return NULL;
    PyObject *t = PyFloat_FromDouble(at);
    PyObject *e = t ? PyTuple_New(5) : NULL;
    if (e == NULL) {
        Py_DECREF(seq);
        Py_XDECREF(t);
        return NULL;
    }
    PyTuple_SET_ITEM(e, 0, t);
    PyTuple_SET_ITEM(e, 1, seq);
    Py_INCREF(target);
    PyTuple_SET_ITEM(e, 2, target);
    Py_INCREF(data);
    PyTuple_SET_ITEM(e, 3, data);
    Py_INCREF(src);
    PyTuple_SET_ITEM(e, 4, src);
    return e;
}

/* push (at, next_seq(), target, data, src) */
static int push5(PyObject *heap, PyObject *next_seq, double at, PyObject *target, PyObject *data,
                 PyObject *src)
{
    PyObject *e = make5(next_seq, at, target, data, src);
    if (e == NULL)
        return -1;
    int r = heap_push(heap, e);
    Py_DECREF(e);
    return r;
}

/* ------------------------------------------------------------------ the queues */

static inline Py_ssize_t data_len(PyObject *data)
{
    if (PyBytes_CheckExact(data))
        return PyBytes_GET_SIZE(data);
    return PyObject_Length(data);
}

/* EgressQueue.depart: a plain queue's bookkeeping; the departure time. */
static int queue_depart(PyObject *q, PyObject *data, double now, double *depart)
{
    Py_ssize_t n = data_len(data);
    if (n < 0)
        return -1;
    double size = (double)n + wire_overhead, busy, rate;
    if (get_double(q, s_busy_until, &busy) < 0 || get_double(q, s_rate_bps, &rate) < 0)
        return -1;
    PyObject *c = GA(q, s_counters);
    if (c == NULL)
        return -1;
    double start = now;
    int r = -1;
    if (busy > now) {
        double ql = (busy - now) * rate / 8;
        PyObject *m = PyDict_GetItemWithError(c, s_max_qlen);     /* borrowed */
        if (m == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, s_max_qlen);
            goto out;
        }
        double mx = as_double(m);
        if (mx == -1.0 && PyErr_Occurred())
            goto out;
        if (ql > mx) {
            PyObject *v = PyLong_FromDouble(ql);
            if (v == NULL || PyDict_SetItem(c, s_max_qlen, v) < 0) {
                Py_XDECREF(v);
                goto out;
            }
            Py_DECREF(v);
        }
        start = busy;
    }
    *depart = start + size * 8 / rate;
    if (set_double(q, s_busy_until, *depart) < 0 || attr_add(q, s_tx_bytes, n + (long long)wire_overhead) < 0
        || dict_add(c, s_enqueued, 1) < 0)
        goto out;
    r = 0;
out:
    Py_DECREF(c);
    return r;
}

/* ``data.with_(ecn=CE)`` of a Datagram (softnic/wire/datagram.py), ``Datagram(data,
   ecn=CE)`` of plain bytes: the same payload bytes in a new Datagram, its ecn CE,
   the hops and echo ``data`` carries (those not None) carried over.  Made as
   ``Datagram.__new__`` makes it (``bytes.__new__``, then the fields). */
static PyObject *marked(PyObject *data)
{
    PyObject *m;
    if (PyBytes_Check(data)) {
        /* what bytes.__new__(Datagram, data) makes of bytes (bytes_subtype_new):
           the type's allocation, the bytes and their NUL copied, no hash yet */
        Py_ssize_t n = PyBytes_GET_SIZE(data);
        m = ((PyTypeObject *)DatagramType)->tp_alloc((PyTypeObject *)DatagramType, n);
        if (m != NULL) {
            memcpy(PyBytes_AS_STRING(m), PyBytes_AS_STRING(data), n + 1);
_Py_COMP_DIAG_PUSH
_Py_COMP_DIAG_IGNORE_DEPR_DECLS
            ((PyBytesObject *)m)->ob_shash = -1;
_Py_COMP_DIAG_POP
        }
    } else {
        PyObject *args = PyTuple_Pack(1, data);
        m = args ? PyBytes_Type.tp_new((PyTypeObject *)DatagramType, args, NULL) : NULL;
        Py_XDECREF(args);
    }
    if (m == NULL || PyObject_SetAttr(m, s_ecn, CE) < 0)
        goto fail;
    if ((PyObject *)Py_TYPE(data) == DatagramType) {
        PyObject *names[2] = {s_hops, s_echo};
        for (int i = 0; i < 2; i++) {
            PyObject *v = PyObject_GetAttr(data, names[i]);
            int r = v == NULL ? -1 : v == Py_None ? 0 : PyObject_SetAttr(m, names[i], v);
            Py_XDECREF(v);
            if (r < 0)
                goto fail;
        }
    }
    return m;
fail:
    Py_XDECREF(m);
    return NULL;
}

/* (a, b), a new tuple */
static inline PyObject *pair(PyObject *a, PyObject *b)
{
    PyObject *t = PyTuple_New(2);
    if (t != NULL) {
        PyTuple_SET_ITEM(t, 0, Py_NewRef(a));
        PyTuple_SET_ITEM(t, 1, Py_NewRef(b));
    }
    return t;
}

/* EgressQueue.arrive (a queue with INT, HPCC's telemetry, is left to Python's):
   what it returns as (*depart, *res), *res the datagram (a new reference), or
   None when dropped. */
static int queue_arrive(PyObject *q, PyObject *data, PyObject *now_obj, double now, int ect,
                        PyObject *src, double *depart_out, PyObject **res)
{
    PyObject *intt = GA(q, s_int_telemetry);
    if (intt == NULL)
        return -1;
    int t = PyObject_IsTrue(intt);
    Py_DECREF(intt);
    if (t < 0)
        return -1;
    if (t) {
        PyObject *x = PyObject_CallMethodObjArgs(q, s_arrive, data, now_obj,
                                                 ect ? Py_True : Py_False, src, NULL);
        if (x == NULL)
            return -1;
        if (x == Py_None) {
            *res = x;
            return 0;
        }
        if (!PyTuple_Check(x) || PyTuple_GET_SIZE(x) != 2) {
            PyErr_SetString(PyExc_TypeError, "EgressQueue.arrive gave neither None nor a pair");
            Py_DECREF(x);
            return -1;
        }
        *depart_out = as_double(PyTuple_GET_ITEM(x, 0));
        *res = Py_NewRef(PyTuple_GET_ITEM(x, 1));
        Py_DECREF(x);
        if (*depart_out == -1.0 && PyErr_Occurred()) {
            Py_CLEAR(*res);
            return -1;
        }
        return 0;
    }
    Py_ssize_t n = data_len(data);
    if (n < 0)
        return -1;
    long long size = n + (long long)wire_overhead;
    double busy, rate;
    if (get_double(q, s_busy_until, &busy) < 0 || get_double(q, s_rate_bps, &rate) < 0)
        return -1;
    double b = busy - now;
    double ql = b > 0 ? b * rate / 8 : 0.0;
    PyObject *c = NULL, *v = NULL, *red = NULL, *out = NULL;
    int r = -1;
    v = GA(q, s_sample);
    if (v == NULL)
        return -1;
    t = PyObject_IsTrue(v);
    Py_CLEAR(v);
    if (t < 0)
        return -1;
    if (t) {
        PyObject *samples = GA(q, s_samples);
        PyObject *iq = samples ? PyLong_FromDouble(ql) : NULL;
        PyObject *sample = iq ? pair(now_obj, iq) : NULL;
        int a = sample ? PyList_Append(samples, sample) : -1;
        Py_XDECREF(sample);
        Py_XDECREF(iq);
        Py_XDECREF(samples);
        if (a < 0)
            return -1;
    }
    c = GA(q, s_counters);
    if (c == NULL)
        return -1;
    v = PyDict_GetItemWithError(c, s_max_qlen);           /* borrowed */
    if (v == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, s_max_qlen);
        goto out;
    }
    double mx = as_double(v);
    v = NULL;
    if (mx == -1.0 && PyErr_Occurred())
        goto out;
    if (ql > mx) {
        PyObject *iq = PyLong_FromDouble(ql);
        int a = iq ? PyDict_SetItem(c, s_max_qlen, iq) : -1;
        Py_XDECREF(iq);
        if (a < 0)
            goto out;
    }
    v = GA(q, s_buffer_bytes);
    if (v == NULL)
        goto out;
    if (v != Py_None) {
        double buffer = as_double(v);
        if (buffer == -1.0 && PyErr_Occurred())
            goto out;
        if (ql + (double)size > buffer) {
            if (dict_add(c, s_dropped, 1) < 0)
                goto out;
            Py_INCREF(Py_None);
            *res = Py_None;
            r = 0;
            goto out;
        }
    }
    Py_CLEAR(v);
    double depart = (busy > now ? busy : now) + (double)size * 8 / rate;
    if (set_double(q, s_busy_until, depart) < 0 || attr_add(q, s_tx_bytes, size) < 0
        || dict_add(c, s_enqueued, 1) < 0)
        goto out;
    if (src != Py_None) {
        PyObject *by_src = GA(q, s_tx_by_src);
        int a = by_src ? dict_add(by_src, src, size) : -1;
        Py_XDECREF(by_src);
        if (a < 0)
            goto out;
    }
    Py_INCREF(data);
    out = data;
    red = GA(q, s_red);
    if (red == NULL)
        goto out;
    if (red != Py_None && ect) {
        double kmin, kmax;
        if (get_double(red, s_kmin, &kmin) < 0)
            goto out;
        if (ql > kmin) {
            int mark;
            if (get_double(red, s_kmax, &kmax) < 0)
                goto out;
            if (ql >= kmax) {
                mark = 1;
            } else {
                PyObject *rng = GA(q, s_rng);
                PyObject *x = rng ? PyObject_CallMethodNoArgs(rng, s_random) : NULL;
                Py_XDECREF(rng);
                if (x == NULL)
                    goto out;
                double pmax;
                if ((PyObject *)Py_TYPE(red) == REDType && PyFloat_CheckExact(x)
                    && kmin > -TWO53 && kmax < TWO53) {
                    /* RED.probability between kmin and kmax, as Python works it out
                       (kmax - kmin exact as a double: both within 2**53) */
                    if (get_double(red, s_pmax, &pmax) < 0) {
                        Py_DECREF(x);
                        goto out;
                    }
                    mark = PyFloat_AS_DOUBLE(x) < pmax * (ql - kmin) / (kmax - kmin);
                    Py_DECREF(x);
                } else {
                    PyObject *qf = PyFloat_FromDouble(ql);
                    PyObject *p = qf ? PyObject_CallMethodOneArg(red, s_probability, qf) : NULL;
                    Py_XDECREF(qf);
                    mark = p ? PyObject_RichCompareBool(x, p, Py_LT) : -1;
                    Py_DECREF(x);
                    Py_XDECREF(p);
                    if (mark < 0)
                        goto out;
                }
            }
            if (mark) {
                if (dict_add(c, s_marked, 1) < 0)
                    goto out;
                PyObject *m = marked(data);
                if (m == NULL)
                    goto out;
                Py_SETREF(out, m);
            }
        }
    }
    *depart_out = depart;
    *res = Py_NewRef(out);
    r = 0;
out:
    Py_XDECREF(v);
    Py_XDECREF(red);
    Py_XDECREF(out);
    Py_XDECREF(c);
    return r;
}

/* Fabric._arm */
static int arm(PyObject *fabric, PyObject *heap, PyObject *next_seq, PyObject *port,
               PyObject *deadline, PyObject *now_obj)
{
    if (SA(port, s_armed, deadline) < 0)
        return -1;
    if (deadline == Py_None)
        return 0;                       /* a live entry left in the heap is discarded when it comes up */
    int later = compare(deadline, now_obj, Py_GT);
    if (later < 0)
        return -1;
    PyObject *when = later ? deadline : now_obj;   /* virtual time never goes back */
    PyObject *es = GA(port, s_entry_seq);
    if (es == NULL)
        return -1;
    long long entry_seq = PyLong_AsLongLong(es);
    Py_DECREF(es);
    if (entry_seq == -1 && PyErr_Occurred())
        return -1;
    if (entry_seq != -1) {
        PyObject *et = GA(port, s_entry_time);
        if (et == NULL)
            return -1;
        int ge = compare(when, et, Py_GE);
        Py_DECREF(et);
        if (ge < 0)
            return -1;
        if (ge)
            return 0;                   /* the earlier entry re-checks when it comes up */
        if (attr_add(fabric, s_stale, 1) < 0)
            return -1;
    }
    PyObject *seq = call_next(next_seq);
    if (seq == NULL)
        return -1;
    PyObject *e = NULL;
    int r = SA(port, s_entry_seq, seq);
    if (!r)
        r = SA(port, s_entry_time, when);
    if (!r) {
        e = PyTuple_Pack(5, when, seq, port, Py_None, Py_None);
        r = e ? heap_push(heap, e) : -1;
    }
    Py_DECREF(seq);
    Py_XDECREF(e);
    if (r < 0)
        return -1;
    PyObject *st = GA(fabric, s_stale);
    if (st == NULL)
        return -1;
    long long stale = PyLong_AsLongLong(st);
    Py_DECREF(st);
    if (stale == -1 && PyErr_Occurred())
        return -1;
    if (stale > compact_min_stale && stale * 2 > PyList_GET_SIZE(heap)) {
        PyObject *x = PyObject_CallMethodNoArgs(fabric, s_compact);
        if (x == NULL)
            return -1;
        Py_DECREF(x);
    }
    return 0;
}

/* ``datagrams_to_send``'s answer as a list of 2-tuples: itself when it is one (as
   the engine's is), else a copy, as Python's ``for out, dst in ...`` takes any
   iterable of pairs.  Replaces *outs (its reference); -1: error. */
static int pairs(PyObject **outs)
{
    PyObject *l = *outs;
    if (PyList_CheckExact(l)) {
        Py_ssize_t i, n = PyList_GET_SIZE(l);
        for (i = 0; i < n; i++) {
            PyObject *t = PyList_GET_ITEM(l, i);
            if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 2)
                break;
        }
        if (i == n)
            return 0;
    }
    PyObject *copy = PySequence_List(l);
    Py_SETREF(*outs, copy);
    if (copy == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(copy); i++) {
        PyObject *t = PySequence_Tuple(PyList_GET_ITEM(copy, i));
        if (t == NULL)
            return -1;
        if (PyTuple_GET_SIZE(t) != 2) {
            PyErr_Format(PyExc_ValueError, "datagrams_to_send gave %zd items, not "
                         "(data, destination)", PyTuple_GET_SIZE(t));
            Py_DECREF(t);
            return -1;
        }
        PyObject *old = PyList_GET_ITEM(copy, i);
        PyList_SET_ITEM(copy, i, t);    /* (the copy is ours alone) */
        Py_DECREF(old);
    }
    return 0;
}

/* ------------------------------------------------------------------ the loop */

#define CALL_OR_FAIL(x) do { PyObject *_r = (x); if (_r == NULL) goto fail; Py_DECREF(_r); } while (0)

static PyObject *run_loop(PyObject *self, PyObject *args)
{
    PyObject *fabric, *heap, *stop, *ports, *next_seq, *capture;
    double end;
    long long limit;
    if (!PyArg_ParseTuple(args, "OO!dLOO!OO", &fabric, &PyList_Type, &heap, &end, &limit, &stop,
                          &PyDict_Type, &ports, &next_seq, &capture))
        return NULL;
    if (stop == Py_None)
        stop = NULL;
    if (capture == Py_None)
        capture = NULL;
    long long processed = 0, hops = 0;
    int stopped = 0;
    PyObject *entry = NULL, *port = NULL, *device = NULL, *outs = NULL;

    unsigned long turns = 0;
    while (processed != limit && PyList_GET_SIZE(heap)) {
        if ((++turns & 4095) == 0 && PyErr_CheckSignals() < 0)   /* (Ctrl-C between events) */
            goto fail;
        entry = heap_pop(heap);
        if (entry == NULL || PyErr_Occurred())
            goto fail;
        double at = entry_time(entry);
        PyObject *at_obj = PyTuple_GET_ITEM(entry, 0), *seq = PyTuple_GET_ITEM(entry, 1);
        PyObject *target = PyTuple_GET_ITEM(entry, 2), *data = PyTuple_GET_ITEM(entry, 3),
                 *src = PyTuple_GET_ITEM(entry, 4);
        if (at > end) {
            if (heap_push(heap, entry) < 0)   /* the same entry back: it keeps its place */
                goto fail;
            Py_CLEAR(entry);
            break;
        }
        PyTypeObject *cls = Py_TYPE(target);
        Py_INCREF(target);
        port = target;
        if ((PyObject *)cls != PortType) {
            if ((PyObject *)cls == DrainType) {          /* a delivery from a switch port */
                PyObject *pending = GA(target, s_pending);
                if (pending == NULL)
                    goto fail;
                Py_ssize_t np = PyObject_Length(pending);
                if (np < 0) {
                    Py_DECREF(pending);
                    goto fail;
                }
                if (np) {
                    PyObject *e = PyObject_CallMethodNoArgs(pending, s_popleft);
                    Py_DECREF(pending);
                    if (e == NULL)
                        goto fail;
                    int r = heap_push(heap, e);
                    Py_DECREF(e);
                    if (r < 0)
                        goto fail;
                } else {
                    Py_DECREF(pending);
                    if (SA(target, s_live, Py_False) < 0)
                        goto fail;
                }
                port = GA(target, s_dst);
                Py_DECREF(target);
                if (port == NULL)
                    goto fail;
            } else {
                hops++;
                if ((PyObject *)cls == SwitchHopType) {  /* a datagram reaches a switch port */
                    PyObject *sp = PyDict_GetItemWithError(ports, src);   /* borrowed */
                    if (sp == NULL && PyErr_Occurred())
                        goto fail;
                    int ect = 0;
                    if (sp != NULL) {
                        PyObject *v = GA(sp, s_ect);
                        if (v == NULL)
                            goto fail;
                        ect = PyObject_IsTrue(v);
                        Py_DECREF(v);
                        if (ect < 0)
                            goto fail;
                    }
                    PyObject *queue = GA(target, s_queue), *res = NULL;
                    if (queue == NULL)
                        goto fail;
                    double dep = 0.0;
                    int a = queue_arrive(queue, data, at_obj, at, ect, src, &dep, &res);
                    Py_DECREF(queue);
                    if (a < 0)
                        goto fail;
                    if (res != Py_None) {
                        double delay;
                        PyObject *drain = GA(target, s_drain);
                        if (drain == NULL || get_double(target, s_delay, &delay) < 0) {
                            Py_XDECREF(drain);
                            Py_DECREF(res);
                            goto fail;
                        }
                        PyObject *e = make5(next_seq, dep + delay, drain, res, src);
                        Py_DECREF(res);
                        PyObject *live = e ? GA(drain, s_live) : NULL;
                        int r = -1;
                        int is_live = live ? PyObject_IsTrue(live) : -1;
                        if (is_live >= 0) {
                            if (is_live) {
                                PyObject *pending = GA(drain, s_pending);
                                if (pending != NULL) {
                                    PyObject *x = PyObject_CallMethodOneArg(pending, s_append, e);
                                    r = x ? 0 : -1;
                                    Py_XDECREF(x);
                                    Py_DECREF(pending);
                                }
                            } else if (SA(drain, s_live, Py_True) == 0) {
                                r = heap_push(heap, e);
                            }
                        }
                        Py_XDECREF(live);
                        Py_XDECREF(e);
                        Py_DECREF(drain);
                        if (r < 0)
                            goto fail;
                    } else {
                        Py_DECREF(res);
                    }
                } else {                                 /* a leaf-spine's port or switch */
                    CALL_OR_FAIL(PyObject_CallMethodObjArgs(target, s_event, at_obj, data, src, NULL));
                }
                Py_CLEAR(port);
                Py_CLEAR(entry);
                continue;
            }
        }
        device = GA(port, s_device);
        if (device == NULL)
            goto fail;
        if (data == Py_None) {
            PyObject *es = GA(port, s_entry_seq);
            if (es == NULL)
                goto fail;
            int same = compare(seq, es, Py_EQ);
            Py_DECREF(es);
            if (same < 0)
                goto fail;
            if (!same) {
                if (attr_add(fabric, s_stale, -1) < 0)
                    goto fail;
                goto next;
            }
            PyObject *m1 = PyLong_FromLong(-1);
            int r = m1 ? SA(port, s_entry_seq, m1) : -1;
            Py_XDECREF(m1);
            if (r < 0)
                goto fail;
            PyObject *armed = GA(port, s_armed);
            if (armed == NULL)
                goto fail;
            if (armed == Py_None) {
                Py_DECREF(armed);
                goto next;
            }
            double a = as_double(armed);
            if (a == -1.0 && PyErr_Occurred()) {
                Py_DECREF(armed);
                goto fail;
            }
            if (a > at) {
                PyObject *ns = call_next(next_seq);
                PyObject *e = ns ? PyTuple_Pack(5, armed, ns, port, Py_None, Py_None) : NULL;
                r = e ? 0 : -1;
                if (!r)
                    r = SA(port, s_entry_seq, ns);
                if (!r)
                    r = SA(port, s_entry_time, armed);
                if (!r)
                    r = heap_push(heap, e);
                Py_XDECREF(ns);
                Py_XDECREF(e);
                Py_DECREF(armed);
                if (r < 0)
                    goto fail;
                goto next;
            }
            Py_DECREF(armed);
            if (SA(fabric, s_now, at_obj) < 0 || SA(port, s_armed, Py_None) < 0)
                goto fail;
            CALL_OR_FAIL(PyObject_CallMethodOneArg(device, s_handle_timer, at_obj));
        } else {
            PyObject *att = GA(port, s_attached);
            if (att == NULL)
                goto fail;
            int attached = PyObject_IsTrue(att);
            Py_DECREF(att);
            if (attached < 0)
                goto fail;
            if (SA(fabric, s_now, at_obj) < 0)
                goto fail;
            if (!attached) {
                if (attr_add(fabric, s_dropped_unknown, 1) < 0)
                    goto fail;
                processed++;
                goto check_stop;
            }
            if (attr_add(fabric, s_received, 1) < 0)
                goto fail;
            if (capture != NULL) {
                PyObject *addr = GA(port, s_address);
                if (addr == NULL)
                    goto fail;
                PyObject *x = PyObject_CallMethodObjArgs(capture, s_record, data, src, addr, at_obj,
                                                         NULL);
                Py_DECREF(addr);
                if (x == NULL)
                    goto fail;
                Py_DECREF(x);
            }
            if ((PyObject *)Py_TYPE(data) == DatagramType) {
                PyObject *ecn = GA(data, s_ecn);
                PyObject *echo = ecn ? GA(data, s_echo) : NULL;
                if (echo == NULL) {
                    Py_XDECREF(ecn);
                    goto fail;
                }
                if (echo == Py_None) {
                    Py_DECREF(echo);
                    echo = GA(data, s_hops);
                    if (echo == NULL) {
                        Py_DECREF(ecn);
                        goto fail;
                    }
                }
                PyObject *r = PyObject_CallMethodObjArgs(device, s_receive_datagram, data, src,
                                                         at_obj, ecn, echo, NULL);
                Py_DECREF(ecn);
                Py_DECREF(echo);
                if (r == NULL)
                    goto fail;
                Py_DECREF(r);
            } else {
                CALL_OR_FAIL(PyObject_CallMethodObjArgs(device, s_receive_datagram, data, src,
                                                        at_obj, NULL));
            }
        }
        /* The driver rule, inlined: this is the per-packet path. */
        outs = PyObject_CallMethodOneArg(device, s_datagrams_to_send, at_obj);
        if (outs == NULL)
            goto fail;
        if (pairs(&outs) < 0)
            goto fail;
        Py_SETREF(outs, PyList_AsTuple(outs));  /* (ours: the device may keep its list) */
        if (outs == NULL)
            goto fail;
        if (PyTuple_GET_SIZE(outs)) {
            PyObject *links = GA(port, s_links);
            if (links == NULL)
                goto fail;
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(outs); i++) {
                PyObject *item = PyTuple_GET_ITEM(outs, i);
                PyObject *out = PyTuple_GET_ITEM(item, 0), *dst = PyTuple_GET_ITEM(item, 1);
                PyObject *link = PyDict_CheckExact(links)              /* borrowed */
                                 ? PyDict_GetItemWithError(links, dst) : NULL;
                int r = -1;
                if (link == NULL) {
                    if (PyErr_Occurred())
                        goto links_fail;
                    goto slow;
                }
                PyObject *fast = GA(link, s_fast);
                int is_fast = fast ? PyObject_IsTrue(fast) : -1;
                Py_XDECREF(fast);
                if (is_fast < 0)
                    goto links_fail;
                PyObject *nic = NULL;
                if (!is_fast) {
                    nic = GA(link, s_nic);
                    if (nic == NULL)
                        goto links_fail;
                    if (nic == Py_None) {       /* faults, a trace or a leaf-spine: Python's */
                        Py_DECREF(nic);
                        goto slow;
                    }
                }
                {
                    double delay, t;
                    PyObject *counters = GA(link, s_counters);
                    PyObject *to = counters ? GA(link, nic ? s_hop : s_dst) : NULL;
                    PyObject *addr = to ? GA(port, s_address) : NULL;
                    if (addr != NULL && get_double(link, s_delay, &delay) == 0
                        && dict_add(counters, s_sent, 1) == 0 && dict_add(counters, s_delivered, 1) == 0) {
                        if (nic == NULL) {
                            t = at + delay;     /* a direct link without faults */
                            r = 0;
                        } else {                /* the NIC's queue, then a switch port */
                            r = queue_depart(nic, out, at, &t);
                            t += delay;
                        }
                        if (r == 0)
                            r = push5(heap, next_seq, t, to, out, addr);
                    }
                    Py_XDECREF(nic);
                    Py_XDECREF(counters);
                    Py_XDECREF(to);
                    Py_XDECREF(addr);
                    if (r < 0)
                        goto links_fail;
                    continue;
                }
            slow:
                {
                    PyObject *x = PyObject_CallMethodObjArgs(fabric, s_send, port, dst, out, at_obj, NULL);
                    if (x == NULL)
                        goto links_fail;
                    Py_DECREF(x);
                }
                continue;
            links_fail:
                Py_DECREF(links);
                goto fail;
            }
            Py_DECREF(links);
        }
        Py_CLEAR(outs);
        {
            PyObject *deadline = PyObject_CallMethodNoArgs(device, s_get_timer);
            if (deadline == NULL)
                goto fail;
            PyObject *armed = GA(port, s_armed);
            int ne = armed ? compare(deadline, armed, Py_NE) : -1;
            Py_XDECREF(armed);
            if (ne > 0) {
                ne = arm(fabric, heap, next_seq, port, deadline, at_obj);
            }
            Py_DECREF(deadline);
            if (ne < 0)
                goto fail;
        }
        processed++;
    check_stop:
        if (stop != NULL) {
            PyObject *x = PyObject_CallNoArgs(stop);
            if (x == NULL)
                goto fail;
            int t = PyObject_IsTrue(x);
            Py_DECREF(x);
            if (t < 0)
                goto fail;
            if (t) {
                stopped = 1;
                Py_CLEAR(device);
                Py_CLEAR(port);
                Py_CLEAR(entry);
                break;
            }
        }
    next:
        Py_CLEAR(device);
        Py_CLEAR(port);
        Py_CLEAR(entry);
    }
    return Py_BuildValue("LLi", processed, hops, stopped);
fail:
    Py_XDECREF(outs);
    Py_XDECREF(device);
    Py_XDECREF(port);
    Py_XDECREF(entry);
    return NULL;
}

static PyObject *setup(PyObject *self, PyObject *args)
{
    if (!PyArg_ParseTuple(args, "OOOOOOdL", &PortType, &DrainType, &SwitchHopType, &DatagramType,
                          &CE, &REDType, &wire_overhead, &compact_min_stale))
        return NULL;
    Py_INCREF(PortType);
    Py_INCREF(DrainType);
    Py_INCREF(SwitchHopType);
    Py_INCREF(DatagramType);
    Py_INCREF(CE);
    Py_INCREF(REDType);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, "the fabric's classes: Port, Drain, SwitchHop, Datagram, CE, RED, overhead, compaction"},
    {"run_loop", run_loop, METH_VARARGS,
     "run_loop(fabric, heap, end, limit, stop, ports, next_seq, capture) -> (events, hops, stopped)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_softnic_fabric", NULL, -1, methods};

/* this file's attribute names, interned */
static int fabric_init(void)
{
    INTERN(s_device, "device"); INTERN(s_links, "links"); INTERN(s_armed, "armed");
    INTERN(s_entry_seq, "entry_seq"); INTERN(s_entry_time, "entry_time");
    INTERN(s_attached, "attached"); INTERN(s_ect, "ect"); INTERN(s_pending, "pending");
    INTERN(s_live, "live"); INTERN(s_dst, "dst"); INTERN(s_queue, "queue");
    INTERN(s_drain, "drain"); INTERN(s_delay, "delay"); INTERN(s_fast, "fast");
    INTERN(s_counters, "counters"); INTERN(s_nic, "nic"); INTERN(s_hop, "hop");
    INTERN(s_address, "address"); INTERN(s_event, "event"); INTERN(s_now, "_now");
    INTERN(s_received, "_received"); INTERN(s_dropped_unknown, "_dropped_unknown");
    INTERN(s_stale, "_stale"); INTERN(s_receive_datagram, "receive_datagram");
    INTERN(s_datagrams_to_send, "datagrams_to_send"); INTERN(s_get_timer, "get_timer");
    INTERN(s_handle_timer, "handle_timer"); INTERN(s_send, "_send"); INTERN(s_arm, "_arm");
    INTERN(s_ecn, "ecn"); INTERN(s_echo, "echo"); INTERN(s_hops, "hops");
    INTERN(s_popleft, "popleft"); INTERN(s_append, "append"); INTERN(s_arrive, "arrive");
    INTERN(s_sent, "sent"); INTERN(s_delivered, "delivered"); INTERN(s_busy_until, "busy_until");
    INTERN(s_rate_bps, "rate_bps"); INTERN(s_tx_bytes, "tx_bytes"); INTERN(s_enqueued, "enqueued");
    INTERN(s_max_qlen, "max_qlen"); INTERN(s_dropped, "dropped"); INTERN(s_marked, "marked");
    INTERN(s_plain, "plain"); INTERN(s_sample, "_sample"); INTERN(s_samples, "samples");
    INTERN(s_buffer_bytes, "buffer_bytes"); INTERN(s_red, "red");
    INTERN(s_int_telemetry, "int_telemetry"); INTERN(s_tx_by_src, "tx_by_src");
    INTERN(s_kmin, "kmin"); INTERN(s_kmax, "kmax");
    INTERN(s_rng, "rng"); INTERN(s_random, "random"); INTERN(s_probability, "probability");
    INTERN(s_pmax, "pmax");
    INTERN(s_compact, "_compact"); INTERN(s_record, "record");
    return 0;
}

PyMODINIT_FUNC PyInit__softnic_fabric(void)
{
    if (fabric_init() < 0 || sn_timers_init() < 0 || sn_output_init() < 0
            || sn_requester_init() < 0 || sn_post_init() < 0 || sn_responder_init() < 0
            || sn_completer_init() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddFunctions(m, sn_timers_methods) < 0
                      || PyModule_AddFunctions(m, sn_requester_methods) < 0
                      || PyModule_AddFunctions(m, sn_post_methods) < 0
                      || PyModule_AddFunctions(m, sn_responder_methods) < 0
                      || PyModule_AddFunctions(m, sn_completer_methods) < 0))
        Py_CLEAR(m);
    return m;
}
