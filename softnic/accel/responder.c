/* A SEND received in one run (softnic.core.responder.receive_send_run), or in one
   packet (receive_edge of an ONLY), compiled.

   ``receive_send_run``'s checks, statement for statement over the device's and
   the QP's own Python objects, for a run of datagrams that begins with a SEND's
   FIRST (UCX's and MPI's eager fragments arrive so, one run each): the QP's
   conditions (``_common_qp``: an RC QP, no XRC, the default P_Key, FECN and BECN
   clear, a receiving state, the peer it is connected to), nothing held beyond a
   hole, a whole MTU in the FIRST, no message under way (``_in_sequence``), a
   receive posted; the receive's target (``recv_target``'s case of one SGE,
   compiled: ``one_sge_target``); the run's
   LAST and its size; the ICRC states (``rx_icrc_start``'s memo read here, the
   Python's asked where it holds none); then kernel.c's ``sn_rx_send_run`` (given
   by ``responder_setup``, for a device whose ``kernel`` is the one it is of),
   and the accounting of ``took_send_run`` (``_first_taken``, ``took_middles``,
   ``_last_taken``, ``_executed``, with ``accept`` and ``queue_ack``) over the
   same objects, calling ``take_recv``, ``_last`` (the receive's completion;
   a plain SEND's compiled, ``plain_last``: ``_send_done``, ``recv_done``,
   ``Device.post_cqe`` and ``CQ.push`` where the CQ raises no event) and
   ``_more_middles`` as it calls them.  A ``receive_send_run``,
   ``took_send_run``, ``recv_target`` or ``_last`` put in the module's place (a
   test's stand-in, a tracer) is called instead.

   ``softnic.accel.give_compiled`` makes ``receive_send_run`` a device class's
   ``_send_run`` (``Dispatch._send_run``'s place), which ``Dispatch.receive_run``
   calls for a run that begins with a SEND's FIRST.  tests/test_send_runs.py
   compares it with the Python's on random runs and QP states, field by field.

   And a SEND of one packet (``receive_send_only``: ``responder.receive_edge`` for
   an ONLY, plain, with an immediate or with an IETH), the class's ``_send_only``,
   which ``Dispatch.receive_run`` calls for each: ``receive_edge``'s checks (the
   QP's, none under way, at most an MTU, a receive posted and its target) over
   the same objects, kernel.c's ``sn_rx_edge`` for the packet's, then
   ``took_send_edge``'s accounting of an ONLY (``_only_taken``, ``_executed``:
   ``take_recv`` called, ``_last`` as above, ``accept`` compiled).  A ``receive_edge`` or
   ``took_send_edge`` put in the module's place is called instead.
   tests/test_send_only.py compares it with the Python's and with the general
   path's. */

#include "objects.h"
#include "bytes.h"

typedef int (*rx_send_run_fn)(const uint8_t *, size_t, size_t, size_t, uint32_t, uint32_t,
                              uint32_t, uint32_t, uint32_t, uint32_t, size_t, uint32_t,
                              uint32_t, int, uint64_t, uint8_t *, uint64_t, uint32_t *,
                              uint32_t, uint32_t *);
static rx_send_run_fn rx_send_run;      /* kernel.c's sn_rx_send_run */
typedef int (*rx_edge_fn)(const uint8_t *, size_t, uint32_t, uint32_t, uint32_t, uint32_t, int,
                          uint8_t *, uint64_t, uint64_t, uint64_t);
static rx_edge_fn rx_edge;              /* kernel.c's sn_rx_edge */
static PyObject *rx_kernel;             /* the kernel object it is of: a device's must be it */

static PyObject *responder_module, *py_receive_send_run, *py_took_send_run, *py_receive_edge,
    *py_took_send_edge, *py_recv_target, *py_last;
/* recv_target's and _last's compiled cases: responder.py's WC, _WC_SUCCESS, _NO_WC_FLAGS,
   WCOpcode.RECV and MW, Access.LOCAL_WRITE, memory.py's MR and KeyTable, and the
   methods they call as those are (Device.post_cqe, CQ.push): a device, CQ, key table
   or MR of another class is the Python's */
static PyObject *s_wc_wr_id, *s_wc_status, *s_wc_opcode, *s_wc_qp_num, *s_wc_byte_len,
    *s_wc_imm_data, *s_wc_wc_flags, *s_wc_src_qp, *s_wc_invalidated_rkey, *s_wc_vendor_err,
    *s_wc_pkey_index, *s_wc_slid, *s_wc_sl, *s_wc_dlid_path_bits, *s_wc_solicited;
static PyObject *WC_CLASS, *WC_SUCCESS, *NO_WC_FLAGS, *WC_RECV, *MW_CLASS, *MR_CLASS,
    *KEYTABLE_CLASS, *py_post_cqe, *py_push;
static long long LOCAL_WRITE_;
static PyObject *RC, *RECEIVING, *SEND_EDGE_INFO, *SEND_ONLY_INFO, *SEND_KIND, *ACK_CREDITS;
static long long QPN_MASK_, ECN_, DEFAULT_PKEY_, SEND_FIRST_, W0_SEND_MIDDLE_, EXT_TAIL_,
    ACKREQ_, SE_, PAD_SHIFT_, PAD_MASK_, PSN_MASK_, MSN_MASK_, BTH_LEN_, ICRC_LEN_;
#define ACKS_MAX 64                     /* responder._ACKS_PER_RUN (checked at setup) */
static PyObject *s_receive_send_run, *s_config, *s_check_icrc, *s_qp_type, *s_xrc,
    *s_state, *s_sr, *s_ooo, *s_mtu, *s_resp, *s_kind, *s_srq, *s_rq, *s_queue,
    *s_recv_target, *s_qpn, *s_epsn, *s_rx_starts, *s_rx_icrc_start, *s_took_send_run,
    *s_last, *s_hdr_len, *s_kernel, *s_rcvd_pkts, *s_ack_deferred, *s_out,
    *s_msn, *s_append, *s_nak_sent, *s_naked, *s_scan, *s_writes, *s_placed,
    *s_nothing_held, *s_take_recv, *s_wqe, *s_off, *s_last_, *s_more_middles, *s_receive_edge,
    *s_took_send_edge, *s_sges, *s_length, *s_keys, *s_by_key, *s_pd, *s_access, *s_valid,
    *s_addr, *s_view, *s_immdt, *s_ieth, *s_recv_cq, *s_overflowed, *s_entries, *s_depth,
    *s_armed, *s_mirror, *s_closed, *s_rdma_recvs, *s_wr_id, *s_attr, *s_dest_qp_num,
    *s_cqes_posted, *s_solicited, *s_post_cqe, *s_push;

/* responder.name(args...) */
#define call_responder(name, args, n) call_fn(responder_module, (name), (args), (n))

/* rx_icrc_start(dev, src, size, w0, qpn): dev.rx_starts by its key, else the Python's */
static int rx_start(PyObject *dev, PyObject *src, long long size, long long w0, long long qpn,
                    uint32_t *out)
{
    const long long k[4] = {size, w0, qpn, 0};
    return icrc_start_memo(dev, s_rx_starts, responder_module, s_rx_icrc_start, src, k, 3, out);
}

/* rx_start for the other files' edges (completer.c's ACK) */
int sn_rx_start(PyObject *dev, PyObject *src, long long size, long long w0, long long qpn,
                uint32_t *out)
{
    return rx_start(dev, src, size, w0, qpn, out);
}

/* kernel.c's sn_rx_edge where ``dev``'s kernel is the one hooked in (as ``pythons``
   asks), else NULL (the Python's to run; -1 in *err where reading it failed) */
void *sn_rx_edge_of(PyObject *dev, int *err)
{
    PyObject *kernel = GA(dev, s_kernel);
    *err = kernel == NULL ? -1 : 0;
    Py_XDECREF(kernel);                         /* (compared, not used) */
    return kernel != NULL && kernel == rx_kernel ? (void *)rx_edge : NULL;
}

/* _common_qp(dev, w2, pkey, src): the QP, a new reference, or NULL with no error */
static PyObject *common_qp(PyObject *dev, long long w2, long long pkey, PyObject *src)
{
    PyObject *qp = qp_of(dev, w2 & QPN_MASK_), *t = NULL;
    if (qp == NULL)
        return NULL;
    int ok = (t = GA(qp, s_qp_type)) == NULL ? -1 : t == RC;
    Py_CLEAR(t);
    if (ok == 1) {
        ok = (t = GA(qp, s_xrc)) == NULL ? -1 : t == Py_None;
        Py_CLEAR(t);
    }
    if (ok == 1)
        ok = pkey == DEFAULT_PKEY_ && !(w2 & ECN_);
    if (ok == 1) {
        ok = (t = GA(qp, s_state)) == NULL ? -1 : PySequence_Contains(RECEIVING, t);
        Py_CLEAR(t);
    }
    if (ok == 1)
        ok = from_peer(qp, src);
    if (ok != 1)
        Py_CLEAR(qp);
    return qp;
}

/* queue_ack(dev, qp, psn): a plain ACK, replacing a plain ACK queued last */
static int queue_ack(PyObject *dev, PyObject *qp, PyObject *resp, long long psn)
{
    PyObject *out = GA(resp, s_out), *msn = NULL, *entry = NULL, *r = NULL;
    int res = -1;
    if (out == NULL || (msn = GA(resp, s_msn)) == NULL)
        goto done;
    Py_ssize_t n = PyObject_Length(out);
    if (n < 0)
        goto done;
    int replace = 0;
    if (n) {                                    /* type(last) is tuple and last[1] == ACK_CREDITS */
        PyObject *last = PySequence_GetItem(out, n - 1);
        if (last == NULL)
            goto done;
        replace = PyTuple_CheckExact(last) && PyTuple_GET_SIZE(last) > 1
            ? PyObject_RichCompareBool(PyTuple_GET_ITEM(last, 1), ACK_CREDITS, Py_EQ) : 0;
        Py_DECREF(last);
        if (replace < 0)
            goto done;
    }
    PyObject *p = PyLong_FromLongLong(psn);
    if (p == NULL || (entry = PyTuple_Pack(3, p, ACK_CREDITS, msn)) == NULL) {
        Py_XDECREF(p);
        goto done;
    }
    Py_DECREF(p);
    if (replace) {
        if (PySequence_SetItem(out, n - 1, entry) < 0 || dev_count(dev, s_ack_deferred, 1) < 0)
            goto done;
    } else if ((r = PyObject_CallMethodOneArg(out, s_append, entry)) == NULL) {
        goto done;
    }
    Py_CLEAR(r);
    res = mark_ready(dev, qp);
done:
    Py_XDECREF(out);
    Py_XDECREF(msn);
    Py_XDECREF(entry);
    Py_XDECREF(r);
    return res;
}

/* accept(dev, qp, psn, last, ackreq) */
static int accept(PyObject *dev, PyObject *qp, PyObject *resp, long long psn, int last, int ackreq)
{
    if (set_ll(resp, s_epsn, (psn + 1) & PSN_MASK_) < 0 || SA(resp, s_nak_sent, Py_False) < 0)
        return -1;
    if (last) {
        long long msn;
        if (get_ll(resp, s_msn, &msn) < 0 || set_ll(resp, s_msn, (msn + 1) & MSN_MASK_) < 0)
            return -1;
    }
    return last || ackreq ? queue_ack(dev, qp, resp, psn) : 0;
}

/* _nothing_held(qp) where it has anything to clear (sr.naked, sr.scan, sr.writes,
   sr.placed): the Python's */
static int nothing_held(PyObject *qp)
{
    PyObject *sr = GA(qp, s_sr), *t = NULL;
    if (sr == NULL)
        return -1;
    int any = get_truth(sr, s_naked);
    if (any == 0)
        any = (t = GA(sr, s_scan)) == NULL ? -1 : t != Py_None;
    Py_CLEAR(t);
    if (any == 0)
        any = get_truth(sr, s_writes);
    if (any == 0)
        any = (t = GA(sr, s_placed)) == NULL ? -1 : t != Py_None;
    Py_XDECREF(t);
    Py_DECREF(sr);
    if (any <= 0)
        return any;
    PyObject *r = call_responder(s_nothing_held, &qp, 1);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* A message's first packet taken: counted (``dev.counters["rcvd_pkts"] += 1``) and
   the first receive WQE posted taken for it (``resp.wqe = take_recv(dev, qp)``) */
static int recv_taken(PyObject *dev, PyObject *qp, PyObject *resp)
{
    if (dev_count(dev, s_rcvd_pkts, 1) < 0)
        return -1;
    PyObject *args[2] = {dev, qp};
    PyObject *wqe = call_responder(s_take_recv, args, 2);      /* take_recv(dev, qp) */
    if (wqe == NULL)
        return -1;
    int r = SA(resp, s_wqe, wqe);
    Py_DECREF(wqe);
    return r;
}

/* The end of a SEND at ``psn``, its LAST's or ONLY's bytes placed: ``_last(dev, qp,
   info, psn, tail, se)`` (the receive's completion: ``plain_last``'s case, else the
   Python's), then, unless that refused it, ``accept(dev, qp, psn, True, True)`` (a
   LAST is ACKed anyway) */
static int plain_last(PyObject *dev, PyObject *qp, PyObject *resp, PyObject *info, int se);

static int last_accepted(PyObject *dev, PyObject *qp, PyObject *resp, PyObject *info,
                         long long psn, long long tail, int se)
{
    int ok = plain_last(dev, qp, resp, info, se);
    if (ok == 0) {                              /* not its case: the Python's */
        PyObject *p = PyLong_FromLongLong(psn), *t = PyLong_FromLongLong(tail);
        PyObject *largs[6] = {dev, qp, info, p, t, se ? Py_True : Py_False};
        ok = p == NULL || t == NULL ? -1 : take_truth(call_responder(s_last_, largs, 6));
        Py_XDECREF(p);
        Py_XDECREF(t);
    }
    return ok < 0 || (ok && accept(dev, qp, resp, psn, 1, 1) < 0) ? -1 : 0;
}

/* _executed's first test: is a packet held out of order (``qp.sr.ooo``)?  1, 0, -1 */
static int held_beyond_hole(PyObject *qp)
{
    PyObject *sr = GA(qp, s_sr);
    int ooo = sr == NULL ? -1 : get_truth(sr, s_ooo);
    Py_XDECREF(sr);
    return ooo;
}

/* took_send_run(dev, qp, ackreq, m, acks, last, n_last, se, tail), statement for
   statement: _first_taken, took_middles, _last_taken (its _last the Python's) and
   _executed (its _more_middles the Python's).  acks: the kernel's AckReq count
   and indexes. */
static int took_send_run(PyObject *dev, PyObject *qp, PyObject *resp, int ackreq, long long m,
                         const uint32_t *acks, PyObject *last, long long n_last, int se,
                         long long tail, long long mtu)
{
    long long psn, off;
    PyObject *args[2] = {dev, qp};
    /* _first_taken(dev, qp, qp.mtu, ackreq) */
    if (recv_taken(dev, qp, resp) < 0 || set_ll(resp, s_off, mtu) < 0
        || SA(resp, s_kind, SEND_KIND) < 0
        || get_ll(resp, s_epsn, &psn) < 0 || accept(dev, qp, resp, psn, 0, ackreq) < 0)
        return -1;
    if (m) {                            /* took_middles(dev, qp, m, acks, 1, acks[0]) */
        if (dev_count(dev, s_rcvd_pkts, m) < 0 || get_ll(resp, s_off, &off) < 0
            || set_ll(resp, s_off, off + m * mtu) < 0 || get_ll(resp, s_epsn, &psn) < 0)
            return -1;
        for (uint32_t i = 1; i <= acks[0]; i++)
            if (queue_ack(dev, qp, resp, (psn + acks[i]) & PSN_MASK_) < 0)
                return -1;
        if (accept(dev, qp, resp, (psn + m - 1) & PSN_MASK_, 0, 0) < 0 || nothing_held(qp) < 0)
            return -1;
    }
    if (last != Py_None) {
        /* _last_taken(dev, qp, last, n_last, True, se, tail) */
        if (dev_count(dev, s_rcvd_pkts, 1) < 0 || get_ll(resp, s_off, &off) < 0
            || set_ll(resp, s_off, off + n_last) < 0 || get_ll(resp, s_epsn, &psn) < 0
            || last_accepted(dev, qp, resp, last, psn, tail, se) < 0)
            return -1;
    }
    /* _executed(dev, qp, last or _FIRST_INFO): nothing if a packet is held out of order */
    int ooo = held_beyond_hole(qp);
    if (ooo != 0)
        return ooo < 0 ? -1 : 0;
    if (last != Py_None)
        return nothing_held(qp);                /* (a LAST begins nothing) */
    /* a FIRST: the SEND under way, its MIDDLEs a driver may stream (_more_middles) */
    PyObject *res = call_responder(s_more_middles, args, 2);
    Py_XDECREF(res);
    return res == NULL ? -1 : nothing_held(qp);
}

/* The QP the BTH at ``bth`` names for an edge of the kernel's to take: ICRC checking on
   (``dev.config.check_icrc``), ``_common_qp``'s, nothing held beyond a hole; *mtu its
   MTU.  A new reference; NULL with no error where there is none such. */
static PyObject *edge_qp(PyObject *dev, const uint8_t *bth, PyObject *src, long long *mtu)
{
    PyObject *config = GA(dev, s_config);
    int check = config == NULL ? -1 : get_truth(config, s_check_icrc);
    Py_XDECREF(config);
    if (check <= 0)
        return NULL;
    PyObject *qp = common_qp(dev, be32(bth + 4), (long long)bth[2] << 8 | bth[3], src);
    if (qp == NULL)
        return NULL;
    if (held_beyond_hole(qp) != 0 || get_ll(qp, s_mtu, mtu) < 0)
        Py_CLEAR(qp);
    return qp;
}

/* The module's function ``name`` is ``own`` (the Python's, as set up): 1, 0 (a
   stand-in put in its place: a test's, a tracer), -1 */
static int module_own(PyObject *name, PyObject *own)
{
    PyObject *f = PyObject_GetAttr(responder_module, name);
    if (f == NULL)
        return -1;
    int r = f == own;
    Py_DECREF(f);
    return r;
}

/* ``dev.keys.local(pd, lkey, addr, length, write=write)`` (memory.py's
   ``KeyTable.local`` and ``MR.local_view``): 1 and *view a new reference to the
   view it gives; 2 where it raises AccessError (the key unknown in ``pd`` or a
   window's, an MR without LOCAL_WRITE for a write, invalidated, or not holding the
   range); 0 where it is not this (a key table or an MR of another class: an
   implicit MR's view is its own, or responder_setup not yet called); -1 an error.
   The requester's START (requester.c) asks it too. */
int sn_local_view(PyObject *dev, PyObject *pd, long long lkey, long long addr, long long length,
                  int write, PyObject **view)
{
    PyObject *keys = NULL, *by_key = NULL, *mr = NULL, *mpd = NULL;
    int r = -1;
    long long access, base, size;
    if (MR_CLASS == NULL || KEYTABLE_CLASS == NULL)
        return 0;
    if ((keys = GA(dev, s_keys)) == NULL)
        goto out;
    if ((PyObject *)Py_TYPE(keys) != KEYTABLE_CLASS) {
        r = 0;
        goto out;
    }
    if ((by_key = GA(keys, s_by_key)) == NULL)
        goto out;
    if (!PyDict_CheckExact(by_key)) {
        r = 0;
        goto out;
    }
    PyObject *k = PyLong_FromLongLong(lkey);
    if (k == NULL)
        goto out;
    mr = PyDict_GetItemWithError(by_key, k);    /* mr = self._by_key.get(lkey) */
    Py_DECREF(k);
    if (mr == NULL && PyErr_Occurred())
        goto out;
    Py_XINCREF(mr);
    if (mr != NULL && (mpd = GA(mr, s_pd)) == NULL)
        goto out;
    if (mr == NULL || mpd != pd || (PyObject *)Py_TYPE(mr) == MW_CLASS) {
        r = 2;                                  /* lkey unknown in this PD */
        goto out;
    }
    if ((PyObject *)Py_TYPE(mr) != MR_CLASS) {  /* (an implicit MR's view: its own) */
        r = 0;
        goto out;
    }
    /* mr.local_view(addr, length, write=write) */
    if (write) {
        PyObject *a = GA(mr, s_access);
        if (a == NULL)
            goto out;
        PyObject *ai = PyNumber_Index(a);       /* int(self.access) */
        Py_DECREF(a);
        if (take_ll(ai, &access) < 0)
            goto out;
        if (!(access & LOCAL_WRITE_)) {         /* MR lacks LOCAL_WRITE */
            r = 2;
            goto out;
        }
    }
    int valid = get_truth(mr, s_valid);         /* _check(addr, length) */
    if (valid < 0 || (valid && (get_ll(mr, s_addr, &base) < 0 || get_ll(mr, s_length, &size) < 0)))
        goto out;
    long long off = addr - base;
    if (!valid || off < 0 || length < 0 || off + length > size) {
        r = 2;
        goto out;
    }
    PyObject *v = GA(mr, s_view);               /* self.view[off:off + length] */
    if (v == NULL)
        goto out;
    *view = PySequence_GetSlice(v, (Py_ssize_t)off, (Py_ssize_t)(off + length));
    Py_DECREF(v);
    r = *view == NULL ? -1 : 1;
out:
    Py_XDECREF(keys);
    Py_XDECREF(by_key);
    Py_XDECREF(mr);
    Py_XDECREF(mpd);
    return r;
}

/* recv_target(dev, qp, wqe), compiled where the module's is the Python's:
   *out a new reference, (view, room) or None, as it answers (None for several
   SGEs, or for one that ``dev.keys.local(qp.pd, lkey, addr, length,
   write=True)`` refuses: a key unknown in the QP's PD or a window's, an MR
   without LOCAL_WRITE, invalidated, or not holding the range).  1: *out set;
   0: the Python's to answer (a stand-in, a key table or MR of another kind);
   -1: an error. */
static int one_sge_target(PyObject *dev, PyObject *qp, PyObject *wqe, PyObject **out)
{
    int own = module_own(s_recv_target, py_recv_target);
    if (own <= 0)
        return own;
    PyObject *sges = GA(wqe, s_sges), *pd = NULL, *t = NULL;
    int r = -1;
    long long addr, length, lkey, wlen;
    if (sges == NULL)
        return -1;
    int one = one_sge(sges, &addr, &length, &lkey);    /* addr, length, lkey = wqe.sges[0] */
    if (one != 1) {
        if (one == 2) {                         /* if len(wqe.sges) != 1: return None */
            *out = Py_NewRef(Py_None);
            r = 1;
        } else
            r = one;
        goto out;
    }
    /* dev.keys.local(qp.pd, lkey, addr, length, write=True), AccessError: None */
    if ((pd = GA(qp, s_pd)) == NULL)
        goto out;
    PyObject *slice = NULL;
    int got = sn_local_view(dev, pd, lkey, addr, length, 1, &slice);
    if (got <= 0) {
        r = got;
        goto out;
    }
    if (got == 2) {
        *out = Py_NewRef(Py_None);
        r = 1;
        goto out;
    }
    if (get_ll(wqe, s_length, &wlen) < 0) {
        Py_DECREF(slice);
        goto out;
    }
    PyObject *room = PyLong_FromLongLong(length < wlen ? length : wlen);   /* min(length, wqe.length) */
    t = room == NULL ? NULL : PyTuple_Pack(2, slice, room);
    Py_DECREF(slice);
    Py_XDECREF(room);
    if (t == NULL)
        goto out;
    *out = t;
    r = 1;
out:
    Py_DECREF(sges);
    Py_XDECREF(pd);
    return r;
}

/* WC(*args), args its first nine fields (wr_id, status, opcode, qp_num, byte_len,
   imm_data, wc_flags, src_qp, invalidated_rkey) and the rest their defaults, as the
   dataclass's __init__ makes it, without the call: where the setup found WC's
   fields, in order, and defaults to be those written here (WC_PLAIN), else the
   call */
static int WC_PLAIN;
static const char *const WC_FIELDS[15] = {
    "wr_id", "status", "opcode", "qp_num", "byte_len", "imm_data", "wc_flags", "src_qp",
    "invalidated_rkey", "vendor_err", "pkey_index", "slid", "sl", "dlid_path_bits",
    "solicited"};

static PyObject *new_wc(PyObject *const *args)
{
    if (!WC_PLAIN)
        return PyObject_Vectorcall(WC_CLASS, args, 9, NULL);
    PyTypeObject *tp = (PyTypeObject *)WC_CLASS;
    PyObject *wc = tp->tp_alloc(tp, 0), *zero = PyLong_FromLong(0);
    if (wc == NULL || zero == NULL
        || SA(wc, s_wc_wr_id, args[0]) < 0 || SA(wc, s_wc_status, args[1]) < 0
        || SA(wc, s_wc_opcode, args[2]) < 0 || SA(wc, s_wc_qp_num, args[3]) < 0
        || SA(wc, s_wc_byte_len, args[4]) < 0 || SA(wc, s_wc_imm_data, args[5]) < 0
        || SA(wc, s_wc_wc_flags, args[6]) < 0 || SA(wc, s_wc_src_qp, args[7]) < 0
        || SA(wc, s_wc_invalidated_rkey, args[8]) < 0 || SA(wc, s_wc_vendor_err, zero) < 0
        || SA(wc, s_wc_pkey_index, zero) < 0 || SA(wc, s_wc_slid, zero) < 0
        || SA(wc, s_wc_sl, zero) < 0 || SA(wc, s_wc_dlid_path_bits, zero) < 0
        || SA(wc, s_wc_solicited, Py_False) < 0)
        Py_CLEAR(wc);
    Py_XDECREF(zero);
    return wc;
}

/* new_wc for the other files' completions (completer.c) */
PyObject *sn_new_wc(PyObject *const *args)
{
    return new_wc(args);
}

/* WC_PLAIN: are WC's dataclass fields WC_FIELDS, in order, the defaults of all but
   the first nine (those new_wc is given) 0 (False for solicited), its instances
   __slots__ only, and no __post_init__? */
static int wc_plain(PyObject *wc_class)
{
    PyObject *dc = PyImport_ImportModule("dataclasses"), *fields = NULL;
    int ok = dc != NULL && PyType_Check(wc_class)
        && ((PyTypeObject *)wc_class)->tp_dictoffset == 0
        && !PyObject_HasAttrString(wc_class, "__post_init__")
        && (fields = PyObject_CallMethod(dc, "fields", "O", wc_class)) != NULL
        && PyTuple_Check(fields) && PyTuple_GET_SIZE(fields) == 15;
    for (int i = 0; ok && i < 15; i++) {
        PyObject *f = PyTuple_GET_ITEM(fields, i),
                 *name = PyObject_GetAttrString(f, "name"),
                 *dflt = name ? PyObject_GetAttrString(f, "default") : NULL;
        ok = dflt != NULL && PyUnicode_Check(name)
            && PyUnicode_CompareWithASCIIString(name, WC_FIELDS[i]) == 0
            && (i < 9 ? 1
                : i == 14 ? dflt == Py_False
                : PyLong_CheckExact(dflt) && PyLong_AsLong(dflt) == 0);
        Py_XDECREF(name);
        Py_XDECREF(dflt);
    }
    Py_XDECREF(fields);
    Py_XDECREF(dc);
    PyErr_Clear();
    return ok;
}

/* Is the CQ's push (CQ.push) at its first case for ``k`` more completions: the
   CQ's class's own push, not overflowed, not armed (no event to raise), room for
   them all?  1, 0, -1; *entries (where 1) a new reference to its entries. */
int sn_cq_room(PyObject *cq, Py_ssize_t k, PyObject **entries)
{
    long long depth;
    *entries = NULL;
    if (_PyType_Lookup(Py_TYPE(cq), s_push) != py_push)
        return 0;
    int busy = get_truth(cq, s_overflowed);     /* push: overflowed, full or armed */
    if (busy == 0)
        busy = get_truth(cq, s_armed);
    if (busy != 0)
        return busy < 0 ? -1 : 0;
    if ((*entries = GA(cq, s_entries)) == NULL || get_ll(cq, s_depth, &depth) < 0)
        goto fail;
    Py_ssize_t n = PyObject_Length(*entries);
    if (n < 0)
        goto fail;
    if (n + k <= depth)
        return 1;
    Py_CLEAR(*entries);
    return 0;
fail:
    Py_CLEAR(*entries);
    return -1;
}

/* Device.post_cqe(cq, wc, qp, solicited=se) where sn_cq_room found the CQ's push at
   its first case (``entries`` its entries): dev.cqes_posted += 1, then CQ.push's
   first case, statement for statement (wc.solicited, entries.append(wc), the
   mirror); 0, -1 */
int sn_post_cqe_plain(PyObject *dev, PyObject *cq, PyObject *entries, PyObject *wc, int se)
{
    if (attr_add(dev, s_cqes_posted, 1) < 0)
        return -1;
    if (se && SA(wc, s_solicited, Py_True) < 0)   /* push: if solicited */
        return -1;
    PyObject *a = PyObject_CallMethodOneArg(entries, s_append, wc);    /* entries.append(wc) */
    if (a == NULL)
        return -1;
    Py_DECREF(a);
    PyObject *m = GA(cq, s_mirror);             /* elif self.mirror is not None */
    if (m == NULL)
        return -1;
    int r = 0;
    if (m != Py_None) {                         /* mirror[0] = -1 if closed else len(entries) */
        int closed = get_truth(cq, s_closed);
        Py_ssize_t n = closed ? -1 : PyObject_Length(entries);
        PyObject *v = closed < 0 || n < -1 ? NULL : PyLong_FromSsize_t(n);
        PyObject *zero = v == NULL ? NULL : PyLong_FromLong(0);
        r = zero == NULL ? -1 : PyObject_SetItem(m, zero, v);     /* (a C array: cffi's) */
        Py_XDECREF(zero);
        Py_XDECREF(v);
    }
    Py_DECREF(m);
    return r;
}

/* Is dev's class's post_cqe Device.post_cqe (then sn_post_cqe_plain is it)? */
int sn_post_cqe_own(PyObject *dev)
{
    return _PyType_Lookup(Py_TYPE(dev), s_post_cqe) == py_post_cqe;
}

/* _last(dev, qp, info, psn, tail, se) of a plain SEND's LAST (no ImmDt, no IETH),
   compiled where the module's _last is the Python's: _send_done, recv_done,
   Device.post_cqe and CQ.push's first case (not overflowed, room, not armed:
   no event to raise), statement for statement; it never refuses.  1: done; 0:
   not that case, nothing changed (the Python's to do); -1: an error. */
static int plain_last(PyObject *dev, PyObject *qp, PyObject *resp, PyObject *info, int se)
{
    int own = module_own(s_last_, py_last);
    if (own <= 0)
        return own;
    int x = get_truth(info, s_immdt);
    if (x == 0)
        x = get_truth(info, s_ieth);
    if (x != 0)
        return x < 0 ? -1 : 0;
    if (!sn_post_cqe_own(dev))
        return 0;
    PyObject *cq = GA(qp, s_recv_cq), *entries = NULL, *wqe = NULL, *wc = NULL, *args[9] = {0};
    int r = -1;
    if (cq == NULL)
        return -1;
    int room = sn_cq_room(cq, 1, &entries);
    if (room <= 0) {
        r = room;
        goto out;
    }
    /* _send_done: wqe, resp.wqe = resp.wqe, None; resp.kind = None */
    if ((wqe = GA(resp, s_wqe)) == NULL || SA(resp, s_wqe, Py_None) < 0
        || SA(resp, s_kind, Py_None) < 0)
        goto out;
    /* recv_done(dev, qp, wqe, WCOpcode.RECV, resp.off, 0, _NO_WC_FLAGS, se, 0) */
    if (dev_count(dev, s_rdma_recvs, 1) < 0)
        goto out;
    PyObject *attr = GA(qp, s_attr);
    args[0] = GA(wqe, s_wr_id);
    args[1] = Py_NewRef(WC_SUCCESS);
    args[2] = Py_NewRef(WC_RECV);
    args[3] = GA(qp, s_qpn);
    args[4] = GA(resp, s_off);
    args[5] = PyLong_FromLong(0);
    args[6] = Py_NewRef(NO_WC_FLAGS);
    args[7] = attr == NULL ? NULL : GA(attr, s_dest_qp_num);
    args[8] = PyLong_FromLong(0);
    Py_XDECREF(attr);
    for (int i = 0; i < 9; i++)
        if (args[i] == NULL)
            goto out;
    /* dev.post_cqe(qp.recv_cq, wc, qp, solicited=se) */
    if ((wc = new_wc(args)) == NULL || sn_post_cqe_plain(dev, cq, entries, wc, se) < 0)
        goto out;
    r = 1;
out:
    Py_DECREF(cq);
    Py_XDECREF(entries);
    Py_XDECREF(wqe);
    Py_XDECREF(wc);
    for (int i = 0; i < 9; i++)
        Py_XDECREF(args[i]);
    return r;
}

/* A message's first packet's receive: none under way (``_in_sequence(resp.kind,
   FIRST or ONLY)``), the first receive WQE posted (``qp.rq``, or its SRQ's queue)
   and its target, ``recv_target(dev, qp, wqe)``: *target the view (a new reference
   to the (view, room) pair), *room its room.  1 found, 0 not (a message under way,
   nothing posted, or no target: the general path's), -1 error */
static int first_target(PyObject *dev, PyObject *qp, PyObject *resp, PyObject **target,
                        long long *room)
{
    PyObject *t = GA(resp, s_kind), *posted, *wqe;
    if (t == NULL)
        return -1;
    int under_way = t != Py_None;
    Py_DECREF(t);
    if (under_way)
        return 0;
    if ((t = GA(qp, s_srq)) == NULL)
        return -1;
    posted = t == Py_None ? GA(qp, s_rq) : GA(t, s_queue);
    Py_DECREF(t);
    if (posted == NULL)
        return -1;
    Py_ssize_t nposted = PyObject_Length(posted);
    wqe = nposted > 0 ? PySequence_GetItem(posted, 0) : NULL;
    Py_DECREF(posted);
    if (wqe == NULL)
        return nposted == 0 ? 0 : -1;
    int c = one_sge_target(dev, qp, wqe, &t);
    if (c == 0) {                               /* not its case: the Python's */
        PyObject *rargs[3] = {dev, qp, wqe};
        t = call_responder(s_recv_target, rargs, 3);
    } else if (c < 0)
        t = NULL;
    Py_DECREF(wqe);
    if (t == NULL || t == Py_None) {
        Py_XDECREF(t);
        return t == NULL ? -1 : 0;
    }
    if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 2
        || take_ll(Py_NewRef(PyTuple_GET_ITEM(t, 1)), room) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "recv_target must give (view, room)");
        Py_DECREF(t);
        return -1;
    }
    *target = t;
    return 1;
}

/* receive_send_run(dev, data, o, seg, src): how many datagrams were taken (0:
   nothing changed), -1 error */
static long long send_run(PyObject *dev, PyObject *data, long long o, long long seg,
                          PyObject *src)
{
    PyObject *qp = NULL, *resp = NULL, *target = NULL, *linfo = NULL, *acks_o = NULL,
        *res = NULL;
    long long r = -1;
    int s;
    Py_buffer db, vb;
    db.obj = vb.obj = NULL;
    if (PyObject_GetBuffer(data, &db, PyBUF_SIMPLE) < 0)
        return -1;
    long long n = db.len;
    const uint8_t *d = (const uint8_t *)db.buf;
    if (o < 0 || seg <= 0 || o + seg >= n) {
        r = 0;
        goto out;
    }
    long long flags = d[o + 1], w3 = be32(d + o + 8), mtu, pad = (flags >> PAD_SHIFT_) & PAD_MASK_;
    if ((qp = edge_qp(dev, d + o, src, &mtu)) == NULL) {
        r = PyErr_Occurred() ? -1 : 0;
        goto out;
    }
    /* _size_ok(mtu, FIRST, ...): a whole MTU */
    if (seg - BTH_LEN_ - ICRC_LEN_ - pad != mtu || (resp = GA(qp, s_resp)) == NULL) {
        r = PyErr_Occurred() ? -1 : 0;
        goto out;
    }
    long long room;
    /* none under way, the receive (taken once placed: took_send_run) */
    if ((s = first_target(dev, qp, resp, &target, &room)) <= 0) {
        r = s;
        goto out;
    }
    /* the run's last datagram: its LAST? */
    long long last_at = o + (n - o - 1) / seg * seg, n_last = 0, lflags = 0, hdr = 0;
    PyObject *op = PyLong_FromLong(d[last_at]);
    if (op == NULL)
        goto out;
    linfo = Py_XNewRef(PyDict_GetItemWithError(SEND_EDGE_INFO, op));
    Py_DECREF(op);
    if (linfo == NULL && PyErr_Occurred())
        goto out;
    int is_last = linfo == NULL ? 0 : get_truth(linfo, s_last);
    if (is_last < 0)
        goto out;
    if (is_last && n - last_at < BTH_LEN_)
        is_last = 0;                            /* (too short to be one) */
    if (is_last) {
        if (get_ll(linfo, s_hdr_len, &hdr) < 0)
            goto out;
        lflags = d[last_at + 1];
        n_last = n - last_at - hdr - ICRC_LEN_ - ((lflags >> PAD_SHIFT_) & PAD_MASK_);
        if (n_last < 0 || n_last > mtu)         /* _size_ok(mtu, LAST, n_last) */
            last_at = 0;
    } else {
        last_at = 0;
    }
    long long qpn, psn;
    if (get_ll(qp, s_qpn, &qpn) < 0 || get_ll(resp, s_epsn, &psn) < 0)
        goto out;
    long long w0 = bth_word0((uint32_t)SEND_FIRST_, (uint32_t)((flags & SE_) | pad << PAD_SHIFT_),
                             (uint32_t)DEFAULT_PKEY_);
    long long ext = 0, lw0 = 0;
    uint32_t lstart = 0, fstart, mstart;
    if (last_at) {
        ext = hdr != BTH_LEN_ ? EXT_TAIL_ : 0;
        lw0 = bth_word0(d[last_at], (uint32_t)lflags, (uint32_t)DEFAULT_PKEY_);
        if (rx_start(dev, src, n - last_at, lw0, qpn, &lstart) < 0)
            goto out;
    }
    if (rx_start(dev, src, seg, w0, qpn, &fstart) < 0
        || rx_start(dev, src, seg, W0_SEND_MIDDLE_, qpn, &mstart) < 0)
        goto out;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(target, 0), &vb, PyBUF_WRITABLE) < 0) {
        vb.obj = NULL;
        goto out;
    }
    uint32_t acks[ACKS_MAX + 1];
    /* sn_rx_edge (the FIRST), sn_rx_middles, sn_rx_edge (the LAST) in one call */
    int k = rx_send_run(d, (size_t)n, (size_t)o, (size_t)seg, (uint32_t)qpn, (uint32_t)psn,
                        (uint32_t)w0, fstart, (uint32_t)W0_SEND_MIDDLE_, mstart, (size_t)last_at,
                        (uint32_t)lw0, lstart, (int)ext, (uint64_t)n_last, (uint8_t *)vb.buf,
                        (uint64_t)room, acks + 1, ACKS_MAX, acks);
    PyBuffer_Release(&vb);
    vb.obj = NULL;
    if (k < 0) {
        r = 0;
        goto out;
    }
    long long m = k >> 1, last = k & 1;
    long long tail = last && ext ? be32(d + last_at + BTH_LEN_) : 0;
    PyObject *took = PyObject_GetAttr(responder_module, s_took_send_run);
    if (took == NULL)
        goto out;
    Py_DECREF(took);                            /* (compared, not called) */
    if (took == py_took_send_run) {
        if (took_send_run(dev, qp, resp, (w3 & ACKREQ_) != 0, m, acks,
                          last ? linfo : Py_None, n_last, (lflags & SE_) != 0, tail, mtu) == 0)
            r = 1 + m + last;
        goto out;
    }
    if ((acks_o = PyList_New(acks[0] + 1)) == NULL)
        goto out;
    for (uint32_t i = 0; i <= acks[0]; i++) {
        PyObject *v = PyLong_FromUnsignedLong(acks[i]);
        if (v == NULL)
            goto out;
        PyList_SET_ITEM(acks_o, i, v);
    }
    PyObject *targs[9] = {dev, qp, w3 & ACKREQ_ ? Py_True : Py_False, NULL, acks_o,
                          last ? linfo : Py_None, NULL, lflags & SE_ ? Py_True : Py_False, NULL};
    if ((targs[3] = PyLong_FromLongLong(m)) != NULL
        && (targs[6] = PyLong_FromLongLong(n_last)) != NULL
        && (targs[8] = PyLong_FromLongLong(tail)) != NULL)
        res = call_responder(s_took_send_run, targs, 9);
    Py_XDECREF(targs[3]);
    Py_XDECREF(targs[6]);
    Py_XDECREF(targs[8]);
    if (res != NULL)
        r = 1 + m + last;
out:
    if (vb.obj != NULL)
        PyBuffer_Release(&vb);
    PyBuffer_Release(&db);
    Py_XDECREF(qp);
    Py_XDECREF(resp);
    Py_XDECREF(target);
    Py_XDECREF(linfo);
    Py_XDECREF(acks_o);
    Py_XDECREF(res);
    return r;
}

/* took_send_edge(dev, qp, info, n, True, se, tail) of an ONLY, statement for statement:
   _only_taken (its take_recv and _last the Python's) and _executed (an ONLY begins
   nothing that streams) */
static int took_send_only(PyObject *dev, PyObject *qp, PyObject *resp, PyObject *info,
                          long long n, int se, long long tail)
{
    long long psn;
    if (recv_taken(dev, qp, resp) < 0 || set_ll(resp, s_off, n) < 0
        || get_ll(resp, s_epsn, &psn) < 0
        || last_accepted(dev, qp, resp, info, psn, tail, se) < 0)
        return -1;
    /* _executed(dev, qp, info): nothing if a packet is held out of order */
    int ooo = held_beyond_hole(qp);
    if (ooo != 0)
        return ooo < 0 ? -1 : 0;
    return nothing_held(qp);
}

/* receive_edge(dev, data, src) of a SEND ONLY (plain, with an immediate or an IETH):
   1 taken, 0 not (nothing changed: the general path's), -1 error */
static int send_only(PyObject *dev, PyObject *data, PyObject *src)
{
    PyObject *qp = NULL, *resp = NULL, *target = NULL, *info = NULL;
    int r = -1;
    Py_buffer db, vb;
    db.obj = vb.obj = NULL;
    if (PyObject_GetBuffer(data, &db, PyBUF_SIMPLE) < 0)
        return -1;
    long long size = db.len;
    const uint8_t *d = (const uint8_t *)db.buf;
    if (size < BTH_LEN_ + ICRC_LEN_) {
        r = 0;
        goto out;
    }
    long long op = d[0], flags = d[1], mtu, hdr, pad = (flags >> PAD_SHIFT_) & PAD_MASK_;
    if ((qp = edge_qp(dev, d, src, &mtu)) == NULL) {
        r = PyErr_Occurred() ? -1 : 0;
        goto out;
    }
    PyObject *o = PyLong_FromLongLong(op);                 /* info = _SEND_ONLY_INFO[op] */
    if (o == NULL)
        goto out;
    info = Py_XNewRef(PyDict_GetItemWithError(SEND_ONLY_INFO, o));
    Py_DECREF(o);
    if (info == NULL) {
        if (!PyErr_Occurred())
            r = 0;                              /* (not an ONLY: not this function's) */
        goto out;
    }
    if (get_ll(info, s_hdr_len, &hdr) < 0)
        goto out;
    /* _size_ok(mtu, ONLY, n): at most an MTU */
    long long n = size - hdr - ICRC_LEN_ - pad;
    if (n < 0 || n > mtu || (resp = GA(qp, s_resp)) == NULL) {
        r = PyErr_Occurred() ? -1 : 0;
        goto out;
    }
    long long room, qpn, psn;
    /* none under way, the receive (taken once placed: took_send_only) */
    int s = first_target(dev, qp, resp, &target, &room);
    if (s <= 0) {
        r = s;
        goto out;
    }
    if (get_ll(qp, s_qpn, &qpn) < 0 || get_ll(resp, s_epsn, &psn) < 0)
        goto out;
    long long se = flags & SE_, tail = hdr != BTH_LEN_;
    long long w0 = bth_word0((uint32_t)op, (uint32_t)(se | pad << PAD_SHIFT_),
                             (uint32_t)DEFAULT_PKEY_);
    uint32_t start;
    if (rx_start(dev, src, size, w0, qpn, &start) < 0)
        goto out;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(target, 0), &vb, PyBUF_WRITABLE) < 0) {
        vb.obj = NULL;
        goto out;
    }
    /* kernel_edge(dev, data, src, op, se | pad << PAD_SHIFT, qpn, epsn, ext, view, 0, n, room) */
    int took = rx_edge(d, (size_t)size, (uint32_t)w0, (uint32_t)qpn, (uint32_t)psn, start,
                       tail ? (int)EXT_TAIL_ : 0, (uint8_t *)vb.buf, 0, (uint64_t)n,
                       (uint64_t)room);
    PyBuffer_Release(&vb);
    vb.obj = NULL;
    if (!took) {
        r = 0;
        goto out;
    }
    long long tv = tail ? be32(d + BTH_LEN_) : 0;
    PyObject *f = PyObject_GetAttr(responder_module, s_took_send_edge);
    if (f == NULL)
        goto out;
    if (f == py_took_send_edge) {
        Py_DECREF(f);
        r = took_send_only(dev, qp, resp, info, n, se != 0, tv) < 0 ? -1 : 1;
        goto out;
    }
    PyObject *targs[7] = {dev, qp, info, PyLong_FromLongLong(n), Py_True,
                          se ? Py_True : Py_False, PyLong_FromLongLong(tv)};
    PyObject *res = targs[3] && targs[6] ? PyObject_Vectorcall(f, targs, 7, NULL) : NULL;
    Py_DECREF(f);
    Py_XDECREF(targs[3]);
    Py_XDECREF(targs[6]);
    r = res == NULL ? -1 : 1;
    Py_XDECREF(res);
out:
    if (vb.obj != NULL)
        PyBuffer_Release(&vb);
    PyBuffer_Release(&db);
    Py_XDECREF(qp);
    Py_XDECREF(resp);
    Py_XDECREF(target);
    Py_XDECREF(info);
    return r;
}

/* Is a device method's Python to run (``name`` of the module, where it is not the
   Python's own ``own``: a test's stand-in, a tracer; or where the kernel function the
   compiled one calls, ``fn``, is not hooked in for this device's kernel)?  Then 1, and
   *res is its result for (dev, *args) (NULL: its error); 0: the compiled one runs;
   -1 error (``usage`` the method's, where it was not given ``want`` arguments). */
static int pythons(PyObject *dev, PyObject *name, PyObject *own, const void *fn,
                   PyObject *const *args, Py_ssize_t n, Py_ssize_t want, const char *usage,
                   PyObject **res)
{
    if (n != want) {
        PyErr_Format(PyExc_TypeError, "%s", usage);
        return -1;
    }
    if (responder_module == NULL) {
        PyErr_Format(PyExc_RuntimeError, "%s: responder_setup() not called yet", usage);
        return -1;
    }
    PyObject *f = PyObject_GetAttr(responder_module, name), *kernel = NULL;
    if (f == NULL || (kernel = GA(dev, s_kernel)) == NULL) {
        Py_XDECREF(f);
        return -1;
    }
    Py_DECREF(kernel);                          /* (compared, not used) */
    if (f == own && fn != NULL && kernel == rx_kernel) {
        Py_DECREF(f);
        return 0;
    }
    PyObject *fargs[6] = {dev};
    for (Py_ssize_t i = 0; i < n && i < 5; i++)
        fargs[i + 1] = args[i];
    *res = PyObject_Vectorcall(f, fargs, n + 1, NULL);
    Py_DECREF(f);
    return 1;
}

/* Dispatch._send_only(data, src): the compiled receive_edge of a SEND ONLY where the
   module's is the Python's own and the kernel is hooked in, else the module's */
static PyObject *receive_send_only(PyObject *dev, PyObject *const *args, Py_ssize_t n)
{
    PyObject *res = NULL;
    int p = pythons(dev, s_receive_edge, py_receive_edge, (const void *)rx_edge, args, n, 2,
                    "_send_only(data, src)", &res);
    if (p != 0)
        return p < 0 ? NULL : res;
    int r = send_only(dev, args[0], args[1]);
    return r < 0 ? NULL : Py_NewRef(r ? Py_True : Py_False);
}

/* receive_send_only(dev, data, src), for tests: Dispatch._send_only's compiled one */
static PyObject *receive_send_only_fn(PyObject *mod, PyObject *const *args, Py_ssize_t n)
{
    if (n != 3) {
        PyErr_SetString(PyExc_TypeError, "receive_send_only(dev, data, src)");
        return NULL;
    }
    return receive_send_only(args[0], args + 1, 2);
}

/* receive_send_run(dev, data, o, seg, src): the compiled one where the module's is
   the Python's own and the kernel is hooked in, else the module's */
static PyObject *receive_send_run(PyObject *dev, PyObject *const *args, Py_ssize_t n)
{
    PyObject *res = NULL;
    int p = pythons(dev, s_receive_send_run, py_receive_send_run, (const void *)rx_send_run,
                    args, n, 4, "_send_run(data, o, seg, src)", &res);
    if (p != 0)
        return p < 0 ? NULL : res;
    long long o = PyLong_AsLongLong(args[1]), seg = o == -1 && PyErr_Occurred() ? -1
        : PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    long long r = send_run(dev, args[0], o, seg, args[3]);
    return r < 0 ? NULL : PyLong_FromLongLong(r);
}

/* receive_send_run(dev, data, o, seg, src), for tests */
static PyObject *receive_send_run_fn(PyObject *mod, PyObject *const *args, Py_ssize_t n)
{
    if (n != 5) {
        PyErr_SetString(PyExc_TypeError, "receive_send_run(dev, data, o, seg, src)");
        return NULL;
    }
    return receive_send_run(args[0], args + 1, 4);
}

PyMethodDef sn_responder_dev_methods[] = {
    {"_send_run", (PyCFunction)(void (*)(void))receive_send_run, METH_FASTCALL,
     "Dispatch._send_run(data, o, seg, src): responder.receive_send_run, compiled"},
    {"_send_only", (PyCFunction)(void (*)(void))receive_send_only, METH_FASTCALL,
     "Dispatch._send_only(data, src): responder.receive_edge of a SEND ONLY, compiled"},
    {NULL, NULL, 0, NULL},
};

static int const_of(PyObject *module, const char *name, long long *v)
{
    return take_ll(PyObject_GetAttrString(module, name), v);
}

/* responder_setup(responder, kernel, rx_send_run, rx_edge): the module the compiled
   receive calls into, the loaded kernel (``softnic.accel.Kernel``) and the addresses
   of its sn_rx_send_run and sn_rx_edge (None, 0, 0: the ones given before, if any).
   A device whose ``kernel`` is not that one (none hooked in, a test's wrapper) runs
   the module's Python. */
static PyObject *responder_setup(PyObject *mod, PyObject *const *args, Py_ssize_t n)
{
    if (n != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "responder_setup(responder, kernel, rx_send_run, rx_edge)");
        return NULL;
    }
    PyObject *resp = args[0];
    size_t fn = PyLong_AsSize_t(args[2]), efn = fn == (size_t)-1 ? 0 : PyLong_AsSize_t(args[3]);
    if (PyErr_Occurred())
        return NULL;
    long long acks_per_run;
    Py_XSETREF(responder_module, Py_NewRef(resp));
    Py_XSETREF(py_receive_send_run, PyObject_GetAttr(resp, s_receive_send_run));
    Py_XSETREF(RC, PyObject_GetAttrString(resp, "_RC"));
    Py_XSETREF(RECEIVING, PyObject_GetAttrString(resp, "_RECEIVING"));
    Py_XSETREF(SEND_EDGE_INFO, PyObject_GetAttrString(resp, "_SEND_EDGE_INFO"));
    Py_XSETREF(SEND_ONLY_INFO, PyObject_GetAttrString(resp, "_SEND_ONLY_INFO"));
    Py_XSETREF(py_receive_edge, PyObject_GetAttr(resp, s_receive_edge));
    Py_XSETREF(py_took_send_edge, PyObject_GetAttr(resp, s_took_send_edge));
    if (SEND_ONLY_INFO == NULL || py_receive_edge == NULL || py_took_send_edge == NULL)
        return NULL;
    Py_XSETREF(py_took_send_run, PyObject_GetAttr(resp, s_took_send_run));
    Py_XSETREF(SEND_KIND, PyObject_GetAttrString(resp, "_SEND_KIND"));
    Py_XSETREF(ACK_CREDITS, PyObject_GetAttrString(resp, "ACK_CREDITS"));
    if (py_receive_send_run == NULL || RC == NULL || RECEIVING == NULL || SEND_EDGE_INFO == NULL
        || const_of(resp, "QPN_MASK", &QPN_MASK_) < 0
        || const_of(resp, "_ECN", &ECN_) < 0 || const_of(resp, "DEFAULT_PKEY", &DEFAULT_PKEY_) < 0
        || const_of(resp, "_SEND_FIRST", &SEND_FIRST_) < 0
        || const_of(resp, "_W0_SEND_MIDDLE", &W0_SEND_MIDDLE_) < 0
        || const_of(resp, "EXT_TAIL", &EXT_TAIL_) < 0
        || const_of(resp, "BTH_ACKREQ", &ACKREQ_) < 0 || const_of(resp, "BTH_SE", &SE_) < 0
        || const_of(resp, "BTH_PAD_SHIFT", &PAD_SHIFT_) < 0
        || const_of(resp, "_ACKS_PER_RUN", &acks_per_run) < 0
        || py_took_send_run == NULL || SEND_KIND == NULL || ACK_CREDITS == NULL
        || const_of(resp, "PSN_MASK", &PSN_MASK_) < 0 || const_of(resp, "MSN_MASK", &MSN_MASK_) < 0
        || const_of(resp, "BTH_PAD_MASK", &PAD_MASK_) < 0 || const_of(resp, "BTH_LEN", &BTH_LEN_) < 0
        || const_of(resp, "ICRC_LEN", &ICRC_LEN_) < 0)
        return NULL;
    if (BTH_LEN_ != 12) {
        PyErr_SetString(PyExc_RuntimeError, "responder.c reads the BTH as three 32-bit words");
        return NULL;
    }
    if (acks_per_run != ACKS_MAX || !PyDict_CheckExact(SEND_EDGE_INFO)
        || !PyDict_CheckExact(SEND_ONLY_INFO)) {
        PyErr_SetString(PyExc_RuntimeError, "responder.c: _ACKS_PER_RUN must be 64, "
                        "_SEND_EDGE_INFO and _SEND_ONLY_INFO dicts");
        return NULL;
    }
    Py_XSETREF(py_recv_target, PyObject_GetAttr(resp, s_recv_target));
    Py_XSETREF(py_last, PyObject_GetAttr(resp, s_last_));
    Py_XSETREF(WC_CLASS, PyObject_GetAttrString(resp, "WC"));
    PyObject **wc_names[15] = {&s_wc_wr_id, &s_wc_status, &s_wc_opcode, &s_wc_qp_num,
        &s_wc_byte_len, &s_wc_imm_data, &s_wc_wc_flags, &s_wc_src_qp, &s_wc_invalidated_rkey,
        &s_wc_vendor_err, &s_wc_pkey_index, &s_wc_slid, &s_wc_sl, &s_wc_dlid_path_bits,
        &s_wc_solicited};
    for (int i = 0; i < 15; i++)
        if (*wc_names[i] == NULL && (*wc_names[i] = PyUnicode_InternFromString(WC_FIELDS[i])) == NULL)
            return NULL;
    WC_PLAIN = WC_CLASS != NULL && wc_plain(WC_CLASS);
    Py_XSETREF(WC_SUCCESS, PyObject_GetAttrString(resp, "_WC_SUCCESS"));
    Py_XSETREF(NO_WC_FLAGS, PyObject_GetAttrString(resp, "_NO_WC_FLAGS"));
    Py_XSETREF(MW_CLASS, PyObject_GetAttrString(resp, "MW"));
    PyObject *wco = PyObject_GetAttrString(resp, "WCOpcode");
    Py_XSETREF(WC_RECV, wco ? PyObject_GetAttrString(wco, "RECV") : NULL);
    Py_XDECREF(wco);
    PyObject *acc = PyObject_GetAttrString(resp, "Access"),
        *lw = acc ? PyObject_GetAttrString(acc, "LOCAL_WRITE") : NULL;
    Py_XDECREF(acc);
    if (take_ll(lw ? PyNumber_Index(lw) : NULL, &LOCAL_WRITE_) < 0) {
        Py_XDECREF(lw);
        return NULL;
    }
    Py_DECREF(lw);
    PyObject *memm = PyImport_ImportModule("softnic.core.memory");
    Py_XSETREF(MR_CLASS, memm ? PyObject_GetAttrString(memm, "MR") : NULL);
    Py_XSETREF(KEYTABLE_CLASS, memm ? PyObject_GetAttrString(memm, "KeyTable") : NULL);
    Py_XDECREF(memm);
    if (MR_CLASS == NULL || KEYTABLE_CLASS == NULL)
        return NULL;
    PyObject *devm = PyImport_ImportModule("softnic.core.device"),
        *cqm = devm ? PyImport_ImportModule("softnic.core.cq") : NULL,
        *dc = cqm ? PyObject_GetAttrString(devm, "Device") : NULL,
        *cc = dc ? PyObject_GetAttrString(cqm, "CQ") : NULL;
    Py_XSETREF(py_post_cqe, dc && PyType_Check(dc) ? Py_XNewRef(_PyType_Lookup((PyTypeObject *)dc, s_post_cqe)) : NULL);
    Py_XSETREF(py_push, cc && PyType_Check(cc) ? Py_XNewRef(_PyType_Lookup((PyTypeObject *)cc, s_push)) : NULL);
    Py_XDECREF(devm);
    Py_XDECREF(cqm);
    Py_XDECREF(dc);
    Py_XDECREF(cc);
    if (py_recv_target == NULL || py_last == NULL || WC_CLASS == NULL || WC_SUCCESS == NULL
        || NO_WC_FLAGS == NULL || MW_CLASS == NULL || WC_RECV == NULL || py_post_cqe == NULL
        || py_push == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "responder.c: Device.post_cqe and CQ.push");
        return NULL;
    }
    if (fn && efn && args[1] != Py_None) {  /* (None, 0, 0 leaves the kernel hooked in as it is) */
        rx_send_run = (rx_send_run_fn)fn;
        rx_edge = (rx_edge_fn)efn;
        Py_XSETREF(rx_kernel, Py_NewRef(args[1]));
    }
    return Py_NewRef(Py_None);
}

PyMethodDef sn_responder_methods[] = {
    {"receive_send_run", (PyCFunction)(void (*)(void))receive_send_run_fn, METH_FASTCALL,
     "responder.receive_send_run(dev, data, o, seg, src), compiled"},
    {"receive_send_only", (PyCFunction)(void (*)(void))receive_send_only_fn, METH_FASTCALL,
     "responder.receive_edge(dev, data, src) of a SEND ONLY, compiled"},
    {"responder_setup", (PyCFunction)(void (*)(void))responder_setup, METH_FASTCALL,
     "responder_setup(responder, kernel, rx_send_run, rx_edge): the compiled receive's module "
     "and kernel"},
    {NULL, NULL, 0, NULL},
};

int sn_responder_init(void)
{
    INTERN(s_receive_send_run, "receive_send_run"); INTERN(s_config, "config");
    INTERN(s_check_icrc, "check_icrc"); INTERN(s_qp_type, "qp_type");
    INTERN(s_xrc, "xrc"); INTERN(s_state, "state"); INTERN(s_sr, "sr");
    INTERN(s_ooo, "ooo"); INTERN(s_mtu, "mtu"); INTERN(s_resp, "resp"); INTERN(s_kind, "kind");
    INTERN(s_srq, "srq"); INTERN(s_rq, "rq"); INTERN(s_queue, "queue");
    INTERN(s_recv_target, "recv_target"); INTERN(s_qpn, "qpn"); INTERN(s_epsn, "epsn");
    INTERN(s_rx_starts, "rx_starts"); INTERN(s_rx_icrc_start, "rx_icrc_start");
    INTERN(s_took_send_run, "took_send_run"); INTERN(s_last, "last");
    INTERN(s_hdr_len, "hdr_len"); INTERN(s_kernel, "kernel");
    INTERN(s_rcvd_pkts, "rcvd_pkts"); INTERN(s_ack_deferred, "ack_deferred"); INTERN(s_out, "out");
    INTERN(s_msn, "msn"); INTERN(s_append, "append");
    INTERN(s_nak_sent, "nak_sent"); INTERN(s_naked, "naked"); INTERN(s_scan, "scan");
    INTERN(s_writes, "writes"); INTERN(s_placed, "placed"); INTERN(s_nothing_held, "_nothing_held");
    INTERN(s_take_recv, "take_recv"); INTERN(s_wqe, "wqe"); INTERN(s_off, "off");
    INTERN(s_last_, "_last"); INTERN(s_more_middles, "_more_middles");
    INTERN(s_sges, "sges"); INTERN(s_length, "length"); INTERN(s_keys, "keys");
    INTERN(s_by_key, "_by_key"); INTERN(s_pd, "pd"); INTERN(s_access, "access");
    INTERN(s_valid, "valid"); INTERN(s_addr, "addr"); INTERN(s_view, "view");
    INTERN(s_immdt, "immdt"); INTERN(s_ieth, "ieth"); INTERN(s_recv_cq, "recv_cq");
    INTERN(s_overflowed, "overflowed"); INTERN(s_entries, "entries"); INTERN(s_depth, "depth");
    INTERN(s_armed, "armed"); INTERN(s_mirror, "mirror"); INTERN(s_closed, "closed");
    INTERN(s_rdma_recvs, "rdma_recvs"); INTERN(s_wr_id, "wr_id"); INTERN(s_attr, "attr");
    INTERN(s_dest_qp_num, "dest_qp_num"); INTERN(s_cqes_posted, "cqes_posted");
    INTERN(s_solicited, "solicited"); INTERN(s_post_cqe, "post_cqe"); INTERN(s_push, "push");
    INTERN(s_receive_edge, "receive_edge"); INTERN(s_took_send_edge, "took_send_edge");
    return 0;
}
