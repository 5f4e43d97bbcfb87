/* The C face's post of send work requests, compiled: backend._send_wr's reading
   of each flat record, then softnic.core.verbs.Verbs.post_send and SendWQE for
   the case a program's posts are nearly all in (an RC QP in RTS, not XRC; a
   WRITE, a WRITE or SEND with an immediate, a SEND, a SEND with an invalidation,
   a READ or an ATOMIC), without a SendWR and without the interpreter between a
   record's fields.

   post_records(dev, qp, addr, n) takes the n records of api.h's struct
   sn_send_wr at addr in order, each as post_send would take it, and stops at
   the first one it does not take: a record post_send would refuse (its errno is
   post_send's to give) or one of the cases it leaves to post_send (another QP
   type or state, an address handle, an opcode not above).  Returns how many it
   posted; the caller hands the rest to post_send (backend._post_list).

   Its checks are post_send's, in post_send's order, for the QP's state, type
   and opcode above: the opcode (ALLOWED), the SGE count (max_send_sge), the
   send queue's room (max_send_wr), the length (max_msg_size), an inline
   send's length (max_inline_data, for MAY_INLINE's opcodes; its bytes read
   where its SGEs point, as bytes_at reads them) and an ATOMIC's (one 8-byte
   SGE, an 8-byte aligned remote address).  The WQE it makes is SendWQE's, field
   for field (post_setup checks SendWQE's slots are the ones written here), and
   goes as post_send's does: appended to qp.sq, the QP marked ready
   (dev.mark_ready).  tests/test_post_records.py posts random records both ways
   and compares every outcome, field and errno.

   post_recvs(target, addr, n, srq) does the same for api.h's struct sn_recv_wr
   records: backend._recv_wr, then Verbs.post_srq_recv and SRQ.post (srq true:
   target an SRQ; its SGE count, its room) or Verbs.post_recv (a QP in INIT,
   RTR, RTS or SQD without an SRQ; its SGE count, its room), each RecvWQE
   appended to the queue. */

#include "objects.h"

/* api.h's records (post_setup checks the layout against the C face's) */
struct sn_sge {
    uint64_t addr;
    uint32_t length;
    uint32_t lkey;
};

struct sn_recv_wr {
    uint64_t wr_id;
    struct sn_sge *sg_list;
    int num_sge;
};

struct sn_send_wr {
    uint64_t wr_id;
    struct sn_sge *sg_list;
    int num_sge;
    int opcode;
    unsigned int send_flags;
    uint32_t imm_data;
    uint32_t invalidate_rkey;
    uint64_t remote_addr;
    uint32_t rkey;
    uint64_t compare_add;
    uint64_t swap;
    uint32_t ah;
    uint32_t remote_qpn;
    uint32_t remote_qkey;
};

#define SN_POST_OPS 16          /* WR opcodes by value below this */
#define SN_POST_SGES 32         /* SGEs one record may have here (more: post_send's) */

static PyObject *SendWQE, *RTS, *RC, *RecvWQE, *RECEIVING;  /* RECEIVING: post_recv's states */
static PyObject *OPS[SN_POST_OPS];      /* the WROpcode member of each value taken; NULL: not */
static int MAY_INLINE_[SN_POST_OPS], RD_ATOMIC_[SN_POST_OPS], ATOMIC_[SN_POST_OPS];
static unsigned int INLINE_, SIGNALED_;
static PyObject *s_state, *s_qp_type, *s_xrc, *s_cap, *s_max_send_sge, *s_max_send_wr,
    *s_max_inline_data, *s_sq, *s_sq_sig_all, *s_config, *s_max_msg_size,
    *s_append, *s_max_sge, *s_max_wr, *s_queue, *s_srq, *s_rq, *s_max_recv_sge, *s_max_recv_wr,
    *s_sges, *s_length, *s_wr_id;

/* SendWQE's slots, in the order post_wqe writes them */
static const char *const WQE_SLOTS[] = {
    "wr_id", "opcode", "flags", "sges", "inline", "length", "imm", "inv_rkey",
    "remote_addr", "rkey", "compare_add", "swap", "dest", "remote_qpn", "remote_qkey",
    "signaled", "first_psn", "last_psn", "npkts", "next_pkt", "views", "done", "status",
    "atomic_orig", "rd_atomic", "got", "asked", "iw_msn", "got_bytes", "sink_stag", "sink_to",
    "bind", "xrc_srqn", "flush"};
#define SN_WQE_SLOTS ((int)(sizeof WQE_SLOTS / sizeof WQE_SLOTS[0]))
static PyObject *wqe_names[SN_WQE_SLOTS];

/* setattr(o, name, v), v's reference taken (NULL: the error already set) */
static int put(PyObject *o, int i, PyObject *v)
{
    static struct site sites[SN_WQE_SLOTS];
    if (v == NULL)
        return -1;
    int r = sa(&sites[i], o, wqe_names[i], v);
    Py_DECREF(v);
    return r;
}

/* A SendWQE made for record w (length bytes; its inline bytes or NULL), as
   SendWQE.__init__ makes it for the SendWR _send_wr reads from w. */
static PyObject *post_wqe(const struct sn_send_wr *w, int nsge, uint64_t length,
                          PyObject *inl, int signaled)
{
    PyTypeObject *t = (PyTypeObject *)SendWQE;
    PyObject *args = PyTuple_New(0);
    PyObject *wqe = args == NULL ? NULL : t->tp_new(t, args, NULL);
    Py_XDECREF(args);
    if (wqe == NULL)
        return NULL;
    PyObject *sges = PyList_New(nsge);
    for (int j = 0; sges != NULL && j < nsge; j++) {
        PyObject *e = Py_BuildValue("(KkI)", (unsigned long long)w->sg_list[j].addr,
                                    (unsigned long)w->sg_list[j].length,
                                    (unsigned int)w->sg_list[j].lkey);
        if (e == NULL)
            Py_CLEAR(sges);
        else
            PyList_SET_ITEM(sges, j, e);
    }
    int op = w->opcode;
    if (put(wqe, 0, PyLong_FromUnsignedLongLong(w->wr_id)) < 0
            || put(wqe, 1, Py_NewRef(OPS[op])) < 0
            || put(wqe, 2, PyLong_FromUnsignedLong(w->send_flags)) < 0
            || put(wqe, 3, sges) < 0
            || put(wqe, 4, Py_NewRef(inl != NULL ? inl : Py_None)) < 0
            || put(wqe, 5, PyLong_FromUnsignedLongLong(length)) < 0
            || put(wqe, 6, PyLong_FromUnsignedLong(w->imm_data)) < 0
            || put(wqe, 7, PyLong_FromUnsignedLong(w->invalidate_rkey)) < 0
            || put(wqe, 8, PyLong_FromUnsignedLongLong(w->remote_addr)) < 0
            || put(wqe, 9, PyLong_FromUnsignedLong(w->rkey)) < 0
            || put(wqe, 10, PyLong_FromUnsignedLongLong(w->compare_add)) < 0
            || put(wqe, 11, PyLong_FromUnsignedLongLong(w->swap)) < 0
            || put(wqe, 12, Py_NewRef(Py_None)) < 0                 /* dest: no AH */
            || put(wqe, 13, PyLong_FromUnsignedLong(w->remote_qpn)) < 0
            || put(wqe, 14, PyLong_FromUnsignedLong(w->remote_qkey)) < 0
            || put(wqe, 15, PyBool_FromLong(signaled)) < 0
            || put(wqe, 16, Py_NewRef(Py_None)) < 0                 /* first_psn */
            || put(wqe, 17, PyLong_FromLong(0)) < 0
            || put(wqe, 18, PyLong_FromLong(0)) < 0
            || put(wqe, 19, PyLong_FromLong(0)) < 0
            || put(wqe, 20, Py_NewRef(Py_None)) < 0                 /* views */
            || put(wqe, 21, Py_NewRef(Py_False)) < 0                /* done */
            || put(wqe, 22, Py_NewRef(Py_None)) < 0                 /* status */
            || put(wqe, 23, PyLong_FromLong(0)) < 0
            || put(wqe, 24, PyBool_FromLong(RD_ATOMIC_[op])) < 0
            || put(wqe, 25, Py_NewRef(Py_None)) < 0                 /* got */
            || put(wqe, 26, Py_NewRef(Py_None)) < 0                 /* asked */
            || put(wqe, 27, PyLong_FromLong(0)) < 0
            || put(wqe, 28, PyLong_FromLong(0)) < 0
            || put(wqe, 29, PyLong_FromLong(0)) < 0
            || put(wqe, 30, PyLong_FromLong(0)) < 0
            || put(wqe, 31, Py_NewRef(Py_None)) < 0                 /* bind */
            || put(wqe, 32, PyLong_FromLong(0)) < 0                 /* xrc_srqn: no XRC */
            || put(wqe, 33, Py_NewRef(Py_None)) < 0) {              /* flush: not a FLUSH */
        Py_DECREF(wqe);
        return NULL;
    }
    return wqe;
}

static PyObject *post_records(PyObject *self, PyObject *args)
{
    PyObject *dev, *qp;
    unsigned long long addr;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OOKn", &dev, &qp, &addr, &n))
        return NULL;
    if (SendWQE == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "post_setup first");
        return NULL;
    }
    const struct sn_send_wr *recs = (const struct sn_send_wr *)(uintptr_t)addr;
    Py_ssize_t i = 0;
    PyObject *state = NULL, *qp_type = NULL, *xrc = NULL, *cap = NULL, *sq = NULL,
        *config = NULL;
    long long max_sge, max_wr, max_inline, max_msg;
    int sig_all, ok = 0;
    /* the QP's state, type and limits, read once (a post changes none of them) */
    if ((state = GA(qp, s_state)) == NULL || (qp_type = GA(qp, s_qp_type)) == NULL
            || (xrc = GA(qp, s_xrc)) == NULL || (cap = GA(qp, s_cap)) == NULL
            || (sq = GA(qp, s_sq)) == NULL || (config = GA(dev, s_config)) == NULL
            || get_ll(cap, s_max_send_sge, &max_sge) < 0
            || get_ll(cap, s_max_send_wr, &max_wr) < 0
            || get_ll(cap, s_max_inline_data, &max_inline) < 0
            || get_ll(config, s_max_msg_size, &max_msg) < 0
            || (sig_all = get_truth(qp, s_sq_sig_all)) < 0)
        goto out;
    ok = 1;
    if (state != RTS || qp_type != RC || xrc != Py_None)
        goto out;                                   /* post_send's, all of them */
    for (; i < n; i++) {
        const struct sn_send_wr *w = recs + i;
        int op = w->opcode, nsge = w->num_sge;
        if (op < 0 || op >= SN_POST_OPS || OPS[op] == NULL || w->ah != 0)
            break;                                  /* (not ours: post_send's) */
        /* post_send's checks in its order; any that fails is post_send's to refuse */
        if (nsge < 0 || nsge > max_sge || nsge > SN_POST_SGES
                || (nsge > 0 && w->sg_list == NULL))
            break;                                  /* ENOMEM ("max gs exceeded"), ... */
        Py_ssize_t queued = PyObject_Length(sq);
        if (queued < 0) {
            ok = 0;
            break;
        }
        if (queued >= max_wr)
            break;                                  /* ENOMEM: the send queue is full */
        uint64_t length = 0;
        for (int j = 0; j < nsge; j++)
            length += w->sg_list[j].length;
        if (length > (uint64_t)max_msg)
            break;                                  /* EINVAL */
        PyObject *inl = NULL;
        if ((w->send_flags & INLINE_) && MAY_INLINE_[op]) {
            if (length > (uint64_t)max_inline)
                break;                              /* EINVAL */
            inl = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)length);
            if (inl == NULL) {
                ok = 0;
                break;
            }
            char *p = PyBytes_AS_STRING(inl);
            for (int j = 0; j < nsge; j++) {        /* bytes_at: where the SGE points */
                memcpy(p, (const void *)(uintptr_t)w->sg_list[j].addr, w->sg_list[j].length);
                p += w->sg_list[j].length;
            }
        }
        if (ATOMIC_[op] && (length != 8 || (w->remote_addr & 7))) {
            Py_XDECREF(inl);
            break;                                  /* EINVAL */
        }
        int signaled = sig_all || (w->send_flags & SIGNALED_) != 0;
        PyObject *wqe = post_wqe(w, nsge, length, inl, signaled);
        Py_XDECREF(inl);
        PyObject *r = wqe == NULL ? NULL : call1(sq, s_append, wqe);
        Py_XDECREF(wqe);
        if (r == NULL) {
            ok = 0;
            break;
        }
        Py_DECREF(r);
        if (mark_ready(dev, qp) < 0) {
            ok = 0;
            i++;                                    /* (it is posted) */
            break;
        }
    }
out:
    Py_XDECREF(state);
    Py_XDECREF(qp_type);
    Py_XDECREF(xrc);
    Py_XDECREF(cap);
    Py_XDECREF(sq);
    Py_XDECREF(config);
    if (!ok)
        return NULL;
    return PyLong_FromSsize_t(i);
}

/* post_setup(SendWQE, QPState.RTS, QPType.RC, {value: (WROpcode member, may
   inline, rd_atomic, atomic)}, IBV_SEND_INLINE, IBV_SEND_SIGNALED, the C face's
   sizeof(struct sn_send_wr), its fields' offsets, sizeof(struct sn_sge)):
   what post_records needs of softnic.core, and a check that the records are
   laid out as here and SendWQE's slots are the ones post_wqe writes
   (RuntimeError if not: the caller posts the Python's way). */
static PyObject *post_setup(PyObject *self, PyObject *args)
{
    PyObject *cls, *rts, *rc, *ops, *offsets, *slots;
    unsigned int inl, sig;
    Py_ssize_t size, sge_size;
    if (!PyArg_ParseTuple(args, "OOOO!IInO!n", &cls, &rts, &rc, &PyDict_Type, &ops, &inl, &sig,
                          &size, &PyTuple_Type, &offsets, &sge_size))
        return NULL;
    static const size_t want[] = {
        offsetof(struct sn_send_wr, wr_id), offsetof(struct sn_send_wr, sg_list),
        offsetof(struct sn_send_wr, num_sge), offsetof(struct sn_send_wr, opcode),
        offsetof(struct sn_send_wr, send_flags), offsetof(struct sn_send_wr, imm_data),
        offsetof(struct sn_send_wr, invalidate_rkey), offsetof(struct sn_send_wr, remote_addr),
        offsetof(struct sn_send_wr, rkey), offsetof(struct sn_send_wr, compare_add),
        offsetof(struct sn_send_wr, swap), offsetof(struct sn_send_wr, ah),
        offsetof(struct sn_send_wr, remote_qpn), offsetof(struct sn_send_wr, remote_qkey)};
    int layout = size == (Py_ssize_t)sizeof(struct sn_send_wr)
        && sge_size == (Py_ssize_t)sizeof(struct sn_sge)
        && PyTuple_GET_SIZE(offsets) == (Py_ssize_t)(sizeof want / sizeof want[0]);
    for (Py_ssize_t k = 0; layout && k < PyTuple_GET_SIZE(offsets); k++)
        layout = PyLong_AsSsize_t(PyTuple_GET_ITEM(offsets, k)) == (Py_ssize_t)want[k];
    if (PyErr_Occurred())
        return NULL;
    if (!layout) {
        PyErr_SetString(PyExc_RuntimeError, "post.c: struct sn_send_wr is laid out otherwise");
        return NULL;
    }
    if ((slots = PyObject_GetAttrString(cls, "__slots__")) == NULL)
        return NULL;
    int same = PyTuple_Check(slots) && PyTuple_GET_SIZE(slots) == SN_WQE_SLOTS;
    for (int k = 0; same && k < SN_WQE_SLOTS; k++)
        same = PyUnicode_Check(PyTuple_GET_ITEM(slots, k))
            && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(slots, k), WQE_SLOTS[k]) == 0;
    Py_DECREF(slots);
    if (!same) {
        PyErr_SetString(PyExc_RuntimeError, "post.c: SendWQE's slots are not the ones it writes");
        return NULL;
    }
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "post_setup: SendWQE must be a class");
        return NULL;
    }
    for (int k = 0; k < SN_POST_OPS; k++) {
        Py_CLEAR(OPS[k]);
        MAY_INLINE_[k] = RD_ATOMIC_[k] = ATOMIC_[k] = 0;
    }
    PyObject *key, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(ops, &pos, &key, &v)) {
        long k = PyLong_AsLong(key);
        PyObject *member;
        int may, rd, atomic;
        if (k < 0 || k >= SN_POST_OPS
                || !PyArg_ParseTuple(v, "Oppp", &member, &may, &rd, &atomic)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "post_setup: an opcode out of range");
            return NULL;
        }
        OPS[k] = Py_NewRef(member);
        MAY_INLINE_[k] = may;
        RD_ATOMIC_[k] = rd;
        ATOMIC_[k] = atomic;
    }
    Py_XSETREF(SendWQE, Py_NewRef(cls));
    Py_XSETREF(RTS, Py_NewRef(rts));
    Py_XSETREF(RC, Py_NewRef(rc));
    INLINE_ = inl;
    SIGNALED_ = sig;
    Py_RETURN_NONE;
}

/* A RecvWQE for record w, as RecvWQE.__init__ makes it for _recv_wr's RecvWR */
static PyObject *recv_wqe(const struct sn_recv_wr *w)
{
    static struct site site_wr_id, site_sges, site_length;
    PyTypeObject *t = (PyTypeObject *)RecvWQE;
    PyObject *args = PyTuple_New(0);
    PyObject *wqe = args == NULL ? NULL : t->tp_new(t, args, NULL);
    Py_XDECREF(args);
    if (wqe == NULL)
        return NULL;
    int nsge = w->num_sge;
    uint64_t length = 0;
    PyObject *sges = PyList_New(nsge), *v;
    for (int j = 0; sges != NULL && j < nsge; j++) {
        PyObject *e = Py_BuildValue("(KkI)", (unsigned long long)w->sg_list[j].addr,
                                    (unsigned long)w->sg_list[j].length,
                                    (unsigned int)w->sg_list[j].lkey);
        length += w->sg_list[j].length;
        if (e == NULL)
            Py_CLEAR(sges);
        else
            PyList_SET_ITEM(sges, j, e);
    }
    int r = sges == NULL ? -1 : sa(&site_sges, wqe, s_sges, sges);
    Py_XDECREF(sges);
    if (r == 0) {
        v = PyLong_FromUnsignedLongLong(w->wr_id);
        r = v == NULL ? -1 : sa(&site_wr_id, wqe, s_wr_id, v);
        Py_XDECREF(v);
    }
    if (r == 0) {
        v = PyLong_FromUnsignedLongLong(length);
        r = v == NULL ? -1 : sa(&site_length, wqe, s_length, v);
        Py_XDECREF(v);
    }
    if (r < 0)
        Py_CLEAR(wqe);
    return wqe;
}

static PyObject *post_recvs(PyObject *self, PyObject *args)
{
    PyObject *target;
    unsigned long long addr;
    Py_ssize_t n;
    int srq;
    if (!PyArg_ParseTuple(args, "OKnp", &target, &addr, &n, &srq))
        return NULL;
    if (RecvWQE == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "recv_setup first");
        return NULL;
    }
    const struct sn_recv_wr *recs = (const struct sn_recv_wr *)(uintptr_t)addr;
    Py_ssize_t i = 0;
    PyObject *queue = NULL, *state = NULL, *has_srq = NULL, *cap = NULL;
    long long max_sge, max_wr;
    int ok = 0;
    if (srq) {                                      /* SRQ.post's limits */
        if ((queue = GA(target, s_queue)) == NULL || get_ll(target, s_max_sge, &max_sge) < 0
                || get_ll(target, s_max_wr, &max_wr) < 0)
            goto out;
    } else {                                        /* post_recv's */
        if ((state = GA(target, s_state)) == NULL || (has_srq = GA(target, s_srq)) == NULL
                || (queue = GA(target, s_rq)) == NULL || (cap = GA(target, s_cap)) == NULL
                || get_ll(cap, s_max_recv_sge, &max_sge) < 0
                || get_ll(cap, s_max_recv_wr, &max_wr) < 0)
            goto out;
        int receiving = PySequence_Contains(RECEIVING, state);
        if (receiving < 0)
            goto out;
        if (!receiving || has_srq != Py_None) {
            ok = 1;                                 /* RESET, ERR, an SRQ's: post_recv's */
            goto out;
        }
    }
    ok = 1;
    for (; i < n; i++) {
        const struct sn_recv_wr *w = recs + i;
        if (w->num_sge < 0 || w->num_sge > max_sge || w->num_sge > SN_POST_SGES
                || (w->num_sge > 0 && w->sg_list == NULL))
            break;                                  /* EINVAL: too many SGEs */
        Py_ssize_t queued = PyObject_Length(queue);
        if (queued < 0) {
            ok = 0;
            break;
        }
        if (queued >= max_wr)
            break;                                  /* ENOMEM: the queue is full */
        PyObject *wqe = recv_wqe(w);
        PyObject *r = wqe == NULL ? NULL : call1(queue, s_append, wqe);
        Py_XDECREF(wqe);
        if (r == NULL) {
            ok = 0;
            break;
        }
        Py_DECREF(r);
    }
out:
    Py_XDECREF(queue);
    Py_XDECREF(state);
    Py_XDECREF(has_srq);
    Py_XDECREF(cap);
    if (!ok)
        return NULL;
    return PyLong_FromSsize_t(i);
}

/* recv_setup(RecvWQE, post_recv's states, sizeof(struct sn_recv_wr), its fields'
   offsets): post_recvs' classes, and the records' layout checked (RuntimeError
   if not as here, or RecvWQE's slots not the three recv_wqe writes) */
static PyObject *recv_setup(PyObject *self, PyObject *args)
{
    PyObject *cls, *states, *offsets, *slots;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "OO!nO!", &cls, &PyTuple_Type, &states, &size, &PyTuple_Type,
                          &offsets))
        return NULL;
    static const size_t want[] = {offsetof(struct sn_recv_wr, wr_id),
                                  offsetof(struct sn_recv_wr, sg_list),
                                  offsetof(struct sn_recv_wr, num_sge)};
    int layout = size == (Py_ssize_t)sizeof(struct sn_recv_wr) && PyTuple_GET_SIZE(offsets) == 3;
    for (Py_ssize_t k = 0; layout && k < 3; k++)
        layout = PyLong_AsSsize_t(PyTuple_GET_ITEM(offsets, k)) == (Py_ssize_t)want[k];
    if (PyErr_Occurred())
        return NULL;
    if (!layout) {
        PyErr_SetString(PyExc_RuntimeError, "post.c: struct sn_recv_wr is laid out otherwise");
        return NULL;
    }
    if (!PyType_Check(cls) || (slots = PyObject_GetAttrString(cls, "__slots__")) == NULL)
        return PyErr_Occurred() ? NULL : (PyErr_SetString(PyExc_TypeError, "a class"), NULL);
    int same = PyTuple_Check(slots) && PyTuple_GET_SIZE(slots) == 3
        && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(slots, 0), "wr_id") == 0
        && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(slots, 1), "sges") == 0
        && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(slots, 2), "length") == 0;
    Py_DECREF(slots);
    if (!same) {
        PyErr_SetString(PyExc_RuntimeError, "post.c: RecvWQE's slots are not the ones it writes");
        return NULL;
    }
    Py_XSETREF(RecvWQE, Py_NewRef(cls));
    Py_XSETREF(RECEIVING, Py_NewRef(states));
    Py_RETURN_NONE;
}

PyMethodDef sn_post_methods[] = {
    {"recv_setup", recv_setup, METH_VARARGS, "what post_recvs needs of softnic.core"},
    {"post_recvs", post_recvs, METH_VARARGS,
     "post_recvs(target, addr, n, srq): the C face's receive records posted as "
     "post_recv or post_srq_recv posts them, up to the first it leaves to them; how many"},
    {"post_setup", post_setup, METH_VARARGS, "what post_records needs of softnic.core"},
    {"post_records", post_records, METH_VARARGS,
     "post_records(dev, qp, addr, n): the C face's send records posted as post_send "
     "posts them, up to the first it leaves to post_send; how many it posted"},
    {NULL, NULL, 0, NULL}};

int sn_post_init(void)
{
    INTERN(s_state, "state"); INTERN(s_qp_type, "qp_type"); INTERN(s_xrc, "xrc");
    INTERN(s_cap, "cap"); INTERN(s_max_send_sge, "max_send_sge");
    INTERN(s_max_send_wr, "max_send_wr"); INTERN(s_max_inline_data, "max_inline_data");
    INTERN(s_sq, "sq"); INTERN(s_sq_sig_all, "sq_sig_all"); INTERN(s_config, "config");
    INTERN(s_max_msg_size, "max_msg_size");
    INTERN(s_append, "append"); INTERN(s_max_sge, "max_sge"); INTERN(s_max_wr, "max_wr");
    INTERN(s_queue, "queue"); INTERN(s_srq, "srq"); INTERN(s_rq, "rq");
    INTERN(s_max_recv_sge, "max_recv_sge"); INTERN(s_max_recv_wr, "max_recv_wr");
    INTERN(s_sges, "sges"); INTERN(s_length, "length"); INTERN(s_wr_id, "wr_id");
    for (int k = 0; k < SN_WQE_SLOTS; k++)
        INTERN(wqe_names[k], WQE_SLOTS[k]);
    return 0;
}
