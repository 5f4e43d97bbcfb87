/* softnic's librdmacm.so.1: the rdma_cm ABI of rdma-core's librdmacm, over softnic.
 *
 * This side owns what programs read (struct rdma_cm_id, rdma_cm_event,
 * rdma_event_channel, rdma_addrinfo) and, as rdma-core's librdmacm does in user
 * space, moves an id's QP through INIT/RTR/RTS with libibverbs calls (which
 * resolve to softnic's libibverbs.so.1).  Addresses, ids and the connection
 * manager live in backend.py (softnic.driver.rdmacm), reached through callbacks.h.
 *
 * An event channel's fd is an eventfd in semaphore mode counting the events
 * queued for it: rdma_get_cm_event reads one count (blocking, or EAGAIN when
 * the program made the fd non-blocking) without holding the interpreter lock,
 * then takes the event.  Ids created without a channel are synchronous: each
 * gets a channel of its own and the calls wait for their outcome, as in
 * rdma-core.  Entry points not provided are generated stubs (stubs.c) failing
 * with EOPNOTSUPP.  The rsocket API is in rsocket.c, compiled after this file.
 *
 * Preceded (by build.py) by <rdma/rdma_cma.h>, api.h and the static prototypes
 * of the sn_cm_* calls. */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/select.h>
#include <unistd.h>

#define SN_EXPORT __attribute__((visibility("default")))
#define SN_MAX_DEVS 64
#define SN_MAX_RESP 16

static inline int sn_err(int e) { errno = e; return -1; }

struct sn_chan {
    struct rdma_event_channel ch;
    uint32_t h;
};

struct sn_id {
    struct rdma_cm_id id;
    uint32_t h;
    int sync;                          /* no channel given: calls wait for their outcome */
    struct ibv_qp_init_attr *ep_attr;  /* rdma_create_ep (passive): QPs of requests */
    struct ibv_sa_path_rec path;
    uint8_t resp_res, init_depth;
};

struct sn_evt {
    struct rdma_cm_event ev;
    uint8_t pd[256];
};

static pthread_mutex_t sn_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ibv_context *sn_ctx[SN_MAX_DEVS + 1];
static struct ibv_pd *sn_pd[SN_MAX_DEVS];
static int sn_nctx = -1;

static int sn_devices_init(void)
{
    pthread_mutex_lock(&sn_lock);
    if (sn_nctx < 0) {
        int n = 0;
        struct ibv_device **list = ibv_get_device_list(&n);
        sn_nctx = 0;
        for (int i = 0; list && i < n && sn_nctx < SN_MAX_DEVS; i++) {
            struct ibv_context *c = ibv_open_device(list[i]);
            if (c)
                sn_ctx[sn_nctx++] = c;
        }
        sn_ctx[sn_nctx] = NULL;
        if (list)
            ibv_free_device_list(list);
    }
    pthread_mutex_unlock(&sn_lock);
    return sn_nctx;
}

static int sn_ctx_index(const char *name)
{
    sn_devices_init();
    for (int i = 0; i < sn_nctx; i++)
        if (!strcmp(ibv_get_device_name(sn_ctx[i]->device), name))
            return i;
    return -1;
}

static struct ibv_pd *sn_default_pd(int i)
{
    pthread_mutex_lock(&sn_lock);
    if (!sn_pd[i])
        sn_pd[i] = ibv_alloc_pd(sn_ctx[i]);
    pthread_mutex_unlock(&sn_lock);
    return sn_pd[i];
}

static inline struct sn_id *to_sid(struct rdma_cm_id *id)
{
    return (struct sn_id *)id;
}

static inline struct sn_chan *to_chan(struct rdma_event_channel *ch)
{
    return (struct sn_chan *)ch;
}

/* An id's address as the program reads it: a sockaddr_in, or a sockaddr_in6 for an
 * IPv6 device's (family as sn_cm_addr's). */
static void sn_sockaddr_set(struct sockaddr_storage *ss, int family, const uint8_t *ip,
                            uint16_t port)
{
    memset(ss, 0, sizeof *ss);
    if (family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        a->sin6_family = AF_INET6;
        memcpy(&a->sin6_addr, ip, 16);
        a->sin6_port = htons(port);
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)ss;
        a->sin_family = AF_INET;
        memcpy(&a->sin_addr, ip, 4);
        a->sin_port = htons(port);
    }
}

/* Refresh what the program reads of an id: its device, addresses and route. */
static void sn_update(struct sn_id *s)
{
    struct sn_cm_info info;
    memset(&info, 0, sizeof info);
    if (sn_cm_id_info(s->h, &info))
        return;
    struct rdma_cm_id *id = &s->id;
    if (info.has_dev && !id->verbs) {
        int i = sn_ctx_index(info.dev_name);
        if (i >= 0) {
            id->verbs = sn_ctx[i];
            if (!id->pd)
                id->pd = sn_default_pd(i);
        }
    }
    if (info.has_dev)
        id->port_num = 1;
    if (info.has_src)
        sn_sockaddr_set(&id->route.addr.src_storage, info.src_family, info.src_ip,
                        info.src_port);
    if (info.has_dst)
        sn_sockaddr_set(&id->route.addr.dst_storage, info.dst_family, info.dst_ip,
                        info.dst_port);
    memcpy(id->route.addr.addr.ibaddr.sgid.raw, info.sgid, 16);
    memcpy(id->route.addr.addr.ibaddr.dgid.raw, info.dgid, 16);
    id->route.addr.addr.ibaddr.pkey = htons(0xFFFF);
    if (info.routed && info.has_dst) {
        struct ibv_sa_path_rec *p = &s->path;
        memset(p, 0, sizeof *p);
        memcpy(p->sgid.raw, info.sgid, 16);
        memcpy(p->dgid.raw, info.dgid, 16);
        p->pkey = htons(0xFFFF);
        p->hop_limit = 64;
        p->mtu = IBV_MTU_4096;
        p->mtu_selector = 2;
        p->rate = 3;
        p->rate_selector = 2;
        p->packet_life_time = 14;
        p->packet_life_time_selector = 2;
        p->reversible = 1;
        p->numb_path = 1;
        id->route.path_rec = p;
        id->route.num_paths = 1;
    }
}

/* ------------------------------------------------------------------ channels */

/* A destroyed channel's fd number is not closed but made a never-ready eventfd:
 * programs (rping) destroy the channel while another thread of theirs is about to
 * wait on it again; with the kernel's rdma_cm fd that thread just stays blocked, and
 * so it does here, where a closed (or reused) fd number would fail it or hand it
 * another file's data.  The cost is one descriptor per destroyed channel. */
static void sn_park_fd(int fd)
{
    static int parked = -1;
    pthread_mutex_lock(&sn_lock);
    if (parked < 0)
        parked = eventfd(0, EFD_CLOEXEC);
    pthread_mutex_unlock(&sn_lock);
    if (parked < 0 || dup3(parked, fd, O_CLOEXEC) < 0)
        close(fd);
}

SN_EXPORT struct rdma_event_channel *rdma_create_event_channel(void)
{
    struct sn_chan *c = calloc(1, sizeof *c);
    if (!c) {
        errno = ENOMEM;
        return NULL;
    }
    c->ch.fd = eventfd(0, EFD_SEMAPHORE | EFD_CLOEXEC);
    if (c->ch.fd < 0) {
        free(c);
        return NULL;
    }
    int r = sn_cm_create_channel(c->ch.fd, &c->h);
    if (r) {
        close(c->ch.fd);
        free(c);
        errno = r;
        return NULL;
    }
    return &c->ch;
}

SN_EXPORT void rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
    if (!channel)
        return;
    struct sn_chan *c = to_chan(channel);
    sn_cm_destroy_channel(c->h);
    sn_park_fd(c->ch.fd);
    /* not freed: a thread of the program may still wait in rdma_get_cm_event on it
     * (rping's CM thread does, as its main thread tears down), and goes on waiting,
     * on the parked fd, as on the kernel's */
}

/* ------------------------------------------------------------------ ids */

static struct sn_id *sn_alloc_id(struct rdma_event_channel *channel, void *context,
                                 enum rdma_port_space ps, enum ibv_qp_type qp_type)
{
    struct sn_id *s = calloc(1, sizeof *s);
    if (!s) {
        errno = ENOMEM;
        return NULL;
    }
    if (!channel) {
        channel = rdma_create_event_channel();
        if (!channel) {
            free(s);
            return NULL;
        }
        s->sync = 1;
    }
    s->id.channel = channel;
    s->id.context = context;
    s->id.ps = ps;
    s->id.qp_type = qp_type;
    s->resp_res = s->init_depth = SN_MAX_RESP;
    return s;
}

static void sn_free_id(struct sn_id *s)
{
    if (s->sync)
        rdma_destroy_event_channel(s->id.channel);
    free(s->ep_attr);
    free(s);
}

static int sn_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id,
                        void *context, enum rdma_port_space ps, enum ibv_qp_type qp_type)
{
    if (!id)
        return sn_err(EINVAL);
    sn_devices_init();
    struct sn_id *s = sn_alloc_id(channel, context, ps, qp_type);
    if (!s)
        return -1;
    int r = sn_cm_create_id(to_chan(s->id.channel)->h, s, ps, qp_type, &s->h);
    if (r) {
        sn_free_id(s);
        return sn_err(r);
    }
    *id = &s->id;
    return 0;
}

SN_EXPORT int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id,
                             void *context, enum rdma_port_space ps)
{
    enum ibv_qp_type t = (ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB) ? IBV_QPT_UD : IBV_QPT_RC;
    return sn_create_id(channel, id, context, ps, t);
}

SN_EXPORT int rdma_ack_cm_event(struct rdma_cm_event *event)
{
    if (!event)
        return sn_err(EINVAL);
    free(event);
    return 0;
}

SN_EXPORT int rdma_destroy_id(struct rdma_cm_id *id)
{
    if (!id)
        return sn_err(EINVAL);
    struct sn_id *s = to_sid(id);
    sn_cm_destroy_id(s->h);
    if (id->event) {
        rdma_ack_cm_event(id->event);
        id->event = NULL;
    }
    sn_free_id(s);
    return 0;
}

SN_EXPORT int rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *channel)
{
    if (!id)
        return sn_err(EINVAL);
    struct sn_id *s = to_sid(id);
    int sync = 0;
    if (!channel) {
        channel = rdma_create_event_channel();
        if (!channel)
            return -1;
        sync = 1;
    }
    int r = sn_cm_migrate_id(s->h, to_chan(channel)->h);
    if (r) {
        if (sync)
            rdma_destroy_event_channel(channel);
        return sn_err(r);
    }
    if (s->sync)
        rdma_destroy_event_channel(id->channel);
    s->sync = sync;
    id->channel = channel;
    return 0;
}

/* ------------------------------------------------------------------ events */

static void sn_qp_attr(struct sn_cm_qp_attr *a, struct ibv_qp_attr *q)
{
    memset(q, 0, sizeof *q);
    q->qp_state = a->qp_state;
    q->path_mtu = a->path_mtu;
    q->qkey = a->qkey;
    q->rq_psn = a->rq_psn;
    q->sq_psn = a->sq_psn;
    q->dest_qp_num = a->dest_qp_num;
    q->qp_access_flags = a->qp_access_flags;
    q->pkey_index = a->pkey_index;
    q->port_num = a->port_num;
    q->max_rd_atomic = a->max_rd_atomic;
    q->max_dest_rd_atomic = a->max_dest_rd_atomic;
    q->min_rnr_timer = a->min_rnr_timer;
    q->timeout = a->timeout;
    q->retry_cnt = a->retry_cnt;
    q->rnr_retry = a->rnr_retry;
    memcpy(q->ah_attr.grh.dgid.raw, a->dgid, 16);
    q->ah_attr.grh.hop_limit = a->hop_limit;
    q->ah_attr.grh.sgid_index = 0;
    q->ah_attr.is_global = 1;
    q->ah_attr.port_num = a->port_num ? a->port_num : 1;
}

SN_EXPORT int rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *qp_attr,
                                int *qp_attr_mask)
{
    if (!id || !qp_attr || !qp_attr_mask)
        return sn_err(EINVAL);
    struct sn_cm_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = qp_attr->qp_state;
    int r = sn_cm_init_qp_attr(to_sid(id)->h, &a, qp_attr_mask);
    if (r)
        return sn_err(r);
    sn_qp_attr(&a, qp_attr);
    return 0;
}

static int sn_modify(struct rdma_cm_id *id, enum ibv_qp_state state, int resp_res, int depth)
{
    struct ibv_qp_attr q;
    int mask;
    if (!id->qp)
        return 0;
    q.qp_state = state;
    if (rdma_init_qp_attr(id, &q, &mask))
        return -1;
    if (state == IBV_QPS_RTR && resp_res >= 0)
        q.max_dest_rd_atomic = resp_res;
    if (state == IBV_QPS_RTS && depth >= 0)
        q.max_rd_atomic = depth;
    int r = ibv_modify_qp(id->qp, &q, mask);
    return r ? sn_err(r) : 0;
}

static int sn_modify_err(struct rdma_cm_id *id)
{
    struct ibv_qp_attr q;
    if (!id->qp)
        return 0;
    memset(&q, 0, sizeof q);
    q.qp_state = IBV_QPS_ERR;
    int r = ibv_modify_qp(id->qp, &q, IBV_QP_STATE);
    return r ? sn_err(r) : 0;
}

static int sn_is_ud(struct rdma_cm_id *id)
{
    return id->qp_type == IBV_QPT_UD;
}

static void sn_ud_ah(struct rdma_cm_id *id, struct ibv_ah_attr *ah)
{
    memset(ah, 0, sizeof *ah);
    ah->is_global = 1;
    ah->grh.dgid = id->route.addr.addr.ibaddr.dgid;
    ah->grh.hop_limit = 64;
    ah->port_num = 1;
}

SN_EXPORT int rdma_get_cm_event(struct rdma_event_channel *channel,
                                struct rdma_cm_event **event)
{
    if (!channel || !event)
        return sn_err(EINVAL);
    struct sn_chan *c = to_chan(channel);
    struct sn_cm_event e;
    int r;
    /* The channel's fd counts its events; the Python side reads a count as it
     * takes the event (EventChannel.take), so here a blocking channel waits for
     * the fd to be readable and never reads it itself. */
    int fl = fcntl(c->ch.fd, F_GETFL);
    for (;;) {
        if (fl >= 0 && !(fl & O_NONBLOCK)) {
            struct pollfd p = {c->ch.fd, POLLIN, 0};
            /* a Python host (pyverbs) may call with the interpreter lock held: let
             * the progress threads run while this waits */
            void *gil = sn_gil_release();
            int n = poll(&p, 1, -1);
            int err = errno;
            sn_gil_restore(gil);
            if (n < 0 && err == EINTR)
                continue;
            if (n < 0) {
                errno = err;
                return -1;
            }
        }
        memset(&e, 0, sizeof e);
        r = sn_cm_get_event(c->h, &e);
        if (r == EAGAIN && fl >= 0 && !(fl & O_NONBLOCK))
            continue;                   /* another thread took it first: wait again */
        break;
    }
    if (r)
        return sn_err(r);               /* EAGAIN on a non-blocking channel */
    struct sn_evt *evt = calloc(1, sizeof *evt);
    if (!evt)
        return sn_err(ENOMEM);
    struct sn_id *s = e.id_cookie;
    if (e.is_new) {
        struct sn_id *l = e.listen_cookie;
        s = sn_alloc_id(l->sync ? NULL : l->id.channel, l->id.context, l->id.ps,
                        l->id.qp_type);
        if (!s) {
            free(evt);
            return -1;
        }
        s->h = e.id;
        sn_cm_set_cookie(e.id, s);
        if (s->sync)
            sn_cm_migrate_id(e.id, to_chan(s->id.channel)->h);
        s->resp_res = e.responder_resources;
        s->init_depth = e.initiator_depth;
        evt->ev.listen_id = &l->id;
    }
    if (!s) {                                /* an id destroyed before its event came */
        free(evt);
        return sn_err(EAGAIN);
    }
    struct rdma_cm_id *id = &s->id;
    evt->ev.id = id;
    evt->ev.event = e.event;
    evt->ev.status = e.status;
    memcpy(evt->pd, e.private_data, e.private_data_len);
    sn_update(s);
    if (sn_is_ud(id)) {
        evt->ev.param.ud.private_data = e.private_data_len ? evt->pd : NULL;
        evt->ev.param.ud.private_data_len = e.private_data_len;
        evt->ev.param.ud.qp_num = e.qp_num;
        evt->ev.param.ud.qkey = e.qkey;
        sn_ud_ah(id, &evt->ev.param.ud.ah_attr);
        if (e.event == RDMA_CM_EVENT_MULTICAST_JOIN) {
            memcpy(evt->ev.param.ud.ah_attr.grh.dgid.raw, e.mgid, 16);
            /* as librdmacm's ucma_process_join: the id's QP joins the group */
            if (id->qp && (r = ibv_attach_mcast(id->qp, &evt->ev.param.ud.ah_attr.grh.dgid,
                                                0)) != 0) {
                evt->ev.event = RDMA_CM_EVENT_MULTICAST_ERROR;
                evt->ev.status = -r;
            }
        }
    } else {
        struct rdma_conn_param *p = &evt->ev.param.conn;
        p->private_data = e.private_data_len ? evt->pd : NULL;
        p->private_data_len = e.private_data_len;
        p->responder_resources = e.responder_resources;
        p->initiator_depth = e.initiator_depth;
        p->retry_count = e.retry_count;
        p->rnr_retry_count = e.rnr_retry_count;
        p->srq = e.srq;
        p->qp_num = e.qp_num;
    }
    switch (e.event) {
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
        if (id->qp) {
            /* as rdma-core: the QP to RTR and RTS, then the RTU */
            if (sn_modify(id, IBV_QPS_RTR, -1, -1) || sn_modify(id, IBV_QPS_RTS, -1, -1)
                    || (r = sn_cm_establish(s->h)) != 0) {
                evt->ev.event = RDMA_CM_EVENT_CONNECT_ERROR;
                evt->ev.status = -(r ? r : errno);
                sn_modify_err(id);
                sn_cm_reject(s->h, NULL, 0);
            } else {
                evt->ev.event = RDMA_CM_EVENT_ESTABLISHED;
            }
        }
        break;
    case RDMA_CM_EVENT_REJECTED:
        sn_modify_err(id);
        break;
    default:
        break;
    }
    *event = &evt->ev;
    return 0;
}

/* For a synchronous id: wait for the event the call led to (rdma-core's ucma_complete). */
static int sn_complete(struct rdma_cm_id *id)
{
    struct sn_id *s = to_sid(id);
    if (!s->sync)
        return 0;
    if (id->event) {
        rdma_ack_cm_event(id->event);
        id->event = NULL;
    }
    if (rdma_get_cm_event(id->channel, &id->event))
        return -1;
    struct rdma_cm_event *ev = id->event;
    if (ev->status) {
        if (ev->event == RDMA_CM_EVENT_REJECTED)
            return sn_err(ECONNREFUSED);
        return sn_err(ev->status < 0 ? -ev->status : ev->status);
    }
    if (ev->event == RDMA_CM_EVENT_REJECTED)
        return sn_err(ECONNREFUSED);
    return 0;
}

/* ------------------------------------------------------------------ addresses */

static int sn_addr(const struct sockaddr *sa, struct sn_cm_addr *a)
{
    memset(a, 0, sizeof *a);
    if (!sa)
        return 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        a->family = 2;
        memcpy(a->ip, &in->sin_addr, 4);
        a->port = ntohs(in->sin_port);
        return 0;
    }
    if (sa->sa_family == AF_INET6) {       /* (an IPv4-mapped one names an IPv4 device) */
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        a->family = 10;
        memcpy(a->ip, in6->sin6_addr.s6_addr, 16);
        a->port = ntohs(in6->sin6_port);
        return 0;
    }
    return EAFNOSUPPORT;
}

SN_EXPORT int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
    if (!id || !addr)
        return sn_err(EINVAL);
    struct sn_cm_addr a;
    int r = sn_addr(addr, &a);
    if (!r)
        r = sn_cm_bind(to_sid(id)->h, &a);
    if (r)
        return sn_err(r);
    sn_update(to_sid(id));
    return 0;
}

SN_EXPORT int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr,
                                struct sockaddr *dst_addr, int timeout_ms)
{
    (void)timeout_ms;
    if (!id || !dst_addr)
        return sn_err(EINVAL);
    struct sn_cm_addr s, d;
    int r = sn_addr(src_addr, &s);
    if (!r)
        r = sn_addr(dst_addr, &d);
    if (!r)
        r = sn_cm_resolve_addr(to_sid(id)->h, &s, &d);
    if (r)
        return sn_err(r);
    sn_update(to_sid(id));
    return sn_complete(id);
}

SN_EXPORT int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
    (void)timeout_ms;
    if (!id)
        return sn_err(EINVAL);
    int r = sn_cm_resolve_route(to_sid(id)->h);
    if (r)
        return sn_err(r);
    sn_update(to_sid(id));
    return sn_complete(id);
}

SN_EXPORT __be16 rdma_get_src_port(struct rdma_cm_id *id)
{
    return id->route.addr.src_sin.sin_port;
}

SN_EXPORT __be16 rdma_get_dst_port(struct rdma_cm_id *id)
{
    return id->route.addr.dst_sin.sin_port;
}

SN_EXPORT struct ibv_context **rdma_get_devices(int *num_devices)
{
    int n = sn_devices_init();
    struct ibv_context **list = calloc(n + 1, sizeof *list);
    if (!list) {
        errno = ENOMEM;
        return NULL;
    }
    memcpy(list, sn_ctx, n * sizeof *list);
    if (num_devices)
        *num_devices = n;
    return list;
}

SN_EXPORT void rdma_free_devices(struct ibv_context **list)
{
    free(list);
}

/* ------------------------------------------------------------------ QPs */

static int sn_create_cqs(struct rdma_cm_id *id, uint32_t send_size, uint32_t recv_size)
{
    if (recv_size) {
        id->recv_cq_channel = ibv_create_comp_channel(id->verbs);
        if (!id->recv_cq_channel)
            return -1;
        id->recv_cq = ibv_create_cq(id->verbs, recv_size, id, id->recv_cq_channel, 0);
        if (!id->recv_cq)
            return -1;
    }
    if (send_size) {
        id->send_cq_channel = ibv_create_comp_channel(id->verbs);
        if (!id->send_cq_channel)
            return -1;
        id->send_cq = ibv_create_cq(id->verbs, send_size, id, id->send_cq_channel, 0);
        if (!id->send_cq)
            return -1;
    }
    return 0;
}

static void sn_destroy_cqs(struct rdma_cm_id *id)
{
    if (id->qp && (id->qp->send_cq == id->send_cq || id->qp->recv_cq == id->recv_cq))
        return;
    if (id->recv_cq) {
        ibv_destroy_cq(id->recv_cq);
        if (id->send_cq == id->recv_cq)
            id->send_cq = NULL;
        id->recv_cq = NULL;
    }
    if (id->recv_cq_channel) {
        ibv_destroy_comp_channel(id->recv_cq_channel);
        if (id->send_cq_channel == id->recv_cq_channel)
            id->send_cq_channel = NULL;
        id->recv_cq_channel = NULL;
    }
    if (id->send_cq) {
        ibv_destroy_cq(id->send_cq);
        id->send_cq = NULL;
    }
    if (id->send_cq_channel) {
        ibv_destroy_comp_channel(id->send_cq_channel);
        id->send_cq_channel = NULL;
    }
}

SN_EXPORT int rdma_create_qp_ex(struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *attr)
{
    if (!id || !attr || id->qp)
        return sn_err(EINVAL);
    if (!id->verbs)
        return sn_err(EINVAL);
    if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
        attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
        attr->pd = id->pd;
    } else if (attr->pd->context != id->verbs) {
        return sn_err(EINVAL);
    }
    if (!attr->pd)
        return sn_err(EINVAL);
    if ((id->recv_cq && attr->recv_cq && id->recv_cq != attr->recv_cq) ||
        (id->send_cq && attr->send_cq && id->send_cq != attr->send_cq))
        return sn_err(EINVAL);
    if (sn_create_cqs(id, attr->send_cq || id->send_cq ? 0 : attr->cap.max_send_wr,
                      attr->recv_cq || id->recv_cq ? 0 : attr->cap.max_recv_wr)) {
        int e = errno;
        sn_destroy_cqs(id);
        return sn_err(e);
    }
    if (!attr->send_cq)
        attr->send_cq = id->send_cq;
    if (!attr->recv_cq)
        attr->recv_cq = id->recv_cq;
    if (id->srq && !attr->srq)
        attr->srq = id->srq;
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof ia);
    ia.qp_context = attr->qp_context;
    ia.send_cq = attr->send_cq;
    ia.recv_cq = attr->recv_cq;
    ia.srq = attr->srq;
    ia.cap = attr->cap;
    ia.qp_type = attr->qp_type;
    ia.sq_sig_all = attr->sq_sig_all;
    struct ibv_qp *qp = ibv_create_qp(attr->pd, &ia);
    if (!qp) {
        int e = errno;
        sn_destroy_cqs(id);
        return sn_err(e ? e : ENOMEM);
    }
    attr->cap = ia.cap;
    id->qp = qp;
    /* INIT (and, for UD, RTR and RTS), as rdma-core's ucma_init_conn_qp / _ud_qp */
    int r = 0;
    if (sn_is_ud(id) || attr->qp_type == IBV_QPT_UD) {
        r = sn_modify(id, IBV_QPS_INIT, -1, -1);
        if (!r)
            r = sn_modify(id, IBV_QPS_RTR, -1, -1);
        if (!r)
            r = sn_modify(id, IBV_QPS_RTS, -1, -1);
    } else {
        r = sn_modify(id, IBV_QPS_INIT, -1, -1);
    }
    if (r) {
        int e = errno;
        id->qp = NULL;
        ibv_destroy_qp(qp);
        sn_destroy_cqs(id);
        return sn_err(e);
    }
    id->pd = qp->pd;
    return 0;
}

SN_EXPORT int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd,
                             struct ibv_qp_init_attr *qp_init_attr)
{
    if (!id || !qp_init_attr)
        return sn_err(EINVAL);
    struct ibv_qp_init_attr_ex ex;
    memset(&ex, 0, sizeof ex);
    memcpy(&ex, qp_init_attr, sizeof *qp_init_attr);
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    ex.pd = pd ? pd : id->pd;
    int r = rdma_create_qp_ex(id, &ex);
    memcpy(qp_init_attr, &ex, sizeof *qp_init_attr);
    return r;
}

SN_EXPORT void rdma_destroy_qp(struct rdma_cm_id *id)
{
    if (!id || !id->qp)
        return;
    ibv_destroy_qp(id->qp);
    id->qp = NULL;
    sn_destroy_cqs(id);
}

SN_EXPORT int rdma_create_srq_ex(struct rdma_cm_id *id, struct ibv_srq_init_attr_ex *attr)
{
    if (!id || !attr || !id->verbs)
        return sn_err(EINVAL);
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE))
        return sn_err(EINVAL);
    if (attr->srq_type != IBV_SRQT_BASIC)
        return sn_err(EOPNOTSUPP);
    struct ibv_pd *pd = (attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) && attr->pd ? attr->pd : id->pd;
    struct ibv_srq_init_attr ia;
    memset(&ia, 0, sizeof ia);
    ia.srq_context = attr->srq_context;
    ia.attr = attr->attr;
    struct ibv_srq *srq = ibv_create_srq(pd, &ia);
    if (!srq)
        return -1;
    if (!id->pd)
        id->pd = pd;
    id->srq = srq;
    return 0;
}

SN_EXPORT int rdma_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd,
                              struct ibv_srq_init_attr *attr)
{
    if (!id || !attr)
        return sn_err(EINVAL);
    struct ibv_srq_init_attr_ex ex;
    memset(&ex, 0, sizeof ex);
    memcpy(&ex, attr, sizeof *attr);
    ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
    ex.srq_type = IBV_SRQT_BASIC;
    ex.pd = pd;
    int r = rdma_create_srq_ex(id, &ex);
    memcpy(attr, &ex, sizeof *attr);
    return r;
}

SN_EXPORT int rdma_destroy_srq(struct rdma_cm_id *id)
{
    if (!id || !id->srq)
        return sn_err(EINVAL);
    int r = ibv_destroy_srq(id->srq);
    if (r)
        return sn_err(r);
    id->srq = NULL;
    return 0;
}

/* ------------------------------------------------------------------ connections */

static void sn_param(struct sn_id *s, struct rdma_conn_param *p, struct sn_cm_param *out,
                     int accepting)
{
    memset(out, 0, sizeof *out);
    out->retry_count = 7;
    out->rnr_retry_count = 7;
    uint8_t rr = accepting ? s->resp_res : SN_MAX_RESP, id = accepting ? s->init_depth : SN_MAX_RESP;
    if (p) {
        if (p->responder_resources != RDMA_MAX_RESP_RES)
            rr = p->responder_resources;
        if (p->initiator_depth != RDMA_MAX_INIT_DEPTH)
            id = p->initiator_depth;
        out->retry_count = p->retry_count;
        out->rnr_retry_count = p->rnr_retry_count;
        out->qp_num = p->qp_num;
        out->srq = p->srq;
        if (p->private_data && p->private_data_len) {
            memcpy(out->private_data, p->private_data, p->private_data_len);
            out->private_data_len = p->private_data_len;
        }
    }
    if (rr > SN_MAX_RESP)
        rr = SN_MAX_RESP;
    if (id > SN_MAX_RESP)
        id = SN_MAX_RESP;
    out->responder_resources = rr;
    out->initiator_depth = id;
    if (s->id.qp) {
        out->qp_num = s->id.qp->qp_num;
        out->srq = s->id.qp->srq != NULL;
    }
}

SN_EXPORT int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
    if (!id)
        return sn_err(EINVAL);
    if (id->ps == RDMA_PS_TCP && !id->qp && !conn_param)
        return sn_err(EINVAL);
    struct sn_id *s = to_sid(id);
    struct sn_cm_param p;
    sn_param(s, conn_param, &p, 0);
    s->resp_res = p.responder_resources;
    s->init_depth = p.initiator_depth;
    int r = sn_cm_connect(s->h, &p);
    if (r)
        return sn_err(r);
    return sn_complete(id);
}

SN_EXPORT int rdma_establish(struct rdma_cm_id *id)
{
    if (!id)
        return sn_err(EINVAL);
    int r = sn_cm_establish(to_sid(id)->h);
    return r ? sn_err(r) : 0;
}

SN_EXPORT int rdma_listen(struct rdma_cm_id *id, int backlog)
{
    if (!id)
        return sn_err(EINVAL);
    int r = sn_cm_listen(to_sid(id)->h, backlog);
    if (r)
        return sn_err(r);
    sn_update(to_sid(id));
    return 0;
}

SN_EXPORT int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **id)
{
    if (!listen || !id)
        return sn_err(EINVAL);
    struct sn_id *l = to_sid(listen);
    if (!l->sync)
        return sn_err(EINVAL);
    if (listen->event) {
        rdma_ack_cm_event(listen->event);
        listen->event = NULL;
    }
    struct rdma_cm_event *ev;
    if (rdma_get_cm_event(listen->channel, &ev))
        return -1;
    int err = 0;
    if (ev->event == RDMA_CM_EVENT_REJECTED)
        err = ECONNREFUSED;
    else if (ev->status)
        err = ev->status < 0 ? -ev->status : ev->status;
    else if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST)
        err = EINVAL;
    if (!err && l->ep_attr) {
        struct ibv_qp_init_attr attr = *l->ep_attr;
        if (rdma_create_qp(ev->id, listen->pd, &attr))
            err = errno;
    }
    if (err) {
        listen->event = ev;
        return sn_err(err);
    }
    *id = ev->id;
    (*id)->event = ev;
    return 0;
}

SN_EXPORT int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
    if (!id)
        return sn_err(EINVAL);
    if (!id->qp && !conn_param && id->ps == RDMA_PS_TCP)
        return sn_err(EINVAL);
    struct sn_id *s = to_sid(id);
    struct sn_cm_param p;
    sn_param(s, conn_param, &p, 1);
    if (!sn_is_ud(id)) {
        if (sn_modify(id, IBV_QPS_RTR, p.responder_resources, -1)
                || sn_modify(id, IBV_QPS_RTS, -1, p.initiator_depth))
            return -1;
    } else if (id->qp) {
        struct ibv_qp_attr q;
        struct ibv_qp_init_attr ia;
        if (!ibv_query_qp(id->qp, &q, IBV_QP_QKEY, &ia))
            p.qkey = q.qkey;
    }
    int r = sn_cm_accept(s->h, &p);
    if (r) {
        sn_modify_err(id);
        return sn_err(r);
    }
    if (sn_is_ud(id)) {
        if (s->sync && id->event) {
            rdma_ack_cm_event(id->event);
            id->event = NULL;
        }
        return 0;
    }
    return sn_complete(id);
}

SN_EXPORT int rdma_reject(struct rdma_cm_id *id, const void *private_data,
                          uint8_t private_data_len)
{
    if (!id)
        return sn_err(EINVAL);
    uint8_t buf[256];
    memset(buf, 0, sizeof buf);
    if (private_data && private_data_len)
        memcpy(buf, private_data, private_data_len);
    int r = sn_cm_reject(to_sid(id)->h, buf, private_data ? private_data_len : 0);
    return r ? sn_err(r) : 0;
}

SN_EXPORT int rdma_reject_ece(struct rdma_cm_id *id, const void *private_data,
                              uint8_t private_data_len)
{
    return rdma_reject(id, private_data, private_data_len);
}

SN_EXPORT int rdma_disconnect(struct rdma_cm_id *id)
{
    if (!id || !id->verbs)
        return sn_err(EINVAL);
    if (sn_modify_err(id))
        return -1;
    int r = sn_cm_disconnect(to_sid(id)->h);
    if (r)
        return sn_err(r);
    return sn_complete(id);
}

/* ------------------------------------------------------------------ multicast */

static int sn_join(struct rdma_cm_id *id, struct sockaddr *addr)
{
    if (!id || !addr)
        return sn_err(EINVAL);
    struct sn_cm_addr a;
    int r = sn_addr(addr, &a);
    if (r)
        return sn_err(r);
    r = sn_cm_join(to_sid(id)->h, &a);
    return r ? sn_err(r) : 0;
}

SN_EXPORT int rdma_join_multicast(struct rdma_cm_id *id, struct sockaddr *addr, void *context)
{
    (void)context;
    return sn_join(id, addr);
}

SN_EXPORT int rdma_join_multicast_ex(struct rdma_cm_id *id, struct rdma_cm_join_mc_attr_ex *mc_join_attr,
                                     void *context)
{
    (void)context;
    if (!id || !mc_join_attr)
        return sn_err(EINVAL);
    /* as librdmacm: the address and the join flags are required, and a flag it knows */
    if (!(mc_join_attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS)
            || !(mc_join_attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS)
            || mc_join_attr->comp_mask > (RDMA_CM_JOIN_MC_ATTR_ADDRESS
                                          | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS))
        return sn_err(EINVAL);
    if (mc_join_attr->join_flags != RDMA_MC_JOIN_FLAG_FULLMEMBER
            && mc_join_attr->join_flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER)
        return sn_err(EINVAL);
    return sn_join(id, mc_join_attr->addr);
}

SN_EXPORT int rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr)
{
    if (!id || !addr)
        return sn_err(EINVAL);
    struct sn_cm_addr a;
    int r = sn_addr(addr, &a);
    if (r)
        return sn_err(r);
    union ibv_gid mgid;
    r = sn_cm_leave(to_sid(id)->h, &a, mgid.raw);
    if (r)
        return sn_err(r);
    if (id->qp)
        ibv_detach_mcast(id->qp, &mgid, 0);
    return 0;
}

SN_EXPORT int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event)
{
    (void)event;
    return id ? 0 : sn_err(EINVAL);
}

SN_EXPORT int rdma_set_option(struct rdma_cm_id *id, int level, int optname, void *optval,
                              size_t optlen)
{
    if (!id || (optlen && !optval))
        return sn_err(EINVAL);
    if (level == RDMA_OPTION_ID) {
        switch (optname) {
        case RDMA_OPTION_ID_TOS:
        case RDMA_OPTION_ID_REUSEADDR:
        case RDMA_OPTION_ID_AFONLY:
            return 0;
        case RDMA_OPTION_ID_ACK_TIMEOUT:
            if (optlen != sizeof(uint8_t))
                return sn_err(EINVAL);
            return sn_cm_set_ack_timeout(to_sid(id)->h, *(uint8_t *)optval) ? sn_err(EINVAL) : 0;
        }
    }
    return sn_err(ENOSYS);
}

SN_EXPORT int rdma_set_local_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
    return (!id || !ece) ? sn_err(EINVAL) : sn_err(EOPNOTSUPP);
}

SN_EXPORT int rdma_get_remote_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
    if (!id || !ece)
        return sn_err(EINVAL);
    memset(ece, 0, sizeof *ece);
    return 0;
}

SN_EXPORT const char *rdma_event_str(enum rdma_cm_event_type event)
{
    static const char *names[] = {
        "RDMA_CM_EVENT_ADDR_RESOLVED", "RDMA_CM_EVENT_ADDR_ERROR",
        "RDMA_CM_EVENT_ROUTE_RESOLVED", "RDMA_CM_EVENT_ROUTE_ERROR",
        "RDMA_CM_EVENT_CONNECT_REQUEST", "RDMA_CM_EVENT_CONNECT_RESPONSE",
        "RDMA_CM_EVENT_CONNECT_ERROR", "RDMA_CM_EVENT_UNREACHABLE",
        "RDMA_CM_EVENT_REJECTED", "RDMA_CM_EVENT_ESTABLISHED",
        "RDMA_CM_EVENT_DISCONNECTED", "RDMA_CM_EVENT_DEVICE_REMOVAL",
        "RDMA_CM_EVENT_MULTICAST_JOIN", "RDMA_CM_EVENT_MULTICAST_ERROR",
        "RDMA_CM_EVENT_ADDR_CHANGE", "RDMA_CM_EVENT_TIMEWAIT_EXIT",
    };
    if ((unsigned)event < sizeof names / sizeof names[0])
        return names[event];
    return "UNKNOWN EVENT";
}

/* ------------------------------------------------------------------ endpoints */

SN_EXPORT int rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res,
                             struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)
{
    if (!id || !res)
        return sn_err(EINVAL);
    struct rdma_cm_id *cm_id;
    if (sn_create_id(NULL, &cm_id, NULL, res->ai_port_space, res->ai_qp_type))
        return -1;
    struct sn_id *s = to_sid(cm_id);
    int e = 0;
    if (res->ai_flags & RAI_PASSIVE) {
        if (rdma_bind_addr(cm_id, res->ai_src_addr)) {
            e = errno;
            goto err;
        }
        if (pd)
            cm_id->pd = pd;
        if (qp_init_attr) {
            s->ep_attr = malloc(sizeof *s->ep_attr);
            if (!s->ep_attr) {
                e = ENOMEM;
                goto err;
            }
            *s->ep_attr = *qp_init_attr;
            s->ep_attr->qp_type = res->ai_qp_type;
        }
        *id = cm_id;
        return 0;
    }
    if (rdma_resolve_addr(cm_id, res->ai_src_addr, res->ai_dst_addr, 2000)
            || rdma_resolve_route(cm_id, 2000)) {
        e = errno;
        goto err;
    }
    if (qp_init_attr) {
        qp_init_attr->qp_type = res->ai_qp_type;
        if (rdma_create_qp(cm_id, pd, qp_init_attr)) {
            e = errno;
            goto err;
        }
    }
    *id = cm_id;
    return 0;
err:
    rdma_destroy_ep(cm_id);
    return sn_err(e ? e : EINVAL);
}

SN_EXPORT void rdma_destroy_ep(struct rdma_cm_id *id)
{
    if (!id)
        return;
    if (id->qp)
        rdma_destroy_qp(id);
    if (id->srq)
        rdma_destroy_srq(id);
    rdma_destroy_id(id);
}

/* ------------------------------------------------------------------ rdma_getaddrinfo */

static struct sockaddr *sn_sockaddr_dup(const struct sockaddr *sa, socklen_t len)
{
    struct sockaddr *c = malloc(len);
    if (c)
        memcpy(c, sa, len);
    return c;
}

SN_EXPORT void rdma_freeaddrinfo(struct rdma_addrinfo *res)
{
    while (res) {
        struct rdma_addrinfo *next = res->ai_next;
        free(res->ai_src_addr);
        free(res->ai_dst_addr);
        free(res->ai_src_canonname);
        free(res->ai_dst_canonname);
        free(res->ai_route);
        free(res->ai_connect);
        free(res);
        res = next;
    }
}

SN_EXPORT int rdma_getaddrinfo(const char *node, const char *service,
                               const struct rdma_addrinfo *hints, struct rdma_addrinfo **res)
{
    if (!res)
        return sn_err(EINVAL);
    if (!node && !service && !(hints && (hints->ai_src_addr || hints->ai_dst_addr)))
        return sn_err(EINVAL);
    struct rdma_addrinfo *ai = calloc(1, sizeof *ai);
    if (!ai)
        return sn_err(ENOMEM);
    int passive = hints && (hints->ai_flags & RAI_PASSIVE);
    ai->ai_flags = hints ? hints->ai_flags : 0;
    ai->ai_family = AF_INET;
    ai->ai_port_space = hints && hints->ai_port_space ? hints->ai_port_space : RDMA_PS_TCP;
    ai->ai_qp_type = hints && hints->ai_qp_type ? hints->ai_qp_type
                     : (ai->ai_port_space == RDMA_PS_UDP ? IBV_QPT_UD : IBV_QPT_RC);
    if (!node && !service) {
        /* the addresses come from the hints (as rdma-core copies them) */
        if (hints->ai_src_addr && hints->ai_src_len) {
            ai->ai_src_addr = sn_sockaddr_dup(hints->ai_src_addr, hints->ai_src_len);
            ai->ai_src_len = hints->ai_src_len;
            ai->ai_family = hints->ai_src_addr->sa_family;
        }
        if (hints->ai_dst_addr && hints->ai_dst_len) {
            ai->ai_dst_addr = sn_sockaddr_dup(hints->ai_dst_addr, hints->ai_dst_len);
            ai->ai_dst_len = hints->ai_dst_len;
            ai->ai_family = hints->ai_dst_addr->sa_family;
        }
        if ((hints->ai_src_addr && !ai->ai_src_addr) || (hints->ai_dst_addr && !ai->ai_dst_addr)) {
            rdma_freeaddrinfo(ai);
            return sn_err(ENOMEM);
        }
        *res = ai;
        return 0;
    }
    if (hints && hints->ai_family && hints->ai_family != AF_INET && hints->ai_family != AF_INET6
            && hints->ai_family != AF_UNSPEC) {
        free(ai);
        return sn_err(EAFNOSUPPORT);
    }
    if (!node && passive && hints->ai_src_addr && (hints->ai_src_addr->sa_family == AF_INET
                                                   || hints->ai_src_addr->sa_family == AF_INET6)) {
        /* a passive lookup of a service on the hints' source address */
        int fam = hints->ai_src_addr->sa_family;
        socklen_t len = fam == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
        struct addrinfo h, *gai = NULL;
        memset(&h, 0, sizeof h);
        h.ai_family = fam;
        h.ai_flags = AI_PASSIVE;
        if (getaddrinfo(NULL, service, &h, &gai) || !gai) {
            free(ai);
            return sn_err(EINVAL);
        }
        struct sockaddr *in = sn_sockaddr_dup(hints->ai_src_addr, len);
        if (in)      /* sin_port and sin6_port lie at the same offset */
            ((struct sockaddr_in *)in)->sin_port = ((struct sockaddr_in *)gai->ai_addr)->sin_port;
        freeaddrinfo(gai);
        if (!in) {
            free(ai);
            return sn_err(ENOMEM);
        }
        ai->ai_family = fam;
        ai->ai_src_addr = in;
        ai->ai_src_len = len;
        *res = ai;
        return 0;
    }
    /* a name with IPv4 and IPv6 addresses gives its IPv4 one unless the hints ask for
     * IPv6; an IPv6 literal (or a name with only IPv6 addresses) its IPv6 one */
    struct addrinfo h, *gai = NULL;
    memset(&h, 0, sizeof h);
    h.ai_family = hints && hints->ai_family == AF_INET6 ? AF_INET6 : AF_INET;
    h.ai_socktype = ai->ai_qp_type == IBV_QPT_UD ? SOCK_DGRAM : SOCK_STREAM;
    if (passive)
        h.ai_flags |= AI_PASSIVE;
    if (hints && (hints->ai_flags & RAI_NUMERICHOST))
        h.ai_flags |= AI_NUMERICHOST;
    int g = getaddrinfo(node, service, &h, &gai);
    if ((g || !gai) && node && !(hints && hints->ai_family == AF_INET)) {
        if (gai)
            freeaddrinfo(gai);
        gai = NULL;
        h.ai_family = AF_INET6;
        g = getaddrinfo(node, service, &h, &gai);
    }
    if (g || !gai) {
        free(ai);
        if (gai)
            freeaddrinfo(gai);
        return sn_err(g == EAI_SYSTEM ? errno : ENODEV);
    }
    struct sockaddr *sa = sn_sockaddr_dup(gai->ai_addr, gai->ai_addrlen);
    socklen_t len = gai->ai_addrlen;
    ai->ai_family = gai->ai_family;
    if (gai->ai_canonname) {
        if (passive)
            ai->ai_src_canonname = strdup(gai->ai_canonname);
        else
            ai->ai_dst_canonname = strdup(gai->ai_canonname);
    }
    freeaddrinfo(gai);
    if (!sa) {
        rdma_freeaddrinfo(ai);
        return sn_err(ENOMEM);
    }
    if (passive) {
        ai->ai_src_addr = sa;
        ai->ai_src_len = len;
    } else {
        ai->ai_dst_addr = sa;
        ai->ai_dst_len = len;
        if (hints && hints->ai_src_addr && hints->ai_src_len) {
            ai->ai_src_addr = sn_sockaddr_dup(hints->ai_src_addr, hints->ai_src_len);
            ai->ai_src_len = hints->ai_src_len;
        }
    }
    *res = ai;
    return 0;
}

/* ------------------------------------------------------------------ exit
 * A C program ends without finalizing the embedded interpreter: before it goes,
 * the devices' captures are flushed (a pcap of the run is complete). */

__attribute__((destructor)) static void sn_cm_fini(void)
{
    if (sn_nctx >= 0 && Py_IsInitialized())    /* (a Python host may have finalized it) */
        sn_cm_exit();
}
