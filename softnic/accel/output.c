/* A device's drain (softnic.core.output.Output), its common case compiled.

   ``Output.datagrams_to_send``, ``Output._outgoing`` and ``Output._requests``,
   statement for statement, over the device's and its QPs' own Python objects,
   for a device whose CM agent has no MAD to send and that owes no CNP (the
   simulated fabric's hosts, and a NIC's device between connections: with a MAD or
   a CNP, ``_outgoing`` runs as Python's).  What a packet is stays in
   Python: the requester's ``generate`` (through requester.c's ``sn_generate``,
   which runs a controlled QP's MIDDLEs compiled and hands every other case to
   it), the responder's answers (``_responses``), the timeouts (``rto``,
   ``probe_interval``), the completer's ``complete``, sealing a list of more
   than one packet (``_sealed``); each is called as the Python calls it (a
   module's function looked up at each call, a device's method through its
   class).  The rules (requests before responses,
   the retransmission timer started with a QP's first packets, a controlled QP
   armed by the drain that takes it) live in output.py; this file is a faster
   way through them.

   Its methods (``arm`` and the timers' in timers.c beside it) are made the
   methods of a device class by ``softnic.accel.give_compiled``.
   tests/test_sim_reference.py runs incasts on them and on the Python's and
   compares every delivery. */

#include "objects.h"

int sn_arm(PyObject *dev, PyObject *qp);        /* timers.c: dev.arm(qp) */
int sn_generate(PyObject *dev, PyObject *qp, PyObject *now, PyObject *out);    /* requester.c */
int sn_requester_setup(PyObject *requester);

static PyObject *completer_module;
static PyObject *py_outgoing, *py_requests;     /* Output._outgoing, Output._requests */
static PyObject *SENDING, *RC, *SQD;            /* output.py's _SENDING, _RC, _SQD */
static PyObject *ZERO_ICRC;                     /* output.py's _ZERO_ICRC (bytes) */
static PyObject *s_ready, *s_cnps, *s_gsi, *s_closed, *s_resp, *s_out, *s_state, *s_cc,
    *s_sq, *s_req, *s_send_idx, *s_comp, *s_rexmit, *s_qp_type, *s_rto_at, *s_attr,
    *s_timeout, *s_rto, *s_selective_repeat, *s_probe_at, *s_probe_interval, *s_done,
    *s_complete, *s_responses, *s_config, *s_icrc, *s_sent_pkts,
    *s_sealed, *s_outgoing, *s_requests, *s_pending;

/* if qp.resp.out: self._responses(qp, out) */
static int responses(PyObject *dev, PyObject *qp, PyObject *out)
{
    PyObject *resp = GA(qp, s_resp);
    if (resp == NULL)
        return -1;
    int owed = get_truth(resp, s_out);
    Py_DECREF(resp);
    if (owed <= 0)
        return owed;
    PyObject *args[4] = {NULL, dev, qp, out};
    PyObject *r = PyObject_VectorcallMethod(s_responses, args + 1,
                                            3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* Output._requests(self, qp, now, out) */
static int requests(PyObject *dev, PyObject *qp, PyObject *now, PyObject *out)
{
    int r = -1;
    PyObject *sq = GA(qp, s_sq), *req = NULL, *idx = NULL, *comp = NULL, *cc = NULL;
    if (sq == NULL)
        return -1;
    Py_ssize_t nsq = PyObject_Length(sq);
    if (nsq < 0 || (req = GA(qp, s_req)) == NULL || (idx = GA(req, s_send_idx)) == NULL)
        goto out;
    Py_ssize_t i = PyLong_AsSsize_t(idx);
    if (i == -1 && PyErr_Occurred())
        goto out;
    int more = i < nsq;                         /* qp.req.send_idx < len(sq) or qp.comp.rexmit */
    if (!more) {
        if ((comp = GA(qp, s_comp)) == NULL || (more = get_truth(comp, s_rexmit)) < 0)
            goto out;
        Py_CLEAR(comp);
    }
    if (more) {
        Py_ssize_t n0 = PyList_GET_SIZE(out);
        if (sn_generate(dev, qp, now, out) < 0)    /* requester.generate(self, qp, now, out) */
            goto out;
        if ((comp = GA(qp, s_comp)) == NULL)
            goto out;
        int start = PyList_GET_SIZE(out) > n0;
        if (start) {                            /* and qp.qp_type is _RC and comp.rto_at is None */
            PyObject *t = GA(qp, s_qp_type), *at = t ? GA(comp, s_rto_at) : NULL;
            start = at == NULL ? -1 : (t == RC && at == Py_None);
            Py_XDECREF(t);
            Py_XDECREF(at);
        }
        if (start > 0) {                        /* and qp.attr.timeout */
            PyObject *attr = GA(qp, s_attr);
            start = attr == NULL ? -1 : get_truth(attr, s_timeout);
            Py_XDECREF(attr);
        }
        if (start < 0)
            goto out;
        if (start) {                            /* comp.rto_at = now + self.rto(qp) */
            PyObject *d = call1(dev, s_rto, qp), *at = d ? PyNumber_Add(now, d) : NULL;
            Py_XDECREF(d);
            int s = at == NULL ? -1 : SA(comp, s_rto_at, at);
            Py_XDECREF(at);
            if (s < 0)
                goto out;
            int sr = get_truth(qp, s_selective_repeat);
            if (sr < 0)
                goto out;
            if (sr) {                           /* comp.probe_at = now + self.probe_interval(qp) */
                d = call1(dev, s_probe_interval, qp);
                at = d ? PyNumber_Add(now, d) : NULL;
                Py_XDECREF(d);
                s = at == NULL ? -1 : SA(comp, s_probe_at, at);
                Py_XDECREF(at);
                if (s < 0)
                    goto out;
            }
            if ((cc = GA(qp, s_cc)) == NULL)
                goto out;
            if (cc == Py_None && sn_arm(dev, qp) < 0)   /* (a controlled QP's is below) */
                goto out;
            Py_CLEAR(cc);
        }
    }
    if ((cc = GA(qp, s_cc)) == NULL)
        goto out;
    if (cc != Py_None && sn_arm(dev, qp) < 0)
        goto out;
    int due = 0;                                /* (sq and sq[0].done) or qp.state is _SQD */
    if (PyObject_Length(sq) > 0) {
        PyObject *w = PySequence_GetItem(sq, 0);
        due = w == NULL ? -1 : get_truth(w, s_done);
        Py_XDECREF(w);
    } else if (PyErr_Occurred())
        due = -1;
    if (due == 0) {
        PyObject *st = GA(qp, s_state);
        due = st == NULL ? -1 : st == SQD;
        Py_XDECREF(st);
    }
    if (due < 0)
        goto out;
    if (due) {                                  /* completer.complete(self, qp) */
        PyObject *args[2] = {dev, qp};
        PyObject *c = call_fn(completer_module, s_complete, args, 2);
        if (c == NULL)
            goto out;
        Py_DECREF(c);
    }
    r = 0;
out:
    Py_DECREF(sq);
    Py_XDECREF(req);
    Py_XDECREF(idx);
    Py_XDECREF(comp);
    Py_XDECREF(cc);
    return r;
}

/* self._requests(qp, now, out): the compiled one where it is Output's own */
static int call_requests(PyObject *dev, PyObject *qp, PyObject *now, PyObject *out)
{
    if (_PyType_Lookup(Py_TYPE(dev), s_requests) == py_requests)
        return requests(dev, qp, now, out);
    PyObject *args[5] = {NULL, dev, qp, now, out};
    PyObject *r = PyObject_VectorcallMethod(s_requests, args + 1,
                                            4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* Output._outgoing(self, now): a new list */
static PyObject *outgoing(PyObject *dev, PyObject *now)
{
    PyObject *gsi = GA(dev, s_gsi), *cnps = gsi ? GA(dev, s_cnps) : NULL;
    int rare = cnps == NULL ? -1 : PyObject_IsTrue(cnps);
    if (rare == 0 && gsi != Py_None)            /* gsi is not None and gsi.pending */
        rare = get_truth(gsi, s_pending);
    Py_XDECREF(gsi);
    Py_XDECREF(cnps);
    if (rare < 0)
        return NULL;
    if (rare) {                                 /* a CM agent's MADs, or CNPs owed: Python's */
        PyObject *args[2] = {dev, now};
        return PyObject_Vectorcall(py_outgoing, args, 2, NULL);
    }
    PyObject *ready = GA(dev, s_ready);
    if (ready == NULL)
        return NULL;
    if (!PyDict_CheckExact(ready)) {
        Py_DECREF(ready);
        PyErr_SetString(PyExc_TypeError, "a device's ready QPs must be a dict");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL || PyDict_GET_SIZE(ready) == 0) {
        Py_DECREF(ready);
        return out;
    }
    PyObject *fresh = PyDict_New();             /* ready, self._ready = self._ready, {} */
    int r = fresh == NULL ? -1 : SA(dev, s_ready, fresh);
    Py_XDECREF(fresh);
    Py_ssize_t pos = 0, n = PyDict_GET_SIZE(ready);
    PyObject *qp, *v;
    while (r == 0 && PyDict_Next(ready, &pos, &qp, &v)) {
        Py_INCREF(qp);
        int closed = get_truth(qp, s_closed);
        if (closed < 0)
            r = -1;
        else if (closed)
            r = responses(dev, qp, out);        /* the answers it owed when destroyed */
        else {
            PyObject *st = GA(qp, s_state);
            int sending = st == NULL ? -1 : PySequence_Contains(SENDING, st);
            Py_XDECREF(st);
            if (sending < 0)
                r = -1;
            else if (sending)
                r = call_requests(dev, qp, now, out);
            else {                              /* elif qp.cc is not None: self.arm(qp) */
                PyObject *cc = GA(qp, s_cc);
                r = cc == NULL ? -1 : cc == Py_None ? 0 : sn_arm(dev, qp);
                Py_XDECREF(cc);
            }
            if (r == 0)
                r = responses(dev, qp, out);
        }
        Py_DECREF(qp);
        if (r == 0 && PyDict_GET_SIZE(ready) != n) {
            PyErr_SetString(PyExc_RuntimeError, "dictionary changed size during iteration");
            r = -1;
        }
    }
    Py_DECREF(ready);
    if (r < 0)
        Py_CLEAR(out);
    return out;
}

static PyObject *dev_outgoing(PyObject *dev, PyObject *now)
{
    return outgoing(dev, now);
}

/* Output.datagrams_to_send(self, now) */
static PyObject *dev_datagrams_to_send(PyObject *dev, PyObject *now)
{
    PyObject *ready = GA(dev, s_ready), *cnps = NULL, *gsi = NULL, *out = NULL;
    if (ready == NULL)
        return NULL;
    int any = PyObject_IsTrue(ready);           /* not ready and not cnps and gsi is None */
    if (any == 0) {
        any = (cnps = GA(dev, s_cnps)) == NULL ? -1 : PyObject_IsTrue(cnps);
        if (any == 0)
            any = (gsi = GA(dev, s_gsi)) == NULL ? -1 : gsi != Py_None;
    }
    Py_DECREF(ready);
    Py_XDECREF(cnps);
    Py_XDECREF(gsi);
    if (any <= 0)
        return any < 0 ? NULL : PyList_New(0);
    PyObject *own = _PyType_Lookup(Py_TYPE(dev), s_outgoing);     /* self._outgoing(now) */
    if (own != NULL && Py_IS_TYPE(own, &PyMethodDescr_Type)
        && ((PyMethodDescrObject *)own)->d_method->ml_meth == (PyCFunction)dev_outgoing)
        out = outgoing(dev, now);
    else
        out = call1(dev, s_outgoing, now);
    if (out == NULL)
        return NULL;
    Py_ssize_t n = PyObject_Length(out);        /* if not out: return out */
    if (n < 0)
        goto fail;
    if (n == 0)
        return out;
    if (n == 1 && PyList_CheckExact(out) && PyTuple_CheckExact(PyList_GET_ITEM(out, 0))) {
        PyObject *config = GA(dev, s_config);
        int icrc = config == NULL ? -1 : get_truth(config, s_icrc);
        Py_XDECREF(config);
        if (icrc < 0)
            goto fail;
        if (!icrc) {                            /* the one packet a paced sender sends */
            PyObject *item = PyList_GET_ITEM(out, 0);
            if (PyTuple_GET_SIZE(item) != 2) {
                PyErr_Format(PyExc_ValueError, "%s values to unpack (expected 2)",
                             PyTuple_GET_SIZE(item) > 2 ? "too many" : "not enough");
                goto fail;
            }
            PyObject *pkt = PyTuple_GET_ITEM(item, 0), *dest = PyTuple_GET_ITEM(item, 1);
            Py_INCREF(pkt);
            Py_INCREF(dest);
            /* self.counters["sent_pkts"] += 1 */
            int s = dev_count(dev, s_sent_pkts, 1);
            PyObject *data = NULL;              /* b"".join((pkt, _ZERO_ICRC)) */
            Py_buffer b;
            Py_ssize_t nz = PyBytes_GET_SIZE(ZERO_ICRC);
            if (s == 0 && PyObject_GetBuffer(pkt, &b, PyBUF_SIMPLE) == 0) {
                data = PyBytes_FromStringAndSize(NULL, b.len + nz);
                if (data != NULL) {
                    memcpy(PyBytes_AS_STRING(data), b.buf, b.len);
                    memcpy(PyBytes_AS_STRING(data) + b.len, PyBytes_AS_STRING(ZERO_ICRC), nz);
                }
                PyBuffer_Release(&b);
            }
            Py_DECREF(pkt);
            PyObject *res = data == NULL ? NULL : PyList_New(1);
            PyObject *pair = res == NULL ? NULL : PyTuple_Pack(2, data, dest);
            Py_XDECREF(data);
            Py_DECREF(dest);
            if (pair == NULL) {
                Py_XDECREF(res);
                goto fail;
            }
            PyList_SET_ITEM(res, 0, pair);
            Py_DECREF(out);
            return res;
        }
    }
    PyObject *res = PyObject_CallMethodObjArgs(dev, s_sealed, out, Py_True, NULL);
    Py_DECREF(out);
    return res;
fail:
    Py_DECREF(out);
    return NULL;
}

PyMethodDef sn_output_methods[] = {
    {"datagrams_to_send", (PyCFunction)dev_datagrams_to_send, METH_O,
     "Output.datagrams_to_send(now), compiled"},
    {"_outgoing", (PyCFunction)dev_outgoing, METH_O, "Output._outgoing(now), compiled"},
    {NULL, NULL, 0, NULL},
};

/* the modules the drain calls into, and output.py's constants */
int sn_output_setup(PyObject *requester, PyObject *completer, PyObject *output)
{
    if (sn_requester_setup(requester) < 0)
        return -1;
    Py_XSETREF(completer_module, Py_NewRef(completer));
    PyObject *cls = PyObject_GetAttrString(output, "Output");
    if (cls == NULL)
        return -1;
    Py_XSETREF(py_outgoing, PyObject_GetAttrString(cls, "_outgoing"));
    Py_XSETREF(py_requests, PyObject_GetAttrString(cls, "_requests"));
    Py_DECREF(cls);
    Py_XSETREF(SENDING, PyObject_GetAttrString(output, "_SENDING"));
    Py_XSETREF(RC, PyObject_GetAttrString(output, "_RC"));
    Py_XSETREF(SQD, PyObject_GetAttrString(output, "_SQD"));
    Py_XSETREF(ZERO_ICRC, PyObject_GetAttrString(output, "_ZERO_ICRC"));
    if (ZERO_ICRC != NULL && !PyBytes_CheckExact(ZERO_ICRC)) {
        PyErr_SetString(PyExc_TypeError, "output._ZERO_ICRC must be bytes");
        Py_CLEAR(ZERO_ICRC);
    }
    return py_outgoing && py_requests && SENDING && RC && SQD && ZERO_ICRC ? 0 : -1;
}

int sn_output_init(void)
{
    INTERN(s_ready, "_ready"); INTERN(s_cnps, "_cnps"); INTERN(s_gsi, "gsi");
    INTERN(s_closed, "closed"); INTERN(s_resp, "resp"); INTERN(s_out, "out");
    INTERN(s_state, "state"); INTERN(s_cc, "cc"); INTERN(s_sq, "sq"); INTERN(s_req, "req");
    INTERN(s_send_idx, "send_idx"); INTERN(s_comp, "comp"); INTERN(s_rexmit, "rexmit");
    INTERN(s_qp_type, "qp_type"); INTERN(s_rto_at, "rto_at"); INTERN(s_attr, "attr");
    INTERN(s_timeout, "timeout"); INTERN(s_rto, "rto");
    INTERN(s_selective_repeat, "selective_repeat"); INTERN(s_probe_at, "probe_at");
    INTERN(s_probe_interval, "probe_interval"); INTERN(s_done, "done");
    INTERN(s_complete, "complete");
    INTERN(s_responses, "_responses"); INTERN(s_config, "config"); INTERN(s_icrc, "icrc");
    INTERN(s_sent_pkts, "sent_pkts"); INTERN(s_sealed, "_sealed");
    INTERN(s_outgoing, "_outgoing"); INTERN(s_requests, "_requests");
    INTERN(s_pending, "pending");
    return 0;
}
