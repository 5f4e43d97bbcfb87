/* A plain ACK received (softnic.core.completer.receive_common), and a READ RESPONSE
   ONLY or an ATOMIC ACKNOWLEDGE (receive_answer_common), compiled.

   ``receive_common``'s checks, statement for statement over the device's and
   the QP's own Python objects, for an ACK of 20 bytes (BTH, AETH, ICRC): no pad,
   the default P_Key, FECN and BECN clear, an AETH syndrome of ACK; for an RC QP
   in RTS with work queued, from its peer (``_common_qp``); the oldest WQE
   started, not done, not a READ or ATOMIC; the PSN inside it, beyond the last
   one acknowledged, or beyond it and below the next PSN to send with no READ or
   ATOMIC outstanding (a coalesced ACK of several SENDs or WRITEs: ``_ack_before``
   then completes those before the one the PSN is in); the ICRC (kernel.c's
   ``sn_rx_edge`` of the packet, its state from ``rx_icrc_start``'s memo, as
   responder.c reads it).  Then what ``receive_common`` does with it, over the
   same objects: counted, ``_ack_before`` and ``acknowledged`` (``_finish`` of
   each WQE the PSN ends or passes, or the acknowledged PSN inside the message),
   ``_progress`` (``_forward``; the QP marked ready where it has more to send;
   the retransmission timer restarted, by ``dev.rto``, where anything is still in
   flight; ``dev.arm``) and ``complete`` (each finished WQE taken off the SQ, its
   completion posted where it is signaled, a SEND counted).

   ``receive_answer_common``'s for the answer to the oldest WQE, a READ or an
   ATOMIC, at its first PSN, the next to be acknowledged (``answered``): a READ
   RESPONSE ONLY for a READ of one packet whose length is the payload's, placed
   in its one buffer by ``sn_rx_edge`` as it checks the packet
   (``_read_response``'s ``scatter``; no retry pending after it), or an ATOMIC
   ACKNOWLEDGE whose original value goes to the ATOMIC's buffer in the host's
   byte order (``_atomic_ack``); ``_finish`` (one READ or ATOMIC fewer
   outstanding), ``_progress`` and ``complete`` as for an ACK.

   Only where what the Python would do for it is that alone: no congestion
   controller, go-back-N (no selective repeat: no SACKed PSN, nothing resent and
   remembered, nothing held beyond a hole), every WQE it finishes not yet given a
   status and none behind them already done, the send CQ's push at its first
   case for the completions (``Device.post_cqe`` and ``CQ.push`` the classes'
   own, not overflowed, not armed, room: responder.c's ``sn_cq_room``,
   ``sn_post_cqe_plain``), ICRC checking on, and ``_progress`` and ``complete``
   the module's own.  Anything else: 0, nothing changed, and the device takes
   the datagram as before (``receive_datagram``: the Python's ``receive_common``
   or ``receive_answer_common``, then the general path).

   ``softnic.accel.give_compiled`` makes them a device class's ``_ack`` and
   ``_answer`` (``Dispatch._ack``'s and ``_answer``'s places), which
   ``Dispatch.receive_run`` calls for each ACKNOWLEDGE, READ RESPONSE ONLY and
   ATOMIC ACKNOWLEDGE it receives; where the module's ``receive_common`` or
   ``receive_answer_common`` is not the Python's own (a test's stand-in, a
   tracer), or the device's kernel is not the one hooked in, that function is
   called instead.  tests/test_ack_common.py compares them with the Python's on
   random SQs, packets and QP states, field by field. */

#include "objects.h"
#include "bytes.h"

/* responder.c's, shared: the ICRC state of an edge, the kernel's sn_rx_edge, a
   completion made and posted without the interpreter's calls */
int sn_rx_start(PyObject *dev, PyObject *src, long long size, long long w0, long long qpn,
                uint32_t *out);
void *sn_rx_edge_of(PyObject *dev, int *err);
PyObject *sn_new_wc(PyObject *const *args);
int sn_cq_room(PyObject *cq, Py_ssize_t k, PyObject **entries);
int sn_post_cqe_plain(PyObject *dev, PyObject *cq, PyObject *entries, PyObject *wc, int se);
int sn_post_cqe_own(PyObject *dev);

typedef int (*rx_edge_fn)(const uint8_t *, size_t, uint32_t, uint32_t, uint32_t, uint32_t, int,
                          uint8_t *, uint64_t, uint64_t, uint64_t);

static PyObject *completer_module, *py_receive_common, *py_progress, *py_complete;
static PyObject *RC, *RTS, *SUCCESS, *WC_OPCODE, *EIGHT_BYTES, *SENDS, *NO_WC_FLAGS,
    *RDMA_READ, *ATOMICS, *py_receive_answer_common;
static long long ACK_LEN_, ACK_OP_, PSN_MASK_, PSN_HALF_, QPN_MASK_, DEFAULT_PKEY_, ECN_,
    PAD_, PAD_SHIFT_, EXT_AETH_, READ_ONLY_OP_, ATOMIC_ACK_OP_, ATOMIC_ACK_LEN_;
static PyObject *s_receive_common, *s_progress, *s_complete, *s_config, *s_check_icrc,
    *s_qp_type, *s_state, *s_sq, *s_cc, *s_selective_repeat, *s_comp,
    *s_req, *s_acked_psn, *s_sacked_psn, *s_rexmitted, *s_rexmit, *s_rd_atomic, *s_psn,
    *s_send_idx, *s_first_psn, *s_last_psn, *s_done, *s_status, *s_signaled, *s_opcode,
    *s_wr_id, *s_length, *s_qpn, *s_attr, *s_retry_cnt, *s_rnr_retry, *s_retry_left,
    *s_rnr_left, *s_rto, *s_rto_at, *s_probe_at, *s_arm, *s_send_cq, *s_popleft,
    *s_rcvd_pkts, *s_rdma_sends, *s_receive_answer_common, *s_views, *s_got, *s_npkts,
    *s_retry_pending;

/* The most WQEs one ACK is taken for here (more: the Python's) */
#define ACK_WQES 64

/* The module's function ``name`` is ``own`` (the Python's, as set up): 1, 0, -1 */
static int own_fn(PyObject *name, PyObject *own)
{
    PyObject *f = PyObject_GetAttr(completer_module, name);
    if (f == NULL)
        return -1;
    int r = f == own;
    Py_DECREF(f);
    return r;
}

/* _common_qp(dev, pkey, w2, aeth, src): an RC QP in RTS with work queued, from its
   peer, P_Key default, FECN and BECN clear, an AETH syndrome of ACK.  A new
   reference, or NULL (no error: not this case). */
static PyObject *common_qp(PyObject *dev, long long pkey, long long w2, long long aeth,
                           PyObject *src)
{
    if (pkey != DEFAULT_PKEY_ || (w2 & ECN_) || (aeth >> 29))
        return NULL;
    PyObject *qp = qp_of(dev, w2 & QPN_MASK_), *t = NULL;
    if (qp == NULL)
        return NULL;
    int ok = (t = GA(qp, s_qp_type)) == NULL ? -1 : t == RC;
    Py_CLEAR(t);
    if (ok == 1) {
        ok = (t = GA(qp, s_state)) == NULL ? -1 : t == RTS;
        Py_CLEAR(t);
    }
    if (ok == 1) {                              /* not qp.sq */
        ok = (t = GA(qp, s_sq)) == NULL ? -1 : PyObject_IsTrue(t);
        Py_CLEAR(t);
    }
    if (ok == 1)
        ok = from_peer(qp, src);
    if (ok != 1)
        Py_CLEAR(qp);
    return qp;
}

/* Is the QP's state one the compiled case covers (no controller, go-back-N,
   nothing SACKed, nothing resent and remembered)?  1, 0, -1 */
static int plain_qp(PyObject *qp, PyObject *comp)
{
    PyObject *t = GA(qp, s_cc);
    int ok = t == NULL ? -1 : t == Py_None;
    Py_XDECREF(t);
    if (ok == 1) {
        ok = get_truth(qp, s_selective_repeat);
        ok = ok < 0 ? -1 : !ok;
    }
    if (ok == 1) {
        ok = (t = GA(comp, s_sacked_psn)) == NULL ? -1 : t == Py_None;
        Py_XDECREF(t);
    }
    if (ok == 1) {
        ok = get_truth(comp, s_rexmitted);
        ok = ok < 0 ? -1 : !ok;
    }
    if (ok == 1) {
        ok = get_truth(comp, s_rexmit);
        ok = ok < 0 ? -1 : !ok;
    }
    return ok;
}

/* A started WQE's first and last PSN, and whether it is done, a READ or ATOMIC,
   given a status or signaled: 1 started, 0 not, -1 */
struct wqe { PyObject *o; long long first, last; int done, rd_atomic, has_status, signaled; };

static int read_wqe(PyObject *o, struct wqe *w)
{
    PyObject *f = GA(o, s_first_psn), *st;
    w->o = o;
    if (f == NULL)
        return -1;
    if (f == Py_None) {
        Py_DECREF(f);
        return 0;
    }
    if (take_ll(f, &w->first) < 0 || get_ll(o, s_last_psn, &w->last) < 0
        || (w->done = get_truth(o, s_done)) < 0 || (w->rd_atomic = get_truth(o, s_rd_atomic)) < 0
        || (w->signaled = get_truth(o, s_signaled)) < 0 || (st = GA(o, s_status)) == NULL)
        return -1;
    w->has_status = st != Py_None;
    Py_DECREF(st);
    return 1;
}

/* WC(w.wr_id, _SUCCESS, _WC_OPCODE[op], qp.qpn, byte_len=8 if op in _EIGHT_BYTES
   else w.length) posted to the send CQ (``complete``'s; the CQ's room checked
   before), and ``dev.counters["rdma_sends"] += 1`` for a SEND */
static int completed(PyObject *dev, PyObject *qp, PyObject *cq, PyObject *entries, PyObject *w)
{
    PyObject *op = GA(w, s_opcode), *args[9] = {0}, *wc = NULL;
    int r = -1;
    if (op == NULL)
        return -1;
    int sig = get_truth(w, s_signaled);
    if (sig < 0)
        goto out;
    if (sig) {
        int eight = PySet_Contains(EIGHT_BYTES, op);
        if (eight < 0)
            goto out;
        args[0] = GA(w, s_wr_id);
        args[1] = Py_NewRef(SUCCESS);
        args[2] = Py_XNewRef(PyDict_GetItemWithError(WC_OPCODE, op));
        if (args[2] == NULL && !PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, op);
        args[3] = GA(qp, s_qpn);
        args[4] = eight ? PyLong_FromLong(8) : GA(w, s_length);
        args[5] = PyLong_FromLong(0);
        args[6] = Py_NewRef(NO_WC_FLAGS);
        args[7] = PyLong_FromLong(0);
        args[8] = PyLong_FromLong(0);
        for (int i = 0; i < 9; i++)
            if (args[i] == NULL)
                goto out;
        if ((wc = sn_new_wc(args)) == NULL || sn_post_cqe_plain(dev, cq, entries, wc, 0) < 0)
            goto out;
    }
    int send = PySet_Contains(SENDS, op);
    if (send < 0 || (send && dev_count(dev, s_rdma_sends, 1) < 0))
        goto out;
    r = 0;
out:
    Py_DECREF(op);
    Py_XDECREF(wc);
    for (int i = 0; i < 9; i++)
        Py_XDECREF(args[i]);
    return r;
}

/* What a compiled receipt takes: a plain ACK (receive_common), a READ RESPONSE ONLY
   or an ATOMIC ACKNOWLEDGE (receive_answer_common) */
enum kind { ACK, READ_ONLY, ATOMIC_ACK };

/* The READ or ATOMIC's one local buffer (``wqe.views``, one view) for ``n`` bytes:
   1 and *view a new reference; 0 another shape (the Python's); -1 */
static int one_view(PyObject *wqe, Py_ssize_t n, PyObject **view)
{
    PyObject *views = GA(wqe, s_views);
    *view = NULL;
    if (views == NULL)
        return -1;
    int r = 0;
    if (PyList_CheckExact(views) && PyList_GET_SIZE(views) == 1) {
        Py_ssize_t len = PyObject_Length(PyList_GET_ITEM(views, 0));
        if (len < 0)
            r = -1;
        else if (len >= n) {
            *view = Py_NewRef(PyList_GET_ITEM(views, 0));
            r = 1;
        }
    }
    Py_DECREF(views);
    return r;
}

/* receive_answer_common's and its handler's conditions for an answer at ``psn`` to
   the oldest WQE ``ws[0]`` (a READ or ATOMIC, started, not done): the next PSN to be
   acknowledged, the WQE's first and below the next PSN to send; a READ of one packet
   whose length is the payload's (``_read_response``: an ONLY's place), or an ATOMIC
   (``_atomic_ack``); given no status yet, nothing held beyond a hole; its one
   buffer in *view.  1, 0 (the Python's), -1 */
static int answered(struct wqe *ws, long long psn, long long before, long long req_psn,
                    int kind, long long plen, PyObject **view)
{
    *view = NULL;
    if (psn != ((before + 1) & PSN_MASK_) || psn != ws[0].first
        || !((psn - req_psn) & PSN_HALF_) || ws[0].has_status)
        return 0;
    PyObject *o = ws[0].o, *op = GA(o, s_opcode), *got = op ? GA(o, s_got) : NULL;
    long long npkts = 0, length = 0;
    int ok = got != NULL && get_ll(o, s_npkts, &npkts) == 0 && get_ll(o, s_length, &length) == 0
        ? 1 : -1;
    if (ok == 1 && got != Py_None) {            /* not wqe.got: none held beyond a hole */
        int t = PyObject_IsTrue(got);
        ok = t < 0 ? -1 : !t;
    }
    if (ok == 1)
        ok = kind == READ_ONLY ? op == RDMA_READ && npkts == 1 && length == plen
            : PySet_Contains(ATOMICS, op);
    Py_XDECREF(op);
    Py_XDECREF(got);
    if (ok == 1)
        ok = one_view(o, kind == READ_ONLY ? plen : 8, view);
    return ok;
}

/* receive_common(dev, data, src, now) of a plain ACK, or receive_answer_common of a
   READ RESPONSE ONLY or an ATOMIC ACKNOWLEDGE (``answer``), its packet checked by
   ``edge`` (the kernel's sn_rx_edge, which the caller found hooked in for dev): 1
   taken, 0 not (nothing changed), -1 error */
static int take(PyObject *dev, PyObject *data, PyObject *src, PyObject *now, int answer,
                rx_edge_fn edge)
{
    PyObject *qp = NULL, *comp = NULL, *req = NULL, *sq = NULL, *cq = NULL, *entries = NULL,
        *attr = NULL, *t = NULL, *view = NULL;
    struct wqe ws[ACK_WQES + 1];
    int nw = 0, r = -1;
    Py_buffer db, vb;
    vb.obj = NULL;
    if (PyObject_GetBuffer(data, &db, PyBUF_SIMPLE) < 0)
        return -1;
    const uint8_t *d = (const uint8_t *)db.buf;
    /* the kind, its length (a READ response's payload: what its pad count leaves) */
    enum kind kind = !answer && d[0] == ACK_OP_ && db.len > 0 ? ACK
        : answer && db.len > 0 && d[0] == READ_ONLY_OP_ ? READ_ONLY
        : answer && db.len > 0 && d[0] == ATOMIC_ACK_OP_ ? ATOMIC_ACK : -1;
    long long plen = kind == READ_ONLY
        ? db.len - ACK_LEN_ - ((d[1] & PAD_) >> PAD_SHIFT_) : 0;
    if ((int)kind < 0 || (kind == ACK && (db.len != ACK_LEN_ || (d[1] & PAD_)))
        || (kind == READ_ONLY && plen < 0)
        || (kind == ATOMIC_ACK && (db.len != ATOMIC_ACK_LEN_ || (d[1] & PAD_)))) {
        r = 0;
        goto out;
    }
    long long w0 = be32(d), w2 = be32(d + 4), w3 = be32(d + 8), aeth = be32(d + 12);
    if ((qp = common_qp(dev, w0 & 0xFFFF, w2, aeth, src)) == NULL) {
        r = PyErr_Occurred() ? -1 : 0;
        goto out;
    }
    int s = own_fn(s_progress, py_progress);
    if (s == 1)
        s = own_fn(s_complete, py_complete);
    if (s == 1)
        s = sn_post_cqe_own(dev);
    if (s == 1) {
        PyObject *config = GA(dev, s_config);
        s = config == NULL ? -1 : get_truth(config, s_check_icrc);
        Py_XDECREF(config);
    }
    if (s == 1 && ((comp = GA(qp, s_comp)) == NULL || (req = GA(qp, s_req)) == NULL
                   || (sq = GA(qp, s_sq)) == NULL))
        goto out;
    if (s == 1)
        s = plain_qp(qp, comp);
    if (s != 1) {
        r = s;
        goto out;
    }
    long long psn = w3 & PSN_MASK_, before, req_psn, req_rd, qpn;
    if (get_ll(comp, s_acked_psn, &before) < 0 || get_ll(req, s_psn, &req_psn) < 0
        || get_ll(req, s_rd_atomic, &req_rd) < 0 || get_ll(qp, s_qpn, &qpn) < 0)
        goto out;
    Py_ssize_t n = PyObject_Length(sq);
    if (n < 0)
        goto out;
    /* the oldest WQE: started, not done, not a READ or ATOMIC (receive_common); a
       READ or ATOMIC for an answer (receive_answer_common) */
    PyObject *o = PySequence_GetItem(sq, 0);
    if (o == NULL)
        goto out;
    s = read_wqe(o, &ws[0]);
    Py_DECREF(o);
    if (s <= 0 || ws[0].done || ws[0].rd_atomic != (kind != ACK)) {
        r = s < 0 ? -1 : 0;
        goto out;
    }
    int k = 0;                                  /* WQEs finished */
    if (kind != ACK) {
        s = answered(ws, psn, before, req_psn, kind, plen, &view);
        if (s != 1) {
            r = s;
            goto out;
        }
        nw = k = 1;
        goto finished;
    }
    /* psn_diff(psn, first_psn) >= 0 and psn_diff(psn, before) > 0; then within the
       oldest WQE, or beyond it with no READ or ATOMIC outstanding and below the next
       PSN to send (receive_common) */
    if (((psn - ws[0].first) & PSN_HALF_) || ((psn - before - 1) & PSN_MASK_) >= PSN_HALF_ - 1) {
        r = 0;
        goto out;
    }
    int beyond = ((psn - ws[0].last - 1) & PSN_MASK_) < PSN_HALF_ - 1;
    if (beyond && (req_rd || !((psn - req_psn) & PSN_HALF_))) {
        r = 0;
        goto out;
    }
    /* the WQEs it finishes (_ack_before, acknowledged): each before the one the PSN is
       in, and that one where the PSN is its last; here each started, not done, not a
       READ or ATOMIC, given no status yet (else the Python's) */
    for (int i = 0;; i++) {
        if (i > 0) {
            if (i >= n || i > ACK_WQES) {
                r = 0;
                goto out;
            }
            o = PySequence_GetItem(sq, i);
            if (o == NULL)
                goto out;
            s = read_wqe(o, &ws[i]);
            Py_DECREF(o);               /* (the deque holds it while the call lasts) */
            if (s <= 0 || ws[i].done || ws[i].rd_atomic) {
                r = s < 0 ? -1 : 0;
                goto out;
            }
        }
        nw = i + 1;
        if (ws[i].has_status) {
            r = 0;
            goto out;
        }
        if (((ws[i].last - psn) & PSN_MASK_) < PSN_HALF_) {     /* psn_diff(last, psn) >= 0 */
            if ((psn - ws[i].first) & PSN_HALF_) {              /* (requester.wqe_index's) */
                r = 0;
                goto out;
            }
            k = psn == ws[i].last ? i + 1 : i;
            break;
        }
    }
finished:
    /* complete() stops at the first WQE not done: none behind them may be done
       (started or not) */
    if (k < n) {
        o = PySequence_GetItem(sq, k);
        if (o == NULL)
            goto out;
        s = get_truth(o, s_done);
        Py_DECREF(o);
        if (s != 0) {
            r = s < 0 ? -1 : 0;
            goto out;
        }
    }
    Py_ssize_t sig = 0;
    for (int i = 0; i < k; i++)
        sig += ws[i].signaled;
    if ((cq = GA(qp, s_send_cq)) == NULL)
        goto out;
    if (sig) {
        s = sn_cq_room(cq, sig, &entries);
        if (s != 1) {
            r = s;
            goto out;
        }
    }
    uint32_t start;
    uint8_t orig[8];
    if (sn_rx_start(dev, src, db.len, w0, qpn, &start) < 0)
        goto out;
    /* the packet's checks and its ICRC; a READ response's payload placed in its
       buffer (scatter), an ATOMIC's original value read */
    uint8_t *dst = orig;
    uint64_t cap = 8;
    if (kind == READ_ONLY) {
        if (PyObject_GetBuffer(view, &vb, PyBUF_WRITABLE) < 0) {
            vb.obj = NULL;
            goto out;
        }
        dst = (uint8_t *)vb.buf;
        cap = (uint64_t)vb.len;
    }
    if (!edge(d, (size_t)db.len, (uint32_t)w0, (uint32_t)qpn, (uint32_t)psn, start,
              (int)EXT_AETH_, dst, 0, kind == ACK ? 0 : kind == READ_ONLY ? plen : 8,
              kind == ACK ? 0 : cap)) {
        r = 0;                                  /* (its ICRC: the Python's to count) */
        goto out;
    }
    if (kind == ATOMIC_ACK) {
        /* _atomic_ack: scatter(wqe, 0, orig.to_bytes(8, sys.byteorder)) */
        uint64_t v = (uint64_t)be32(orig) << 32 | be32(orig + 4);
        if (PyObject_GetBuffer(view, &vb, PyBUF_WRITABLE) < 0) {
            vb.obj = NULL;
            goto out;
        }
        memcpy(vb.buf, &v, 8);                  /* (the host's byte order) */
    }
    /* taken: dev.counters["rcvd_pkts"] += 1; _ack_before and acknowledged, or
       _read_response (the acknowledged PSN, no retry pending) or _atomic_ack */
    if (dev_count(dev, s_rcvd_pkts, 1) < 0)
        goto out;
    if (kind == READ_ONLY && SA(comp, s_retry_pending, Py_None) < 0)
        goto out;
    for (int i = 0; i < k; i++)                 /* _finish(qp, w) */
        if (SA(ws[i].o, s_done, Py_True) < 0 || SA(ws[i].o, s_status, SUCCESS) < 0)
            goto out;
    if (kind != ACK && set_ll(req, s_rd_atomic, req_rd - 1) < 0)    /* (_finish's) */
        goto out;
    /* the acknowledged PSN: the last finished WQE's last PSN, or the PSN inside the
       message it is in; either way the ACK's */
    if (set_ll(comp, s_acked_psn, psn) < 0)
        goto out;
    /* _progress (the acknowledged PSN moved): _forward */
    if ((attr = GA(qp, s_attr)) == NULL || (t = GA(attr, s_retry_cnt)) == NULL
        || SA(comp, s_retry_left, t) < 0)
        goto out;
    Py_CLEAR(t);
    if ((t = GA(attr, s_rnr_retry)) == NULL || SA(comp, s_rnr_left, t) < 0)
        goto out;
    Py_CLEAR(t);
    /* the window may have opened: qp.req.send_idx < len(qp.sq) (nothing resent) */
    long long send_idx;
    if (get_ll(req, s_send_idx, &send_idx) < 0)
        goto out;
    if (send_idx < n && mark_ready(dev, qp) < 0)
        goto out;
    /* the retransmission timer for what is still in flight (_inflight: the WQE the
       PSN is inside, or the next one started) */
    int inflight = k < nw;
    if (!inflight && k < n) {
        struct wqe next;
        o = PySequence_GetItem(sq, k);
        if (o == NULL)
            goto out;
        s = read_wqe(o, &next);
        Py_DECREF(o);
        if (s < 0)
            goto out;
        inflight = s == 1 && !next.done;
    }
    if (inflight) {
        double at, rto;
        if ((at = as_double(now)) == -1.0 && PyErr_Occurred())
            goto out;
        if (take_double(call1(dev, s_rto, qp), &rto) < 0 || set_double(comp, s_rto_at, at + rto) < 0)
            goto out;
    } else if (SA(comp, s_rto_at, Py_None) < 0) {
        goto out;
    }
    if (SA(comp, s_probe_at, Py_None) < 0)      /* (no selective repeat) */
        goto out;
    PyObject *armed = call1(dev, s_arm, qp);
    if (armed == NULL)
        goto out;
    Py_DECREF(armed);
    /* complete: the finished WQEs off the SQ, in order */
    for (int i = 0; i < k; i++) {
        PyObject *w = call0(sq, s_popleft);
        if (w == NULL)
            goto out;
        if (get_ll(req, s_send_idx, &send_idx) < 0
            || (send_idx && set_ll(req, s_send_idx, send_idx - 1) < 0)
            || completed(dev, qp, cq, entries, w) < 0) {
            Py_DECREF(w);
            goto out;
        }
        Py_DECREF(w);
    }
    r = 1;
out:
    if (vb.obj != NULL)
        PyBuffer_Release(&vb);
    PyBuffer_Release(&db);
    Py_XDECREF(view);
    Py_XDECREF(qp);
    Py_XDECREF(comp);
    Py_XDECREF(req);
    Py_XDECREF(sq);
    Py_XDECREF(cq);
    Py_XDECREF(entries);
    Py_XDECREF(attr);
    Py_XDECREF(t);
    return r;
}

/* A Dispatch method of the compiled receipt (``answer``: receive_answer_common's,
   else receive_common's): the compiled one where the module's function ``name`` is
   the Python's own ``own`` and the device's kernel is the one hooked in, else the
   module's (a test's stand-in, a tracer; a device with another kernel or none) */
static PyObject *receipt(PyObject *dev, PyObject *const *args, Py_ssize_t n, int answer)
{
    const char *usage = answer ? "_answer(data, src, now)" : "_ack(data, src, now)";
    if (n != 3) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    if (completer_module == NULL) {
        PyErr_Format(PyExc_RuntimeError, "%s: completer_setup() not called yet", usage);
        return NULL;
    }
    int err;
    void *edge = sn_rx_edge_of(dev, &err);
    PyObject *f = err < 0 ? NULL : PyObject_GetAttr(
        completer_module, answer ? s_receive_answer_common : s_receive_common);
    if (f == NULL)
        return NULL;
    if (f != (answer ? py_receive_answer_common : py_receive_common) || edge == NULL) {
        PyObject *fargs[4] = {dev, args[0], args[1], args[2]};
        PyObject *res = PyObject_Vectorcall(f, fargs, 4, NULL);
        Py_DECREF(f);
        return res;
    }
    Py_DECREF(f);
    int r = take(dev, args[0], args[1], args[2], answer, (rx_edge_fn)edge);
    return r < 0 ? NULL : Py_NewRef(r ? Py_True : Py_False);
}

/* Dispatch._ack(data, src, now): completer.receive_common, compiled (receipt) */
static PyObject *receive_ack(PyObject *dev, PyObject *const *args, Py_ssize_t n)
{
    return receipt(dev, args, n, 0);
}

/* Dispatch._answer(data, src, now): completer.receive_answer_common of a READ
   RESPONSE ONLY or an ATOMIC ACKNOWLEDGE, compiled (receipt) */
static PyObject *receive_answer(PyObject *dev, PyObject *const *args, Py_ssize_t n)
{
    return receipt(dev, args, n, 1);
}

/* receive_ack(dev, data, src, now) and receive_answer(...), for tests: Dispatch._ack's
   and Dispatch._answer's compiled ones */
static PyObject *receive_ack_fn(PyObject *mod, PyObject *const *args, Py_ssize_t n)
{
    if (n != 4) {
        PyErr_SetString(PyExc_TypeError, "receive_ack(dev, data, src, now)");
        return NULL;
    }
    return receipt(args[0], args + 1, 3, 0);
}

static PyObject *receive_answer_fn(PyObject *mod, PyObject *const *args, Py_ssize_t n)
{
    if (n != 4) {
        PyErr_SetString(PyExc_TypeError, "receive_answer(dev, data, src, now)");
        return NULL;
    }
    return receipt(args[0], args + 1, 3, 1);
}

PyMethodDef sn_completer_dev_methods[] = {
    {"_ack", (PyCFunction)(void (*)(void))receive_ack, METH_FASTCALL,
     "Dispatch._ack(data, src, now): completer.receive_common of a plain ACK, compiled"},
    {"_answer", (PyCFunction)(void (*)(void))receive_answer, METH_FASTCALL,
     "Dispatch._answer(data, src, now): completer.receive_answer_common of a READ RESPONSE "
     "ONLY or an ATOMIC ACKNOWLEDGE, compiled"},
    {NULL, NULL, 0, NULL},
};

static int const_of(PyObject *module, const char *name, long long *v)
{
    return take_ll(PyObject_GetAttrString(module, name), v);
}

/* The completer module the compiled ACK reads its names and tables from, and whose
   functions it runs where they are its own (device_methods calls this) */
int sn_completer_setup(PyObject *completer)
{
    Py_XSETREF(completer_module, Py_NewRef(completer));
    Py_XSETREF(py_receive_common, PyObject_GetAttr(completer, s_receive_common));
    Py_XSETREF(py_progress, PyObject_GetAttr(completer, s_progress));
    Py_XSETREF(py_complete, PyObject_GetAttr(completer, s_complete));
    Py_XSETREF(RC, PyObject_GetAttrString(completer, "_RC"));
    Py_XSETREF(RTS, PyObject_GetAttrString(completer, "_RTS"));
    Py_XSETREF(SUCCESS, PyObject_GetAttrString(completer, "_SUCCESS"));
    Py_XSETREF(WC_OPCODE, PyObject_GetAttrString(completer, "_WC_OPCODE"));
    Py_XSETREF(EIGHT_BYTES, PyObject_GetAttrString(completer, "_EIGHT_BYTES"));
    Py_XSETREF(SENDS, PyObject_GetAttrString(completer, "_SENDS"));
    Py_XSETREF(NO_WC_FLAGS, PyObject_GetAttrString(completer, "_NO_WC_FLAGS"));
    Py_XSETREF(py_receive_answer_common, PyObject_GetAttr(completer, s_receive_answer_common));
    Py_XSETREF(RDMA_READ, PyObject_GetAttrString(completer, "_RDMA_READ"));
    Py_XSETREF(ATOMICS, PyObject_GetAttrString(completer, "_ATOMICS"));
    PyObject *resp = PyObject_GetAttrString(completer, "responder");
    int bad = resp == NULL || const_of(resp, "EXT_AETH", &EXT_AETH_) < 0;
    Py_XDECREF(resp);
    if (bad || py_receive_common == NULL || py_progress == NULL || py_complete == NULL
        || RC == NULL || RTS == NULL || SUCCESS == NULL || WC_OPCODE == NULL
        || EIGHT_BYTES == NULL || SENDS == NULL || NO_WC_FLAGS == NULL
        || py_receive_answer_common == NULL || RDMA_READ == NULL || ATOMICS == NULL
        || const_of(completer, "_READ_ONLY_OPCODE", &READ_ONLY_OP_) < 0
        || const_of(completer, "_ATOMIC_ACK_OPCODE", &ATOMIC_ACK_OP_) < 0
        || const_of(completer, "_ATOMIC_ACK_LEN", &ATOMIC_ACK_LEN_) < 0
        || const_of(completer, "BTH_PAD_SHIFT", &PAD_SHIFT_) < 0
        || const_of(completer, "_ACK_LEN", &ACK_LEN_) < 0
        || const_of(completer, "_ACK_OPCODE", &ACK_OP_) < 0
        || const_of(completer, "PSN_MASK", &PSN_MASK_) < 0
        || const_of(completer, "PSN_HALF", &PSN_HALF_) < 0
        || const_of(completer, "QPN_MASK", &QPN_MASK_) < 0
        || const_of(completer, "DEFAULT_PKEY", &DEFAULT_PKEY_) < 0
        || const_of(completer, "_ECN", &ECN_) < 0 || const_of(completer, "_PAD", &PAD_) < 0)
        return -1;
    if (!PyDict_CheckExact(WC_OPCODE) || !PyAnySet_Check(EIGHT_BYTES) || !PyAnySet_Check(SENDS)
        || !PyAnySet_Check(ATOMICS)) {
        PyErr_SetString(PyExc_RuntimeError, "completer.c: _WC_OPCODE must be a dict, "
                        "_EIGHT_BYTES, _SENDS and _ATOMICS sets");
        return -1;
    }
    return 0;
}

PyMethodDef sn_completer_methods[] = {
    {"receive_ack", (PyCFunction)(void (*)(void))receive_ack_fn, METH_FASTCALL,
     "completer.receive_common(dev, data, src, now) of a plain ACK, compiled"},
    {"receive_answer", (PyCFunction)(void (*)(void))receive_answer_fn, METH_FASTCALL,
     "completer.receive_answer_common(dev, data, src, now) of a READ RESPONSE ONLY or an "
     "ATOMIC ACKNOWLEDGE, compiled"},
    {NULL, NULL, 0, NULL},
};

int sn_completer_init(void)
{
    INTERN(s_receive_common, "receive_common"); INTERN(s_progress, "_progress");
    INTERN(s_complete, "complete"); INTERN(s_config, "config");
    INTERN(s_check_icrc, "check_icrc"); INTERN(s_qp_type, "qp_type");
    INTERN(s_state, "state"); INTERN(s_sq, "sq"); INTERN(s_cc, "cc");
    INTERN(s_selective_repeat, "selective_repeat"); INTERN(s_comp, "comp");
    INTERN(s_req, "req"); INTERN(s_acked_psn, "acked_psn"); INTERN(s_sacked_psn, "sacked_psn");
    INTERN(s_rexmitted, "rexmitted"); INTERN(s_rexmit, "rexmit");
    INTERN(s_rd_atomic, "rd_atomic"); INTERN(s_psn, "psn"); INTERN(s_send_idx, "send_idx");
    INTERN(s_first_psn, "first_psn"); INTERN(s_last_psn, "last_psn"); INTERN(s_done, "done");
    INTERN(s_status, "status"); INTERN(s_signaled, "signaled"); INTERN(s_opcode, "opcode");
    INTERN(s_wr_id, "wr_id"); INTERN(s_length, "length"); INTERN(s_qpn, "qpn");
    INTERN(s_attr, "attr"); INTERN(s_retry_cnt, "retry_cnt"); INTERN(s_rnr_retry, "rnr_retry");
    INTERN(s_retry_left, "retry_left"); INTERN(s_rnr_left, "rnr_left"); INTERN(s_rto, "rto");
    INTERN(s_rto_at, "rto_at"); INTERN(s_probe_at, "probe_at"); INTERN(s_arm, "arm");
    INTERN(s_send_cq, "send_cq"); INTERN(s_popleft, "popleft");
    INTERN(s_rcvd_pkts, "rcvd_pkts"); INTERN(s_rdma_sends, "rdma_sends");
    INTERN(s_receive_answer_common, "receive_answer_common"); INTERN(s_views, "views");
    INTERN(s_got, "got"); INTERN(s_npkts, "npkts"); INTERN(s_retry_pending, "retry_pending");
    return 0;
}
