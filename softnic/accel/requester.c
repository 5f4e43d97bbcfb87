/* The requester's paced MIDDLE packets, runs and one-packet requests
   (softnic.core.requester.generate), compiled.

   ``generate``'s chain of checks for the state a controlled RC QP spends most of
   a long message in: the WQE up next has its PSNs and its next packet is a
   MIDDLE.  IDLE, HELD (``held_by_pacer``), then packet by packet WINDOW
   (``_window_room``, go-back-N's), PACER (``_cc_blocked``) and SEND
   (``_send_packet``: the AckReq cadence with ``_cc_wants_ack``, ``_record_sent``,
   the bytes ``_build`` gives a MIDDLE, ``encode_middle`` of ``gather``, and
   ``_cc_sent``), statement for statement over the same objects.  Every other
   case (no controller, selective repeat, XRC, no fast paths, a resend owed, a
   WQE to start, a FIRST or LAST next) is the Python ``generate``'s, called from
   where this stops: its chain starts again at IDLE and takes the steps that going
   on would (IDLE and HELD answer as they did, and HELD stops only where PACER
   would, changing nothing).  The controller (``on_packet_sent``) and the
   device's ``rto`` are called as the Python calls them.

   And the states an uncontrolled RC QP spends its messages in, the ones UCX's
   and MPI's protocols keep it in (``bulk_runs``): IDLE, RESEND (none owed), then
   WQE by WQE START (``_may_start`` and ``start``, the Python's, called, for a
   SEND, a READ, an atomic or a WRITE of one packet; any other WQE starts in the
   Python's walk; a SEND's or a WRITE's of one SGE and no inline data compiled,
   ``plain_start``) and, packet by packet, WINDOW and SEND: a request of one packet
   as ``_send_packet`` sends it (``one_packet``: ``_record_sent``, the bytes
   ``_pack_only`` gives, the ICRC ``_sealed`` appends: a ``Sealed`` packet), or a
   run as ``_bulk_run``
   (``_run_end``, ``_record_sent``, ``_bulk`` and ``middle_run``'s gathered run:
   its MIDDLEs' heads by kernel.c's ``sn_tx_heads``, from a SEND's FIRST on, and
   ``_run_last`` for its LAST), for a device whose driver gathers
   (``Device.tx_gather``) and whose kernel is the one hooked in
   (``kernel_hooks``); any other packet (a WRITE's FIRST, a LAST sent alone, a
   READ re-issued from a later response, a WQE of several views) is the Python
   ``generate``'s, from where this stops.  tests/test_bulk_runs.py checks it
   against the Python, step by step and byte by byte.

   The compiled drain (output.c) calls ``sn_generate`` for ``requester.generate``;
   a ``generate`` put in the module's place (a test's stand-in, a tracer) is
   called instead.  tests/test_timers.py drives this and the Python with the same
   random QP states and compares every packet, call and field. */

#include "objects.h"
#include "bytes.h"

static PyObject *requester_module, *py_generate, *py_may_start, *py_start;
/* ``plain_start``: requester.py's _PLAIN_START, _RTS and _FENCE */
static PyObject *PLAIN_START, *RTS;
static long long FENCE_;
int sn_local_view(PyObject *dev, PyObject *pd, long long lkey, long long addr, long long length,
                  int write, PyObject **view);  /* responder.c: KeyTable.local */
static PyObject *RC, *SENDING;                  /* requester.py's _RC, _SENDING */
static PyObject *MIDDLE_W0;     /* {WR opcode: bth_word0(_MIDDLE[it])}: a MIDDLE's BTH word 0 */
static long long PSN_MASK_, PSN_HALF_, PSN_MODULUS_, BTH_ACKREQ_, QPN_MASK_,
    WIRE_OVERHEAD_;
static Py_ssize_t BTH_LEN_;
static PyObject *s_generate, *s_fast, *s_cc, *s_qp_type, *s_xrc, *s_selective_repeat, *s_comp,
    *s_rnr_wait, *s_state, *s_ccs, *s_pace_at, *s_rate, *s_window, *s_next_tx, *s_req, *s_sq,
    *s_send_idx, *s_error, *s_first_psn, *s_done, *s_rexmit, *s_config, *s_ack_every,
    *s_dest, *s_next_pkt, *s_npkts, *s_opcode, *s_rd_atomic, *s_acked_psn, *s_inflight,
    *s_pkts_since_ackreq, *s_mtu, *s_min_timer, *s_rto, *s_max_sent_psn,
    *s_retransmitted_pkts, *s_attr, *s_dest_qp_num, *s_views, *s_sent, *s_on_packet_sent,
    *kw_sent, *s_may_start, *s_start, *s_tx_icrc_start, *s_kernel, *s_tx_gather,
    *s_tx_starts, *s_status, *s_length, *s_flags, *s_imm, *s_inv_rkey, *s_remote_addr,
    *s_rkey, *s_compare_add, *s_swap, *s_icrc, *s_inline, *s_sges, *s_pd, *s_psn, *s_last_psn;
/* ``bulk_runs``: requester.py's Gather and Run, {WR opcode: bth_word0(_RUN_FIRST[it])},
   _LAST, WCStatus.SUCCESS, W.SEND_WITH_INV */
static PyObject *GATHER, *RUN, *RUN_FIRST_W0, *LAST, *SUCCESS, *SEND_WITH_INV;
/* ``one_packet``: requester.py's _ONLY ({WR opcode: (its RC ONLY opcode, its headers'
   length, a RETH, an AtomicETH, an ImmDt or IETH, a message)}), W.RDMA_READ,
   W.ATOMIC_FETCH_AND_ADD and Sealed */
static PyObject *ONLY, *RDMA_READ, *FETCH_ADD, *SEALED;
static long long SOLICITED_, BTH_SE_, BTH_PAD_SHIFT_, DEFAULT_PKEY_, ICRC_LEN_, HEAD_BYTES_;
/* kernel.c's sn_tx_heads and sn_crc32, from the loaded kernel (``kernel_hooks``) */
typedef uint32_t (*tx_heads_fn)(uint8_t *, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t,
                                uint32_t, const uint8_t *, size_t, uint32_t);
typedef uint32_t (*crc32_fn)(uint32_t, const uint8_t *, size_t);
static tx_heads_fn tx_heads;
static crc32_fn crc32_of;
static PyObject *tx_kernel;     /* the kernel object they are of: a device's ``kernel`` must be it */


/* (d - PSN_MODULUS if d & PSN_HALF else d) of d = (a - b) & PSN_MASK: psn_diff(a, b) */
static inline long long psn_diff(long long a, long long b)
{
    long long d = (a - b) & PSN_MASK_;
    return d & PSN_HALF_ ? d - PSN_MODULUS_ : d;
}

/* _window_room(qp, psn), go-back-N's (this file's QPs): *room = qp.window -
   psn_diff(psn, (qp.comp.acked_psn + 1) & PSN_MASK); 0, -1 error */
static int window_room(PyObject *qp, long long psn, long long *room)
{
    long long acked, window;
    PyObject *comp = GA(qp, s_comp);
    if (comp == NULL)
        return -1;
    int s = get_ll(comp, s_acked_psn, &acked);
    Py_DECREF(comp);
    if (s < 0 || get_ll(qp, s_window, &window) < 0)
        return -1;
    *room = window - psn_diff(psn, (acked + 1) & PSN_MASK_);
    return 0;
}

/* held_by_pacer(qp, now) for a controlled QP of RC (qp.cc is cc, qp.ccs is ccs) */
static int held_by_pacer(PyObject *qp, PyObject *cc, PyObject *ccs, PyObject *now)
{
    PyObject *rate = GA(cc, s_rate);
    if (rate == NULL)
        return -1;
    int none = rate == Py_None;
    Py_DECREF(rate);
    if (none)
        return 0;
    /* if not now < ccs.next_tx or ccs.pace_at != ccs.next_tx: return False */
    PyObject *next_tx = GA(ccs, s_next_tx), *pace_at = next_tx ? GA(ccs, s_pace_at) : NULL;
    int r = pace_at == NULL ? -1 : compare(now, next_tx, Py_LT);
    if (r == 1) {
        r = compare(pace_at, next_tx, Py_NE);
        r = r < 0 ? -1 : !r;
    }
    Py_XDECREF(next_tx);
    Py_XDECREF(pace_at);
    if (r != 1)
        return r;
    PyObject *req = GA(qp, s_req), *sq = req ? GA(qp, s_sq) : NULL, *wqe = NULL;
    long long i;
    r = -1;
    if (sq == NULL || get_ll(req, s_send_idx, &i) < 0)
        goto out;
    Py_ssize_t n = PyObject_Length(sq);
    if (n < 0)
        goto out;
    if (i >= n || (r = get_truth(req, s_error)) != 0) {
        r = i >= n ? 1 : r;                     /* nothing up next, or an error: held */
        goto out;
    }
    if ((wqe = PySequence_GetItem(sq, i)) == NULL)
        goto out;
    PyObject *first = GA(wqe, s_first_psn);     /* wqe.first_psn is not None and not wqe.done */
    if (first == NULL)
        goto out;
    none = first == Py_None;
    Py_DECREF(first);
    r = none ? 0 : !get_truth(wqe, s_done);
    if (!none && PyErr_Occurred())
        r = -1;
out:
    Py_XDECREF(req);
    Py_XDECREF(sq);
    Py_XDECREF(wqe);
    return r;
}

/* _cc_blocked(qp, now, False) */
static int cc_blocked(PyObject *cc, PyObject *ccs, PyObject *now)
{
    PyObject *w = GA(cc, s_window);
    if (w == NULL)
        return -1;
    int r = 0;
    if (w != Py_None) {                         /* ccs.inflight and ccs.inflight >= cc.window */
        PyObject *inflight = GA(ccs, s_inflight);
        r = inflight == NULL ? -1 : PyObject_IsTrue(inflight);
        if (r == 1)
            r = compare(inflight, w, Py_GE);
        Py_XDECREF(inflight);
    }
    Py_DECREF(w);
    if (r != 0)
        return r;
    PyObject *rate = GA(cc, s_rate);
    if (rate == NULL)
        return -1;
    if (rate != Py_None) {                      /* now < ccs.next_tx: ccs.pace_at = ccs.next_tx */
        PyObject *next_tx = GA(ccs, s_next_tx);
        r = next_tx == NULL ? -1 : compare(now, next_tx, Py_LT);
        if (r == 1 && SA(ccs, s_pace_at, next_tx) < 0)
            r = -1;
        Py_XDECREF(next_tx);
    }
    Py_DECREF(rate);
    return r;
}

/* _cc_wants_ack(dev, qp, cc, ack_every) */
static int cc_wants_ack(PyObject *dev, PyObject *qp, PyObject *cc, long long ack_every)
{
    PyObject *w = GA(cc, s_window);
    if (w == NULL)
        return -1;
    int none = w == Py_None;
    Py_DECREF(w);
    if (!none)
        return 1;
    PyObject *rate = GA(cc, s_rate);
    int r = rate == NULL ? -1 : PyObject_IsTrue(rate);
    if (r <= 0) {
        Py_XDECREF(rate);
        return r;
    }
    double rt = as_double(rate), mt;
    Py_DECREF(rate);
    long long mtu;
    if ((rt == -1.0 && PyErr_Occurred()) || get_ll(qp, s_mtu, &mtu) < 0)
        return -1;
    double wait = (double)((mtu + 60) * 8) / rt * (double)ack_every;
    PyObject *config = GA(dev, s_config);
    r = config == NULL ? -1 : get_double(config, s_min_timer, &mt);
    Py_XDECREF(config);
    if (r < 0)
        return -1;
    if (!(wait > mt / 4))
        return 0;
    double rto;
    if (take_double(call1(dev, s_rto, qp), &rto) < 0)
        return -1;
    return wait > rto / 4;
}

/* gather(wqe, off, n) into p (room for n bytes): how many bytes it gave, -1: error */
static Py_ssize_t gather_into(PyObject *wqe, Py_ssize_t off, Py_ssize_t n, char *p)
{
    PyObject *views = GA(wqe, s_views);
    if (views == NULL)
        return -1;
    PyObject *seq = PySequence_Fast(views, "a WQE's views must be a sequence");
    Py_DECREF(views);
    if (seq == NULL)
        return -1;
    Py_ssize_t got = 0, k = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t j = 0; j < k && got < n; j++) {
        Py_buffer b;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, j), &b, PyBUF_SIMPLE) < 0) {
            Py_DECREF(seq);
            return -1;
        }
        if (off >= b.len) {                     /* (one view: its slice is empty) */
            off -= b.len;
        } else {
            Py_ssize_t take = b.len - off < n - got ? b.len - off : n - got;
            memcpy(p + got, (char *)b.buf + off, take);
            got += take;
            off = 0;
        }
        PyBuffer_Release(&b);
    }
    Py_DECREF(seq);
    return got;
}

/* _build(dev, qp, wqe, idx, ackreq) of a MIDDLE: encode_middle(opcode,
   qp.attr.dest_qp_num, psn, ackreq, gather(wqe, idx * mtu, mtu)), its BTH's three
   words as kernel.c's put_middle_bth writes them (word 0, w0, from roce.bth_word0) */
static PyObject *build_middle(PyObject *qp, PyObject *wqe, long long w0, long long idx,
                              long long psn, int ackreq)
{
    long long mtu, dqpn;
    PyObject *attr = GA(qp, s_attr);
    int r = attr == NULL ? -1 : get_ll(attr, s_dest_qp_num, &dqpn);
    Py_XDECREF(attr);
    if (r < 0 || get_ll(qp, s_mtu, &mtu) < 0)
        return NULL;
    PyObject *pkt = PyByteArray_FromStringAndSize(NULL, BTH_LEN_ + mtu);
    if (pkt == NULL)
        return NULL;
    unsigned char *h = (unsigned char *)PyByteArray_AS_STRING(pkt);
    bth_put(h, (uint32_t)w0, (uint32_t)(dqpn & QPN_MASK_),
            (uint32_t)((ackreq ? BTH_ACKREQ_ : 0) | (psn & PSN_MASK_)));
    Py_ssize_t got = gather_into(wqe, idx * mtu, mtu, (char *)h + BTH_LEN_);
    if (got < 0 || (got < mtu && PyByteArray_Resize(pkt, BTH_LEN_ + got) < 0))
        Py_CLEAR(pkt);
    return pkt;
}

/* _cc_sent(qp, psn, nbytes, now, resent) */
static int cc_sent(PyObject *cc, PyObject *ccs, long long psn, long long nbytes, PyObject *now,
                   int resent)
{
    long long size = nbytes + WIRE_OVERHEAD_;
    PyObject *rate = GA(cc, s_rate), *key = NULL, *size_o = NULL, *entry = NULL, *res = NULL;
    int r = rate == NULL ? -1 : PyObject_IsTrue(rate);
    if (r == 1) {                               /* ccs.next_tx = max(next_tx, now) + size*8/rate */
        PyObject *next_tx = GA(ccs, s_next_tx);
        r = next_tx == NULL ? -1 : compare(next_tx, now, Py_GT);
        double t = r < 0 ? 0 : as_double(r ? next_tx : now), rt = as_double(rate);
        Py_XDECREF(next_tx);
        if (r < 0 || PyErr_Occurred() || set_double(ccs, s_next_tx, t + (double)(size * 8) / rt) < 0)
            r = -1;
    }
    Py_XDECREF(rate);
    if (r < 0)
        return -1;
    r = -1;
    PyObject *sent = GA(ccs, s_sent);
    if (sent == NULL || (key = PyLong_FromLongLong(psn)) == NULL
        || (size_o = PyLong_FromLongLong(size)) == NULL)
        goto out;
    PyObject *old = PyDict_CheckExact(sent) ? PyDict_GetItemWithError(sent, key) : NULL;
    if (old == NULL && (PyErr_Occurred() || !PyDict_CheckExact(sent))) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "a controlled QP's sent record must be a dict");
        goto out;
    }
    if (old != NULL && old != Py_None) {        /* ccs.inflight -= old[1]; resent = True */
        PyObject *in = GA(ccs, s_inflight), *was = NULL, *less = NULL;
        if (in != NULL && (was = PySequence_GetItem(old, 1)) != NULL)
            less = PyNumber_Subtract(in, was);
        int s = less == NULL ? -1 : SA(ccs, s_inflight, less);
        Py_XDECREF(in);
        Py_XDECREF(was);
        Py_XDECREF(less);
        if (s < 0)
            goto out;
        resent = 1;
    }
    if ((entry = PyTuple_Pack(3, now, size_o, resent ? Py_True : Py_False)) == NULL
        || PyDict_SetItem(sent, key, entry) < 0 || attr_add(ccs, s_inflight, size) < 0)
        goto out;
    /* cc.on_packet_sent(now=now, nbytes=size, psn=psn, retransmit=resent) */
    PyObject *args[6] = {NULL, cc, now, size_o, key, resent ? Py_True : Py_False};
    res = PyObject_VectorcallMethod(s_on_packet_sent, args + 1,
                                    1 | PY_VECTORCALL_ARGUMENTS_OFFSET, kw_sent);
    r = res == NULL ? -1 : 0;
out:
    Py_XDECREF(sent);
    Py_XDECREF(key);
    Py_XDECREF(size_o);
    Py_XDECREF(entry);
    Py_XDECREF(res);
    return r;
}

/* One MIDDLE, if it is what comes next and the window and pacer let it go:
   1 sent, 0 the chain ends here (WINDOW or PACER), 2 not a MIDDLE's case (the
   Python's to go on), -1 error. */
static int one_middle(PyObject *dev, PyObject *qp, PyObject *cc, PyObject *ccs, PyObject *now,
                      PyObject *out, PyObject *dest, long long ack_every)
{
    PyObject *req = GA(qp, s_req), *sq = req ? GA(qp, s_sq) : NULL, *wqe = NULL, *op = NULL,
        *pkt = NULL, *item = NULL;
    long long i, first, nxt, npkts, w0, n, max_sent;
    int r = -1;
    if (sq == NULL || get_ll(req, s_send_idx, &i) < 0)
        goto out;
    Py_ssize_t nsq = PyObject_Length(sq);
    int error = nsq < 0 ? -1 : i < nsq ? get_truth(req, s_error) : 0;
    if (error < 0)
        goto out;
    if (i >= nsq || error) {                    /* the send queue's walk ends */
        r = 0;
        goto out;
    }
    if ((wqe = PySequence_GetItem(sq, i)) == NULL || (op = GA(wqe, s_first_psn)) == NULL)
        goto out;
    int not_mine = op == Py_None;               /* START is the Python's */
    Py_CLEAR(op);
    if (!not_mine && (not_mine = get_truth(wqe, s_done)) == 0)
        not_mine = get_truth(wqe, s_rd_atomic);
    if (not_mine) {
        r = not_mine < 0 ? -1 : 2;
        goto out;
    }
    if (get_ll(wqe, s_first_psn, &first) < 0 || get_ll(wqe, s_next_pkt, &nxt) < 0
        || get_ll(wqe, s_npkts, &npkts) < 0 || (op = GA(wqe, s_opcode)) == NULL)
        goto out;
    PyObject *mid = PyDict_GetItemWithError(MIDDLE_W0, op);   /* wqe.opcode in _MIDDLE */
    if (mid == NULL || !(0 < nxt && nxt < npkts - 1)) {
        r = PyErr_Occurred() ? -1 : 2;          /* a FIRST, a LAST, or no MIDDLE to it */
        goto out;
    }
    if ((w0 = PyLong_AsLongLong(mid)) == -1 && PyErr_Occurred())
        goto out;
    long long psn = (first + nxt) & PSN_MASK_;
    /* WINDOW: _window_room(qp, psn) <= 0 */
    long long room;
    if (window_room(qp, psn, &room) < 0)
        goto out;
    if (room <= 0) {
        r = 0;
        goto out;
    }
    int b = cc_blocked(cc, ccs, now);           /* PACER */
    if (b != 0) {
        r = b < 0 ? -1 : 0;
        goto out;
    }
    /* SEND: _send_packet.  The AckReq cadence (a MIDDLE is neither a LAST nor a
       READ or atomic: the count goes on unless this one asks) */
    if (get_ll(req, s_pkts_since_ackreq, &n) < 0)
        goto out;
    n += 1;
    int ackreq = n >= ack_every;
    if (!ackreq && (ackreq = cc_wants_ack(dev, qp, cc, ack_every)) < 0)
        goto out;
    if (set_ll(req, s_pkts_since_ackreq, ackreq ? 0 : n) < 0)
        goto out;
    /* _record_sent(dev, qp, psn, 1) */
    if (get_ll(req, s_max_sent_psn, &max_sent) < 0)
        goto out;
    long long ahead = psn_diff(max_sent, psn) + 1;
    if (ahead > 0) {                            /* dev.counters["retransmitted_pkts"] += 1 */
        int s = dev_count(dev, s_retransmitted_pkts, 1);
        if (s < 0)
            goto out;
    } else if (set_ll(req, s_max_sent_psn, psn) < 0) {
        goto out;
    }
    if ((pkt = build_middle(qp, wqe, w0, nxt, psn, ackreq)) == NULL
        || cc_sent(cc, ccs, psn, PyByteArray_GET_SIZE(pkt) + 4, now, ahead > 0) < 0)
        goto out;
    if (dest == Py_None) {
        PyObject *d = GA(wqe, s_dest);
        if (d == NULL)
            goto out;
        item = PyTuple_Pack(2, pkt, d);
        Py_DECREF(d);
    } else {
        item = PyTuple_Pack(2, pkt, dest);
    }
    if (item == NULL || PyList_Append(out, item) < 0 || set_ll(wqe, s_next_pkt, nxt + 1) < 0)
        goto out;
    r = 1;                                      /* (nxt + 1 < npkts: the WQE goes on) */
out:
    Py_XDECREF(req);
    Py_XDECREF(sq);
    Py_XDECREF(wqe);
    Py_XDECREF(op);
    Py_XDECREF(pkt);
    Py_XDECREF(item);
    return r;
}

/* ack_every = dev.config.ack_every or qp.window // 4 or 1 */
static int get_ack_every(PyObject *dev, PyObject *qp, long long *ack_every)
{
    PyObject *config = GA(dev, s_config), *t = config ? GA(config, s_ack_every) : NULL;
    Py_XDECREF(config);
    if (t == NULL)
        return -1;
    int s = PyObject_IsTrue(t);
    if (s < 0 || (s && take_ll(Py_NewRef(t), ack_every) < 0)) {
        Py_DECREF(t);
        return -1;
    }
    Py_DECREF(t);
    if (!s) {
        long long w;
        if (get_ll(qp, s_window, &w) < 0)
            return -1;
        *ack_every = w >= 0 ? w / 4 : -((-w + 3) / 4);
        if (!*ack_every)
            *ack_every = 1;
    }
    return 0;
}

/* generate's chain where it is this file's: 0 it ended here, 1 the Python's to go
   on from here, -1 error */
static int paced_middles(PyObject *dev, PyObject *qp, PyObject *now, PyObject *out)
{
    PyObject *cc = GA(qp, s_cc), *ccs = NULL, *t = NULL, *comp = NULL, *dest = NULL;
    int r = -1, s;
    long long ack_every;
    if (cc == NULL)
        return -1;
    if (cc == Py_None || !PyFloat_CheckExact(now) || !PyList_CheckExact(out)) {
        r = 1;
        goto out;
    }
    if ((t = GA(qp, s_qp_type)) == NULL)
        goto out;
    int mine = t == RC;
    Py_CLEAR(t);
    if (mine) {                                 /* no XRC, go-back-N, the fast paths */
        mine = (t = GA(qp, s_xrc)) == NULL ? -1 : t == Py_None;
        Py_CLEAR(t);
    }
    if (mine == 1)
        mine = (s = get_truth(qp, s_selective_repeat)) < 0 ? -1 : !s;
    if (mine == 1)
        mine = get_truth(dev, s_fast);
    if (mine <= 0) {
        r = mine < 0 ? -1 : 1;
        goto out;
    }
    /* IDLE: comp.rnr_wait or qp.state not in _SENDING */
    if ((comp = GA(qp, s_comp)) == NULL || (s = get_truth(comp, s_rnr_wait)) < 0)
        goto out;
    if (!s) {
        PyObject *st = GA(qp, s_state);
        s = st == NULL ? -1 : PySequence_Contains(SENDING, st);
        Py_XDECREF(st);
        if (s < 0)
            goto out;
        s = !s;
    }
    if (s) {
        r = 0;
        goto out;
    }
    /* HELD: qp.ccs.pace_at is not None and held_by_pacer(qp, now) */
    if ((ccs = GA(qp, s_ccs)) == NULL || (t = GA(ccs, s_pace_at)) == NULL)
        goto out;
    s = t != Py_None ? held_by_pacer(qp, cc, ccs, now) : 0;
    Py_CLEAR(t);
    if (s != 0) {
        r = s < 0 ? -1 : 0;
        goto out;
    }
    /* RESEND is the Python's */
    if ((s = get_truth(comp, s_rexmit)) != 0) {
        r = s < 0 ? -1 : 1;
        goto out;
    }
    if (get_ack_every(dev, qp, &ack_every) < 0 || (dest = GA(qp, s_dest)) == NULL)
        goto out;
    while ((s = one_middle(dev, qp, cc, ccs, now, out, dest, ack_every)) == 1)
        ;
    r = s < 0 ? -1 : s == 0 ? 0 : 1;
out:
    Py_DECREF(cc);
    Py_XDECREF(ccs);
    Py_XDECREF(t);
    Py_XDECREF(comp);
    Py_XDECREF(dest);
    return r;
}

/* ------------------------------------------------- an uncontrolled QP's runs */

/* requester.name(args...) */
#define call_py(name, args, n) call_fn(requester_module, (name), (args), (n))

/* tx_icrc_start(dev, dest, size, op, flags, dqpn): looked up in dev.tx_starts by its
   key, the Python's asked (and the memo kept by it) where it is not there */
static int tx_start(PyObject *dev, PyObject *dest, long long size, long long op,
                    long long flags, long long dqpn, uint32_t *out)
{
    const long long k[4] = {size, op, flags, dqpn};
    return icrc_start_memo(dev, s_tx_starts, requester_module, s_tx_icrc_start, dest, k, 4, out);
}

/* _record_sent(dev, qp, psn, k) */
static int record_sent(PyObject *dev, PyObject *req, long long psn, long long k)
{
    long long max_sent;
    if (get_ll(req, s_max_sent_psn, &max_sent) < 0)
        return -1;
    long long ahead = psn_diff(max_sent, psn) + 1;      /* how many were sent before */
    if (ahead > 0) {                    /* dev.counters["retransmitted_pkts"] += min(ahead, k) */
        int s = dev_count(dev, s_retransmitted_pkts, ahead < k ? ahead : k);
        if (s < 0)
            return -1;
    }
    return ahead < k ? set_ll(req, s_max_sent_psn, (psn + k - 1) & PSN_MASK_) : 0;
}

/* Run(buf, dest, seg, count) (a NamedTuple: a tuple of its type): a new reference */
static PyObject *new_run(PyObject *buf, PyObject *dest, long long seg, long long count)
{
    PyObject *run = ((PyTypeObject *)RUN)->tp_alloc((PyTypeObject *)RUN, 4);
    PyObject *seg_o = run ? PyLong_FromLongLong(seg) : NULL,
        *k_o = seg_o ? PyLong_FromLongLong(count) : NULL;
    if (k_o == NULL) {
        Py_XDECREF(seg_o);
        Py_XDECREF(run);
        return NULL;
    }
    PyTuple_SET_ITEM(run, 0, Py_NewRef(buf));
    PyTuple_SET_ITEM(run, 1, Py_NewRef(dest));
    PyTuple_SET_ITEM(run, 2, seg_o);
    PyTuple_SET_ITEM(run, 3, k_o);
    return run;
}

/* What ``_bulk_run`` of a WQE with its PSNs (one view) needs to know before it
   changes anything */
struct run_plan {
    long long nxt, npkts, first, psn, k, nmid, mtu, dqpn, n_last, lop, tail, w0_mid, w0_first;
    int has_last, lead;
};

/* _bulk_run(dev, qp, wqe, psn, dest, ack_every, out) where its run is gathered
   (middle_run's kernel and tx_gather case): 1 the run is out, 0 not this file's
   run (the Python's _bulk_run or _send_packet to take the packet: nothing was
   changed), -1 error */
static int bulk_run(PyObject *dev, PyObject *qp, PyObject *req, PyObject *wqe,
                    struct run_plan *r, PyObject *dest, long long ack_every, PyObject *out,
                    long long window_room)
{
    PyObject *views = GA(wqe, s_views), *one = NULL, *heads = NULL, *src = NULL,
        *last = NULL, *gather = NULL, *run = NULL;
    long long length, flags, end, s;
    int res = -1;
    Py_buffer b;
    b.obj = NULL;
    if (views == NULL)
        return -1;
    if (!PyList_CheckExact(views) || PyList_GET_SIZE(views) != 1) {
        res = 0;                        /* several views: gather() each MTU, the Python's */
        goto out;
    }
    one = Py_NewRef(PyList_GET_ITEM(views, 0));
    if (get_ll(wqe, s_length, &length) < 0)
        goto out;
    /* _run_end: after the LAST unless its ImmDt or IETH leaves it no room in an MTU */
    r->n_last = length - (r->npkts - 1) * r->mtu;
    end = r->npkts;
    if (r->tail && r->n_last + (-r->n_last & 3) + r->tail > r->mtu)
        end = r->npkts - 1;
    r->k = end - r->nxt < window_room ? end - r->nxt : window_room;
    r->has_last = r->nxt + r->k - 1 == r->npkts - 1;
    r->nmid = r->k - r->has_last;
    r->lead = r->nxt == 0;                      /* from a SEND's FIRST */
    if (r->k <= 0 || r->nmid <= 0) {
        res = 0;                        /* a LAST alone: _send_packet; or middle_run's copy */
        goto out;
    }
    if (PyObject_GetBuffer(one, &b, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();                  /* (a view the kernel cannot read: the Python's) */
        b.obj = NULL;
        res = 0;
        goto out;
    }
    long long off = r->nxt * r->mtu, off_last = off + r->nmid * r->mtu;
    if (off_last > b.len || (r->has_last && off_last + r->n_last > b.len)) {
        res = 0;                        /* (middle_run's part(), gather()'s short slice) */
        goto out;
    }
    uint32_t start_mid, start_first = 0, start_last = 0;
    long long seg = BTH_LEN_ + r->mtu + ICRC_LEN_, lflags = 0, pad = -r->n_last & 3;
    if (r->has_last) {
        if (get_ll(wqe, s_flags, &flags) < 0)
            goto out;
        lflags = (flags & SOLICITED_ ? BTH_SE_ : 0) | pad << BTH_PAD_SHIFT_;
    }
    if (tx_start(dev, dest, seg, r->w0_mid >> 24, 0, r->dqpn, &start_mid) < 0
        || (r->lead && tx_start(dev, dest, seg, r->w0_first >> 24, 0, r->dqpn, &start_first) < 0)
        || (r->has_last && tx_start(dev, dest, BTH_LEN_ + r->tail + r->n_last + pad + ICRC_LEN_, r->lop,
                                    lflags, r->dqpn, &start_last) < 0))
        goto out;
    long long tail_value = 0;
    if (r->has_last && r->tail) {       /* the LAST's ImmDt, or its IETH */
        PyObject *op = GA(wqe, s_opcode);
        if (op == NULL)
            goto out;
        int inv = op == SEND_WITH_INV;
        Py_DECREF(op);
        if (get_ll(wqe, inv ? s_inv_rkey : s_imm, &tail_value) < 0)
            goto out;
    }
    /* all known: from here on the run is sent (_bulk_run's changes, in its order) */
    if (record_sent(dev, req, r->psn, r->k) < 0 || get_ll(req, s_pkts_since_ackreq, &s) < 0)
        goto out;
    if ((heads = PyByteArray_FromStringAndSize(NULL, HEAD_BYTES_ * r->nmid)) == NULL)
        goto out;
    uint8_t *h = (uint8_t *)PyByteArray_AS_STRING(heads);
    const uint8_t *p = (const uint8_t *)b.buf + off;
    if (r->lead)
        s = tx_heads(h, 1, (uint32_t)r->w0_first, (uint32_t)r->dqpn, (uint32_t)r->psn,
                     (uint32_t)s, (uint32_t)ack_every, p, (size_t)r->mtu, start_first);
    s = tx_heads(h + HEAD_BYTES_ * r->lead, (uint32_t)(r->nmid - r->lead), (uint32_t)r->w0_mid,
                 (uint32_t)r->dqpn, (uint32_t)((r->psn + r->lead) & PSN_MASK_), (uint32_t)s,
                 (uint32_t)ack_every, p + r->mtu * r->lead, (size_t)r->mtu, start_mid);
    if ((src = PySequence_GetSlice(one, off, off_last)) == NULL)
        goto out;
    if (r->has_last) {                  /* _run_last: a LAST asks for an ACK */
        s = 0;
        long long n = BTH_LEN_ + r->tail + r->n_last + pad;
        if ((last = PyByteArray_FromStringAndSize(NULL, n + ICRC_LEN_)) == NULL)
            goto out;
        uint8_t *q = (uint8_t *)PyByteArray_AS_STRING(last);
        bth_put(q, bth_word0((uint32_t)r->lop, (uint32_t)lflags, (uint32_t)DEFAULT_PKEY_),
                (uint32_t)r->dqpn, (uint32_t)(BTH_ACKREQ_ | ((r->psn + r->nmid) & PSN_MASK_)));
        if (r->tail)
            put_be32(q + BTH_LEN_, (uint32_t)tail_value);
        memcpy(q + BTH_LEN_ + r->tail, (const uint8_t *)b.buf + off_last, r->n_last);
        memset(q + n - pad, 0, pad);
        put_le32(q + n, crc32_of(start_last, q + 8, n - 8));
    }
    PyObject *gargs[5] = {heads, src, NULL, NULL, last ? last : Py_None};
    if ((gargs[2] = PyLong_FromLongLong(r->mtu)) == NULL
        || (gargs[3] = PyLong_FromLongLong(r->nmid)) == NULL) {
        Py_XDECREF(gargs[2]);
        goto out;
    }
    gather = PyObject_Vectorcall(GATHER, gargs, 5, NULL);
    Py_DECREF(gargs[2]);
    Py_DECREF(gargs[3]);
    if (gather == NULL || set_ll(req, s_pkts_since_ackreq, s) < 0)
        goto out;
    if ((run = new_run(gather, dest, seg, r->k)) == NULL || PyList_Append(out, run) < 0
        || set_ll(wqe, s_next_pkt, r->nxt + r->k) < 0)
        goto out;
    if (r->nxt + r->k >= r->npkts && attr_add(req, s_send_idx, 1) < 0)
        goto out;
    res = 1;
out:
    if (b.obj != NULL)
        PyBuffer_Release(&b);
    Py_DECREF(views);
    Py_XDECREF(one);
    Py_XDECREF(heads);
    Py_XDECREF(src);
    Py_XDECREF(last);
    Py_XDECREF(gather);
    Py_XDECREF(run);
    return res;
}

/* int(v) for a header field of ``bits`` bits (32 or 64), v taken: 1 it is one, 0 it is
   not (not an int, or out of range: _pack_only's struct raises for it, so the packet is
   left to the Python's, the error cleared), -1 error (NULL: the attribute's) */
static int take_field(PyObject *v, int bits, unsigned long long *out)
{
    if (v == NULL)
        return -1;
    int ok = PyLong_Check(v);
    unsigned long long x = ok ? PyLong_AsUnsignedLongLong(v) : 0;
    Py_DECREF(v);
    if (!ok || (x == (unsigned long long)-1 && PyErr_Occurred()) || (bits < 64 && x >> bits)) {
        PyErr_Clear();
        return 0;
    }
    *out = x;
    return 1;
}

#define get_field(o, name, bits, out) take_field(GA(o, name), (bits), (out))

/* _send_packet(dev, qp, wqe, psn, ...) of an uncontrolled RC QP's request of one packet
   (``_build``'s first case: a WQE of one packet whose opcode is _ONLY's, or a READ's
   request for all its responses), its bytes as ``_pack_only`` packs them and its ICRC
   as ``_sealed`` appends it; ``op`` is wqe.opcode, ``r`` has its PSN, next packet (0)
   and packets.  It goes out as a ``Sealed`` packet (which ``_sealed`` passes on as a
   packet it sealed: the driver sees the same ``(bytes, dest)``).  1 sent,
   0 the Python's (nothing changed: a device without ICRCs, a field _pack_only's struct
   refuses, a payload not in one view of its length), -1 error */
static int one_packet(PyObject *dev, PyObject *req, PyObject *wqe, PyObject *op,
                      struct run_plan *r, PyObject *dest, PyObject *out)
{
    PyObject *spec = PyDict_GetItemWithError(ONLY, op);             /* borrowed */
    if (spec == NULL)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *config = GA(dev, s_config), *views = NULL, *buf = NULL, *run = NULL;
    int s = config == NULL ? -1 : get_truth(config, s_icrc);        /* (else zeros: _sealed's) */
    Py_XDECREF(config);
    if (s <= 0)
        return s;
    long long opcode = PyLong_AsLongLong(PyTuple_GET_ITEM(spec, 0)),
        hdr = PyLong_AsLongLong(PyTuple_GET_ITEM(spec, 1)), flags = 0;
    int reth = PyObject_IsTrue(PyTuple_GET_ITEM(spec, 2)),
        atomiceth = PyObject_IsTrue(PyTuple_GET_ITEM(spec, 3)),
        tail = PyObject_IsTrue(PyTuple_GET_ITEM(spec, 4)),
        message = PyObject_IsTrue(PyTuple_GET_ITEM(spec, 5));
    if (PyErr_Occurred())
        return -1;
    unsigned long long length = 0, addr = 0, rkey = 0, a1 = 0, a2 = 0, tv = 0;
    if ((s = get_field(wqe, s_length, 32, &length)) <= 0)
        return s;
    if ((reth || atomiceth)
        && ((s = get_field(wqe, s_remote_addr, 64, &addr)) <= 0
            || (s = get_field(wqe, s_rkey, 32, &rkey)) <= 0))
        return s;
    if (atomiceth) {        /* FETCH_ADD: (compare_add, 0); CMP_AND_SWP: (swap, compare_add) */
        int add = op == FETCH_ADD;
        if ((s = get_field(wqe, add ? s_compare_add : s_swap, 64, &a1)) <= 0
            || (!add && (s = get_field(wqe, s_compare_add, 64, &a2)) <= 0))
            return s;
    }
    if (tail && (s = get_field(wqe, op == SEND_WITH_INV ? s_inv_rkey : s_imm, 32, &tv)) <= 0)
        return s;
    long long n = message ? (long long)length : 0, pad = -n & 3, size = hdr + n + pad;
    if (message && get_ll(wqe, s_flags, &flags) < 0)
        return -1;
    long long bflags = (message && flags & SOLICITED_ ? BTH_SE_ : 0) | pad << BTH_PAD_SHIFT_;
    Py_buffer b;
    b.obj = NULL;
    s = -1;
    if (n) {                            /* views[0], of the payload's length */
        if ((views = GA(wqe, s_views)) == NULL)
            goto out;
        if (!PyList_CheckExact(views) || PyList_GET_SIZE(views) != 1
            || PyObject_GetBuffer(PyList_GET_ITEM(views, 0), &b, PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            b.obj = NULL;
            s = 0;                      /* (gather()'s, or a view the kernel cannot read) */
            goto out;
        }
        if (b.len != n) {
            s = 0;
            goto out;
        }
    }
    uint32_t start;
    if (tx_start(dev, dest, size + ICRC_LEN_, opcode, bflags, r->dqpn, &start) < 0)
        goto out;
    /* all known: from here on it is sent (_send_packet's changes, in its order: the
       AckReq count restarts after a packet that asks, as this one does) */
    if (set_ll(req, s_pkts_since_ackreq, 0) < 0 || record_sent(dev, req, r->psn, 1) < 0
        || (buf = PyByteArray_FromStringAndSize(NULL, size + ICRC_LEN_)) == NULL)
        goto out;
    uint8_t *q = (uint8_t *)PyByteArray_AS_STRING(buf);
    memset(q, 0, hdr);
    bth_put(q, bth_word0((uint32_t)opcode, (uint32_t)bflags, (uint32_t)DEFAULT_PKEY_),
            (uint32_t)r->dqpn, (uint32_t)(BTH_ACKREQ_ | r->psn));
    uint8_t *h = q + BTH_LEN_;
    if (reth || atomiceth) {    /* a RETH: VA, R_Key, length; an AtomicETH: VA, R_Key, two */
        put_be64(h, addr);
        put_be32(h + 8, (uint32_t)rkey);
        if (reth)
            put_be32(h + 12, (uint32_t)length);
        else {
            put_be64(h + 12, a1);
            put_be64(h + 20, a2);
        }
    }
    if (tail)                           /* the ImmDt or IETH, the headers' last word */
        put_be32(q + hdr - 4, (uint32_t)tv);
    if (n)
        memcpy(q + hdr, b.buf, n);
    memset(q + hdr + n, 0, pad);
    put_le32(q + size, crc32_of(start, q + 8, size - 8));
    if ((run = ((PyTypeObject *)SEALED)->tp_alloc((PyTypeObject *)SEALED, 2)) == NULL)
        goto out;
    PyTuple_SET_ITEM(run, 0, Py_NewRef(buf));           /* Sealed(buf, dest) */
    PyTuple_SET_ITEM(run, 1, Py_NewRef(dest));
    if (PyList_Append(out, run) < 0 || set_ll(wqe, s_next_pkt, r->npkts) < 0
        || attr_add(req, s_send_idx, 1) < 0)
        goto out;
    s = 1;
out:
    if (b.obj != NULL)
        PyBuffer_Release(&b);
    Py_XDECREF(views);
    Py_XDECREF(buf);
    Py_XDECREF(run);
    return s;
}

/* START's case of a SEND or an RDMA WRITE (``_PLAIN_START``) of one SGE and no inline
   data, where the module's ``_may_start`` and ``start`` are the Python's own:
   ``_may_start(qp, wqe, True)`` (RTS; not fenced while READs or ATOMICs are
   outstanding; room in the window for ``req.psn``: go-back-N's, as this file's
   QPs have), then ``start``'s steps for it: the SGE's view as ``KeyTable.local``
   gives it (read only: ``sn_local_view``), its packets and PSNs.  1 started, 0 it
   may not start, 2 not this case, nothing changed (the Python's: a key refused
   is ``start``'s to fail), -1 error */
static int plain_start(PyObject *dev, PyObject *qp, PyObject *req, PyObject *wqe)
{
    PyObject *f = PyObject_GetAttr(requester_module, s_may_start),
        *g = f ? PyObject_GetAttr(requester_module, s_start) : NULL;
    int own = g == NULL ? -1 : f == py_may_start && g == py_start;
    Py_XDECREF(f);
    Py_XDECREF(g);
    if (own <= 0)
        return own < 0 ? -1 : 2;
    PyObject *op = GA(wqe, s_opcode), *sges = NULL, *t = NULL, *pd = NULL, *view = NULL;
    int r = -1, s;
    long long addr, length, lkey, flags, rd, psn, wlen, mtu;
    if (op == NULL)
        return -1;
    s = PySet_Contains(PLAIN_START, op);
    Py_DECREF(op);
    if (s <= 0)
        return s < 0 ? -1 : 2;
    if ((t = GA(wqe, s_inline)) == NULL)
        return -1;
    s = t == Py_None;
    Py_CLEAR(t);
    if (!s || (sges = GA(wqe, s_sges)) == NULL)
        return s ? -1 : 2;
    if ((s = one_sge(sges, &addr, &length, &lkey)) != 1) {
        r = s < 0 ? -1 : 2;
        goto out;
    }
    /* _may_start: if qp.state is not _RTS: False */
    if ((t = GA(qp, s_state)) == NULL)
        goto out;
    s = t == RTS;
    Py_CLEAR(t);
    if (!s) {
        r = 0;
        goto out;
    }
    /* if wqe.flags & _FENCE and req.rd_atomic: False (no READ credit: not one of those) */
    if (get_ll(wqe, s_flags, &flags) < 0 || get_ll(req, s_rd_atomic, &rd) < 0)
        goto out;
    if (flags & FENCE_ && rd) {
        r = 0;
        goto out;
    }
    /* return _window_room(qp, req.psn) > 0 */
    long long room;
    if (get_ll(req, s_psn, &psn) < 0 || window_room(qp, psn, &room) < 0)
        goto out;
    if (room <= 0) {
        r = 0;
        goto out;
    }
    /* start: wqe.views = [dev.keys.local(qp.pd, lkey, addr, length, write=wqe.rd_atomic)] */
    if ((pd = GA(qp, s_pd)) == NULL)
        goto out;
    if ((s = sn_local_view(dev, pd, lkey, addr, length, 0, &view)) != 1) {
        r = s < 0 ? -1 : 2;
        goto out;
    }
    PyObject *views = PyList_New(1);
    if (views == NULL)
        goto out;
    PyList_SET_ITEM(views, 0, view);
    view = NULL;
    s = SA(wqe, s_views, views);
    Py_DECREF(views);
    /* npkts = -(-wqe.length // qp.mtu) or 1; its PSNs from req.psn */
    if (s < 0 || get_ll(wqe, s_length, &wlen) < 0 || get_ll(qp, s_mtu, &mtu) < 0)
        goto out;
    long long npkts = mtu > 0 ? (wlen + mtu - 1) / mtu : 0;
    if (npkts < 1)
        npkts = 1;
    if (set_ll(wqe, s_npkts, npkts) < 0 || set_ll(wqe, s_first_psn, psn) < 0
        || set_ll(wqe, s_last_psn, (psn + npkts - 1) & PSN_MASK_) < 0
        || set_ll(req, s_psn, (psn + npkts) & PSN_MASK_) < 0 || set_ll(wqe, s_next_pkt, 0) < 0)
        goto out;
    r = 1;
out:
    Py_XDECREF(sges);
    Py_XDECREF(pd);
    Py_XDECREF(view);
    return r;
}

/* START: _may_start(qp, wqe, True), then start(dev, qp, wqe) (``plain_start``'s case
   compiled); 1 started (or done at once: *done), 0 it may not start (generate's walk
   ends), -1 error */
static int start_wqe(PyObject *dev, PyObject *qp, PyObject *req, PyObject *wqe, int *done)
{
    int p = plain_start(dev, qp, req, wqe);
    if (p != 2) {
        *done = 0;
        return p;
    }
    PyObject *args[3] = {qp, wqe, Py_True};
    int may = take_truth(call_py(s_may_start, args, 3));
    if (may <= 0)
        return may;
    PyObject *sargs[3] = {dev, qp, wqe};
    PyObject *r = call_py(s_start, sargs, 3);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    if ((*done = get_truth(wqe, s_done)) <= 0)
        return *done < 0 ? -1 : 1;
    /* a local operation or a local error: if wqe.status is not None and != SUCCESS:
       req.error = True; then req.send_idx += 1 */
    PyObject *st = GA(wqe, s_status);
    if (st == NULL)
        return -1;
    int failed = st == Py_None ? 0 : PyObject_RichCompareBool(st, SUCCESS, Py_NE);
    Py_DECREF(st);
    if (failed < 0 || (failed && SA(req, s_error, Py_True) < 0))
        return -1;
    return attr_add(req, s_send_idx, 1) < 0 ? -1 : 1;
}

/* Is START of this WQE (neither started nor done) the Python walk's: anything but a
   SEND (whose run from its FIRST on, or whose one packet, is this file's) or another
   request that leaves as one packet packed straight (``one_packet``'s: a READ's, an
   atomic's, a WRITE's of an MTU at most)?  1 yes, 0 no, -1 error */
static int start_is_pythons(PyObject *wqe, long long mtu)
{
    long long length;
    PyObject *op = GA(wqe, s_opcode);
    if (op == NULL)
        return -1;
    int send = PyDict_GetItemWithError(RUN_FIRST_W0, op) != NULL;
    PyObject *spec = send || PyErr_Occurred() ? NULL : PyDict_GetItemWithError(ONLY, op);
    Py_DECREF(op);
    if (PyErr_Occurred())
        return -1;
    if (send)
        return 0;
    if (spec == NULL)
        return 1;
    int message = PyObject_IsTrue(PyTuple_GET_ITEM(spec, 5));       /* a WRITE's */
    if (message <= 0)
        return message;
    return get_ll(wqe, s_length, &length) < 0 ? -1 : length > mtu;
}

/* Is the WQE up next one that START would hand to the Python's walk (not started,
   and ``start_is_pythons``)?  1 yes, 0 no (or no WQE up next), -1 error.  Asked
   first, before the QP's own conditions: such a WQE (a local operation, a WRITE
   longer than an MTU, an ATOMIC WRITE, a FLUSH) goes straight to the Python's
   ``generate``. */
static int first_is_pythons(PyObject *qp)
{
    PyObject *req = GA(qp, s_req), *sq = req ? GA(qp, s_sq) : NULL, *wqe = NULL, *t = NULL;
    long long i, mtu;
    int r = -1;
    if (sq == NULL || get_ll(req, s_send_idx, &i) < 0)
        goto out;
    Py_ssize_t nsq = PyObject_Length(sq);
    if (nsq < 0)
        goto out;
    if (i >= nsq) {
        r = 0;
        goto out;
    }
    if ((wqe = PySequence_GetItem(sq, i)) == NULL || (t = GA(wqe, s_first_psn)) == NULL)
        goto out;
    int unstarted = t == Py_None;
    Py_CLEAR(t);
    if (!unstarted) {
        r = 0;
        goto out;
    }
    if ((r = get_truth(wqe, s_done)) != 0) {
        r = r < 0 ? -1 : 0;
        goto out;
    }
    r = get_ll(qp, s_mtu, &mtu) < 0 ? -1 : start_is_pythons(wqe, mtu);
out:
    Py_XDECREF(req);
    Py_XDECREF(sq);
    Py_XDECREF(wqe);
    Py_XDECREF(t);
    return r;
}

/* generate's chain for an uncontrolled RC QP (see the top of this file): 0 it
   ended here, 1 the Python's to go on from here, -1 error */
static int bulk_runs(PyObject *dev, PyObject *qp, PyObject *out)
{
    PyObject *t = NULL, *comp = NULL, *req = NULL, *sq = NULL, *dest = NULL, *attr = NULL,
        *wqe = NULL;
    int r = -1, s;
    long long ack_every;
    struct run_plan plan;
    if (tx_heads == NULL || crc32_of == NULL || !PyList_CheckExact(out))
        return 1;
    if ((s = first_is_pythons(qp)) != 0)        /* (the Python's START: at once) */
        return s < 0 ? -1 : 1;
    if ((t = GA(qp, s_qp_type)) == NULL)
        return -1;
    int mine = t == RC;                         /* RC, no XRC, go-back-N, the fast paths */
    Py_CLEAR(t);
    if (mine) {
        mine = (t = GA(qp, s_xrc)) == NULL ? -1 : t == Py_None;
        Py_CLEAR(t);
    }
    if (mine == 1)
        mine = (s = get_truth(qp, s_selective_repeat)) < 0 ? -1 : !s;
    if (mine == 1)
        mine = get_truth(dev, s_fast);
    if (mine == 1)                              /* and the kernel, a driver that gathers */
        mine = get_truth(dev, s_tx_gather);
    if (mine == 1) {                            /* (the device's kernel is the one hooked in) */
        mine = (t = GA(dev, s_kernel)) == NULL ? -1 : t == tx_kernel;
        Py_CLEAR(t);
    }
    if (mine <= 0)
        return mine < 0 ? -1 : 1;
    /* IDLE: comp.rnr_wait or qp.state not in _SENDING */
    if ((comp = GA(qp, s_comp)) == NULL || (s = get_truth(comp, s_rnr_wait)) < 0)
        goto out;
    if (!s) {
        PyObject *st = GA(qp, s_state);
        s = st == NULL ? -1 : PySequence_Contains(SENDING, st);
        Py_XDECREF(st);
        if (s < 0)
            goto out;
        s = !s;
    }
    if (s) {
        r = 0;
        goto out;
    }
    if ((s = get_truth(comp, s_rexmit)) != 0) {     /* RESEND is the Python's */
        r = s < 0 ? -1 : 1;
        goto out;
    }
    if (get_ack_every(dev, qp, &ack_every) < 0 || (dest = GA(qp, s_dest)) == NULL
        || (req = GA(qp, s_req)) == NULL || (sq = GA(qp, s_sq)) == NULL
        || (attr = GA(qp, s_attr)) == NULL || get_ll(attr, s_dest_qp_num, &plan.dqpn) < 0
        || get_ll(qp, s_mtu, &plan.mtu) < 0)
        goto out;
    plan.dqpn &= QPN_MASK_;
    for (;;) {                  /* while req.send_idx < len(sq) and not req.error */
        long long i;
        Py_CLEAR(wqe);
        if (get_ll(req, s_send_idx, &i) < 0)
            goto out;
        Py_ssize_t nsq = PyObject_Length(sq);
        int error = nsq < 0 ? -1 : i < nsq ? get_truth(req, s_error) : 0;
        if (error < 0)
            goto out;
        if (i >= nsq || error) {
            r = 0;
            goto out;
        }
        if ((wqe = PySequence_GetItem(sq, i)) == NULL || (t = GA(wqe, s_first_psn)) == NULL)
            goto out;
        int unstarted = t == Py_None;
        Py_CLEAR(t);
        int done = get_truth(wqe, s_done);
        if (done < 0)
            goto out;
        if (unstarted && !done) {                                       /* START */
            if ((s = start_is_pythons(wqe, plan.mtu)) != 0) {
                r = s < 0 ? -1 : 1;
                goto out;
            }
            if ((s = start_wqe(dev, qp, req, wqe, &done)) <= 0) {
                r = s;
                goto out;
            }
            if (done)
                continue;
        } else if (done) {
            if (attr_add(req, s_send_idx, 1) < 0)
                goto out;
            continue;
        }
        PyObject *op = GA(wqe, s_opcode);
        if (op == NULL)
            goto out;
        if (get_ll(wqe, s_first_psn, &plan.first) < 0 || get_ll(wqe, s_next_pkt, &plan.nxt) < 0
            || get_ll(wqe, s_npkts, &plan.npkts) < 0) {
            Py_DECREF(op);
            goto out;
        }
        if (plan.nxt == 0 && (plan.npkts == 1 || op == RDMA_READ)) {
            /* SEND of a request of one packet (no WINDOW: START's _may_start saw to it) */
            plan.psn = plan.first & PSN_MASK_;
            s = one_packet(dev, req, wqe, op, &plan, dest, out);
            Py_DECREF(op);
            if (s <= 0) {
                r = s < 0 ? -1 : 1;
                goto out;
            }
            continue;
        }
        PyObject *mid = PyDict_GetItemWithError(MIDDLE_W0, op);    /* op in _MIDDLE */
        PyObject *fst = mid ? PyDict_GetItemWithError(RUN_FIRST_W0, op) : NULL;
        PyObject *lst = mid ? PyDict_GetItemWithError(LAST, op) : NULL;
        Py_DECREF(op);
        if (PyErr_Occurred())
            goto out;
        if (mid == NULL || lst == NULL || !PyTuple_CheckExact(lst) || PyTuple_GET_SIZE(lst) != 2) {
            r = 1;                      /* no MIDDLE to it: _send_packet's */
            goto out;
        }
        if ((plan.w0_mid = PyLong_AsLongLong(mid)) == -1 && PyErr_Occurred())
            goto out;
        plan.w0_first = 0;
        if (fst != NULL && (plan.w0_first = PyLong_AsLongLong(fst)) == -1 && PyErr_Occurred())
            goto out;
        if (((plan.lop = PyLong_AsLongLong(PyTuple_GET_ITEM(lst, 0))) == -1
             || (plan.tail = PyLong_AsLongLong(PyTuple_GET_ITEM(lst, 1))) == -1)
            && PyErr_Occurred())
            goto out;
        for (;;) {      /* the WQE's packets: WINDOW, SEND until it is all sent */
            long long room;
            if (get_ll(wqe, s_first_psn, &plan.first) < 0 || get_ll(wqe, s_next_pkt, &plan.nxt) < 0
                || get_ll(wqe, s_npkts, &plan.npkts) < 0)
                goto out;
            plan.psn = (plan.first + plan.nxt) & PSN_MASK_;
            if (window_room(qp, plan.psn, &room) < 0)
                goto out;
            if (plan.nxt && room <= 0) {                            /* WINDOW */
                r = 0;
                goto out;
            }
            /* SEND: _bulk_run where its run starts at a MIDDLE, or at a SEND's FIRST */
            if (!(plan.nxt || (plan.npkts > 1 && fst != NULL))) {
                r = 1;                  /* one packet, or a WRITE's FIRST: _send_packet's */
                goto out;
            }
            if ((s = bulk_run(dev, qp, req, wqe, &plan, dest, ack_every, out, room)) <= 0) {
                r = s < 0 ? -1 : 1;
                goto out;
            }
            if (plan.nxt + plan.k >= plan.npkts)
                break;                  /* all sent: the next WQE */
        }
    }
out:
    Py_XDECREF(t);
    Py_XDECREF(comp);
    Py_XDECREF(req);
    Py_XDECREF(sq);
    Py_XDECREF(dest);
    Py_XDECREF(attr);
    Py_XDECREF(wqe);
    return r;
}

/* kernel_hooks(kernel, tx_heads, crc32): the loaded kernel (``softnic.accel.Kernel``)
   and the addresses of its sn_tx_heads and sn_crc32 (softnic.accel.hook_kernel),
   which ``bulk_runs`` builds the runs of a device whose ``kernel`` it is with;
   None, 0, 0: none (every run the Python's) */
static PyObject *kernel_hooks(PyObject *mod, PyObject *const *args, Py_ssize_t n)
{
    if (n != 3) {
        PyErr_SetString(PyExc_TypeError, "kernel_hooks(kernel, tx_heads, crc32)");
        return NULL;
    }
    size_t a = PyLong_AsSize_t(args[1]), c = a == (size_t)-1 ? 0 : PyLong_AsSize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    int on = a && c && args[0] != Py_None;
    tx_heads = on ? (tx_heads_fn)a : NULL;
    crc32_of = on ? (crc32_fn)c : NULL;
    Py_XSETREF(tx_kernel, on ? Py_NewRef(args[0]) : NULL);
    return Py_NewRef(Py_None);
}

/* requester.generate(dev, qp, now, out): this file's part, then the Python's if
   it is to go on; a generate put in the module's place is called instead */
int sn_generate(PyObject *dev, PyObject *qp, PyObject *now, PyObject *out)
{
    PyObject *f = PyObject_GetAttr(requester_module, s_generate);
    if (f == NULL)
        return -1;
    int r = 1;
    if (f == py_generate) {
        PyObject *cc = GA(qp, s_cc);
        r = cc == NULL ? -1 : cc == Py_None ? bulk_runs(dev, qp, out)
            : paced_middles(dev, qp, now, out);
        Py_XDECREF(cc);
    }
    if (r == 1) {
        PyObject *args[4] = {dev, qp, now, out};
        PyObject *g = PyObject_Vectorcall(f, args, 4, NULL);
        r = g == NULL ? -1 : 0;
        Py_XDECREF(g);
    }
    Py_DECREF(f);
    return r;
}

/* generate(dev, qp, now, out), for tests: sn_generate */
static PyObject *generate(PyObject *mod, PyObject *const *args, Py_ssize_t n)
{
    if (n != 4) {
        PyErr_SetString(PyExc_TypeError, "generate(dev, qp, now, out)");
        return NULL;
    }
    if (requester_module == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "generate: device_methods() not called yet");
        return NULL;
    }
    return sn_generate(args[0], args[1], args[2], args[3]) < 0 ? NULL : Py_NewRef(Py_None);
}

PyMethodDef sn_requester_methods[] = {
    {"generate", (PyCFunction)(void (*)(void))generate, METH_FASTCALL,
     "requester.generate(dev, qp, now, out), its paced MIDDLEs and gathered runs compiled"},
    {"kernel_hooks", (PyCFunction)(void (*)(void))kernel_hooks, METH_FASTCALL,
     "kernel_hooks(kernel, tx_heads, crc32): the loaded kernel the runs are built by"},
    {NULL, NULL, 0, NULL},
};

static int const_ll(PyObject *module, const char *name, long long *v)
{
    return take_ll(PyObject_GetAttrString(module, name), v);
}

/* {w: bth_word0(op) for w, op in requester.<name>.items()}: a new dict, or NULL */
static PyObject *word0_table(PyObject *requester, const char *name)
{
    PyObject *table = PyObject_GetAttrString(requester, name), *word0 = NULL, *w, *op;
    PyObject *d = table == NULL ? NULL : PyDict_New();
    if (d != NULL && ((word0 = PyObject_GetAttrString(requester, "bth_word0")) == NULL
                      || !PyDict_Check(table)))
        Py_CLEAR(d);
    Py_ssize_t pos = 0;
    while (d != NULL && PyDict_Next(table, &pos, &w, &op)) {
        PyObject *v = PyObject_CallOneArg(word0, op);
        if (v == NULL || PyDict_SetItem(d, w, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    if (d == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_TypeError, "requester.%s must be a dict", name);
    Py_XDECREF(table);
    Py_XDECREF(word0);
    return d;
}

/* requester.py's functions and constants */
int sn_requester_setup(PyObject *requester)
{
    long long bth_len;
    Py_XSETREF(requester_module, Py_NewRef(requester));
    Py_XSETREF(py_generate, PyObject_GetAttr(requester, s_generate));
    Py_XSETREF(py_may_start, PyObject_GetAttr(requester, s_may_start));
    Py_XSETREF(py_start, PyObject_GetAttr(requester, s_start));
    Py_XSETREF(PLAIN_START, PyObject_GetAttrString(requester, "_PLAIN_START"));
    Py_XSETREF(RTS, PyObject_GetAttrString(requester, "_RTS"));
    if (py_may_start == NULL || py_start == NULL || PLAIN_START == NULL || RTS == NULL
        || const_ll(requester, "_FENCE", &FENCE_) < 0)
        return -1;
    if (!PyFrozenSet_CheckExact(PLAIN_START)) {
        PyErr_SetString(PyExc_TypeError, "requester._PLAIN_START must be a frozenset");
        return -1;
    }
    Py_XSETREF(RC, PyObject_GetAttrString(requester, "_RC"));
    Py_XSETREF(SENDING, PyObject_GetAttrString(requester, "_SENDING"));
    if (py_generate == NULL || RC == NULL || SENDING == NULL
        || const_ll(requester, "PSN_MASK", &PSN_MASK_) < 0
        || const_ll(requester, "PSN_HALF", &PSN_HALF_) < 0
        || const_ll(requester, "PSN_MODULUS", &PSN_MODULUS_) < 0
        || const_ll(requester, "BTH_ACKREQ", &BTH_ACKREQ_) < 0
        || const_ll(requester, "QPN_MASK", &QPN_MASK_) < 0
        || const_ll(requester, "WIRE_OVERHEAD", &WIRE_OVERHEAD_) < 0
        || const_ll(requester, "BTH_LEN", &bth_len) < 0)
        return -1;
    if (const_ll(requester, "_SOLICITED", &SOLICITED_) < 0
        || const_ll(requester, "BTH_SE", &BTH_SE_) < 0
        || const_ll(requester, "BTH_PAD_SHIFT", &BTH_PAD_SHIFT_) < 0)
        return -1;
    if (const_ll(requester, "DEFAULT_PKEY", &DEFAULT_PKEY_) < 0
        || const_ll(requester, "ICRC_LEN", &ICRC_LEN_) < 0
        || const_ll(requester, "_HEAD_BYTES", &HEAD_BYTES_) < 0)
        return -1;
    if (HEAD_BYTES_ != 16) {
        PyErr_SetString(PyExc_RuntimeError, "kernel.c's sn_tx_heads writes 16 bytes a head");
        return -1;
    }
    Py_XSETREF(GATHER, PyObject_GetAttrString(requester, "Gather"));
    Py_XSETREF(RUN, PyObject_GetAttrString(requester, "Run"));
    Py_XSETREF(LAST, PyObject_GetAttrString(requester, "_LAST"));
    PyObject *wc = PyObject_GetAttrString(requester, "WCStatus"),
        *wr = wc ? PyObject_GetAttrString(requester, "W") : NULL;
    Py_XSETREF(SUCCESS, wr ? PyObject_GetAttrString(wc, "SUCCESS") : NULL);
    Py_XSETREF(SEND_WITH_INV, SUCCESS ? PyObject_GetAttrString(wr, "SEND_WITH_INV") : NULL);
    Py_XSETREF(RDMA_READ, SEND_WITH_INV ? PyObject_GetAttrString(wr, "RDMA_READ") : NULL);
    Py_XSETREF(FETCH_ADD, RDMA_READ ? PyObject_GetAttrString(wr, "ATOMIC_FETCH_AND_ADD") : NULL);
    Py_XDECREF(wc);
    Py_XDECREF(wr);
    Py_XSETREF(ONLY, PyObject_GetAttrString(requester, "_ONLY"));
    Py_XSETREF(SEALED, PyObject_GetAttrString(requester, "Sealed"));
    if (GATHER == NULL || RUN == NULL || LAST == NULL || FETCH_ADD == NULL || ONLY == NULL
        || SEALED == NULL)
        return -1;
    if (!PyType_Check(RUN) || !PyType_IsSubtype((PyTypeObject *)RUN, &PyTuple_Type)
        || !PyType_Check(SEALED) || !PyType_IsSubtype((PyTypeObject *)SEALED, &PyTuple_Type)
        || !PyDict_Check(LAST) || !PyDict_Check(ONLY)) {
        PyErr_SetString(PyExc_TypeError,
                        "requester.Run and Sealed must be tuple types, _LAST and _ONLY dicts");
        return -1;
    }
    PyObject *w, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(ONLY, &pos, &w, &v))
        if (!PyTuple_CheckExact(v) || PyTuple_GET_SIZE(v) != 6) {
            PyErr_SetString(PyExc_TypeError, "requester._ONLY's values must be 6-tuples");
            return -1;
        }
    BTH_LEN_ = (Py_ssize_t)bth_len;
    if (BTH_LEN_ != 12) {
        PyErr_SetString(PyExc_RuntimeError, "requester.c writes the BTH as three 32-bit words");
        return -1;
    }
    /* MIDDLE_W0 = {w: bth_word0(m) for w, m in _MIDDLE.items()}, and RUN_FIRST_W0 of
       _RUN_FIRST the same */
    Py_XSETREF(MIDDLE_W0, word0_table(requester, "_MIDDLE"));
    if (MIDDLE_W0 == NULL)
        return -1;
    Py_XSETREF(RUN_FIRST_W0, word0_table(requester, "_RUN_FIRST"));
    return RUN_FIRST_W0 == NULL ? -1 : 0;
}

int sn_requester_init(void)
{
    INTERN(s_generate, "generate"); INTERN(s_fast, "fast"); INTERN(s_cc, "cc");
    INTERN(s_qp_type, "qp_type"); INTERN(s_xrc, "xrc");
    INTERN(s_selective_repeat, "selective_repeat"); INTERN(s_comp, "comp");
    INTERN(s_rnr_wait, "rnr_wait"); INTERN(s_state, "state"); INTERN(s_ccs, "ccs");
    INTERN(s_pace_at, "pace_at"); INTERN(s_rate, "rate"); INTERN(s_window, "window");
    INTERN(s_next_tx, "next_tx"); INTERN(s_req, "req"); INTERN(s_sq, "sq");
    INTERN(s_inline, "inline"); INTERN(s_sges, "sges"); INTERN(s_pd, "pd"); INTERN(s_psn, "psn");
    INTERN(s_last_psn, "last_psn");
    INTERN(s_send_idx, "send_idx"); INTERN(s_error, "error"); INTERN(s_first_psn, "first_psn");
    INTERN(s_done, "done"); INTERN(s_rexmit, "rexmit"); INTERN(s_config, "config");
    INTERN(s_ack_every, "ack_every"); INTERN(s_dest, "dest"); INTERN(s_next_pkt, "next_pkt");
    INTERN(s_npkts, "npkts"); INTERN(s_opcode, "opcode"); INTERN(s_rd_atomic, "rd_atomic");
    INTERN(s_acked_psn, "acked_psn"); INTERN(s_inflight, "inflight");
    INTERN(s_pkts_since_ackreq, "pkts_since_ackreq"); INTERN(s_mtu, "mtu");
    INTERN(s_min_timer, "min_timer"); INTERN(s_rto, "rto");
    INTERN(s_max_sent_psn, "max_sent_psn");
    INTERN(s_retransmitted_pkts, "retransmitted_pkts"); INTERN(s_attr, "attr");
    INTERN(s_dest_qp_num, "dest_qp_num"); INTERN(s_views, "views"); INTERN(s_sent, "sent");
    INTERN(s_on_packet_sent, "on_packet_sent");
    INTERN(s_may_start, "_may_start"); INTERN(s_start, "start");
    INTERN(s_tx_icrc_start, "tx_icrc_start"); INTERN(s_kernel, "kernel");
    INTERN(s_tx_gather, "tx_gather"); INTERN(s_tx_starts, "tx_starts");
    INTERN(s_status, "status"); INTERN(s_length, "length"); INTERN(s_flags, "flags");
    INTERN(s_imm, "imm"); INTERN(s_inv_rkey, "inv_rkey"); INTERN(s_remote_addr, "remote_addr");
    INTERN(s_rkey, "rkey"); INTERN(s_compare_add, "compare_add"); INTERN(s_swap, "swap");
    INTERN(s_icrc, "icrc");
    kw_sent = Py_BuildValue("(ssss)", "now", "nbytes", "psn", "retransmit");
    return kw_sent == NULL ? -1 : 0;
}
