/* softnic's libibverbs.so.1: the verbs ABI of rdma-core's libibverbs, served by
 * softnic's engine running in an embedded Python interpreter.
 *
 * This file owns the C side: the structs programs read (ibv_context with its ops
 * table and the verbs_context around it, ibv_qp_ex, ibv_cq_ex, ...), the
 * conversion of work requests and completions into the flat records of api.h,
 * and the entry points.  Everything stateful happens in backend.py through the
 * sn_* calls of callbacks.h.  Entry points of the real library that softnic does
 * not provide are generated stubs that fail with EOPNOTSUPP (stubs.c).
 *
 * Preceded (by build.py) by <infiniband/verbs.h>, api.h and the static
 * prototypes of the sn_* calls. */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova
#undef ibv_get_device_list

#define SN_EXPORT __attribute__((visibility("default")))
#define SN_MAX_DEVICES 64

struct sn_device {
    struct ibv_device dev;
    int index;
    uint64_t guid;          /* network order, as ibv_get_device_guid returns it */
};

struct sn_context {
    struct verbs_context vctx;     /* its last member is the ibv_context programs hold */
    uint32_t handle;
};

struct sn_mr {
    struct ibv_mr mr;
    unsigned int access;           /* kept for ibv_rereg_mr without CHANGE_ACCESS */
};

struct sn_channel {
    struct ibv_comp_channel ch;
    uint32_t handle;
};

struct sn_cq {
    struct ibv_cq_ex cqx;          /* starts with the fields of struct ibv_cq */
    struct sn_wc cur;              /* the completion ibv_start_poll / ibv_next_poll reached */
    uint64_t cur_ts;
    /* what sn_cq_idle reads (sn_cq_fastpoll; NULL: every poll enters Python) */
    volatile int32_t *fp_cq;       /* [completions queued (-1: overflowed, closed), armed] */
    volatile int64_t *fp_lease;    /* the device's lease (softnic/accel/wait.c) */
    volatile int32_t *fp_sock;     /* the device's socket (-1: closed) */
    volatile int64_t *fp_open;     /* devices open in this process: [count, then each
                                      one's lease and socket addresses] (nic._open_view) */
};

struct sn_pending {                /* a WR built with the ibv_wr_* calls, posted on complete */
    struct sn_send_wr wr;
    struct sn_sge sge[16];
    void *inline_buf;
};

#define SN_QPX_SPARE 8
/* RDMA FLUSH as rdma-core 45 declares it (these headers are 44's): IBV_WR_FLUSH,
 * IBV_QP_EX_WITH_FLUSH, and ibv_qp_ex.wr_flush right after wr_atomic_write (spare_wr[0]) */
#define SN_WR_FLUSH 14
#define SN_QP_EX_WITH_FLUSH (1 << 11)

struct sn_qp {
    struct ibv_qp_ex qpx;          /* starts with struct ibv_qp */
    /* builders that rdma-core's later headers add after wr_atomic_write (wr_flush, ...):
     * a program built against them finds failing ones here, not garbage */
    void (*spare_wr[SN_QPX_SPARE])(struct ibv_qp_ex *q);
    int is_ex;
    struct sn_pending *pend;
    int npend, cap_pend, wr_err;
};

static struct sn_device sn_devices[SN_MAX_DEVICES];
static int sn_ndevices = -1;
static pthread_mutex_t sn_lock = PTHREAD_MUTEX_INITIALIZER;

static inline struct sn_context *to_sctx(struct ibv_context *ctx)
{
    return (struct sn_context *)((char *)ctx - offsetof(struct sn_context, vctx.context));
}

static inline uint32_t ctx_handle(struct ibv_context *ctx) { return to_sctx(ctx)->handle; }

static void *sn_fail_ptr(int err) { errno = err; return NULL; }

/* After a create call that gave handle h: a zeroed object of size bytes for it, or NULL
 * with errno set: the call's error, or ENOMEM once undo has given the handle back. */
static void *sn_object_for(int err, size_t size, int (*undo)(uint32_t), uint32_t h)
{
    if (err)
        return sn_fail_ptr(err);
    void *obj = calloc(1, size);
    if (!obj) {
        undo(h);
        return sn_fail_ptr(ENOMEM);
    }
    return obj;
}

/* A create call that named obj (its cookie) failed: free obj, NULL with errno err. */
static void *sn_unmade(void *obj, int err)
{
    free(obj);
    return sn_fail_ptr(err);
}

/* A destroy call's result; obj is freed once the backend has let its handle go. */
static int sn_destroyed(int err, void *obj)
{
    if (!err)
        free(obj);
    return err;
}

/* ------------------------------------------------------------------ devices */

static int sn_load_devices(void)
{
    pthread_mutex_lock(&sn_lock);
    if (sn_ndevices < 0) {
        int n = sn_device_count();
        if (n < 0)
            n = 0;
        if (n > SN_MAX_DEVICES)
            n = SN_MAX_DEVICES;
        for (int i = 0; i < n; i++) {
            struct sn_device *d = &sn_devices[i];
            uint64_t guid = 0;
            memset(d, 0, sizeof(*d));
            sn_device_name(i, d->dev.name, sizeof(d->dev.name), &guid);
            d->index = i;
            d->guid = guid;
            d->dev.node_type = IBV_NODE_CA;
            d->dev.transport_type = IBV_TRANSPORT_IB;
            snprintf(d->dev.dev_name, sizeof(d->dev.dev_name), "uverbs%d", i);
            snprintf(d->dev.dev_path, sizeof(d->dev.dev_path),
                     "/sys/class/infiniband_verbs/uverbs%d", i);
            snprintf(d->dev.ibdev_path, sizeof(d->dev.ibdev_path),
                     "/sys/class/infiniband/%s", d->dev.name);
        }
        sn_ndevices = n;
    }
    pthread_mutex_unlock(&sn_lock);
    return sn_ndevices;
}

SN_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices)
{
    int n = sn_load_devices();
    struct ibv_device **list = calloc(n + 1, sizeof(*list));
    if (!list)
        return sn_fail_ptr(ENOMEM);
    for (int i = 0; i < n; i++)
        list[i] = &sn_devices[i].dev;
    if (num_devices)
        *num_devices = n;
    return list;
}

SN_EXPORT void ibv_free_device_list(struct ibv_device **list) { free(list); }

SN_EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
    return device->name;
}

SN_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
    return ((struct sn_device *)device)->guid;
}

SN_EXPORT int ibv_get_device_index(struct ibv_device *device)
{
    return ((struct sn_device *)device)->index;
}

/* ------------------------------------------------------------------ context */

static int sn_op_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
static int sn_op_req_notify_cq(struct ibv_cq *cq, int solicited_only);
static int sn_op_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int sn_op_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
static int sn_op_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr,
                               struct ibv_recv_wr **bad);
static int sn_vctx_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr,
                              size_t attr_len);
static int sn_vctx_query_device_ex(struct ibv_context *ctx,
                                   const struct ibv_query_device_ex_input *input,
                                   struct ibv_device_attr_ex *attr, size_t attr_size);
static struct ibv_qp *sn_vctx_create_qp_ex(struct ibv_context *ctx,
                                           struct ibv_qp_init_attr_ex *attr);
static struct ibv_cq_ex *sn_vctx_create_cq_ex(struct ibv_context *ctx,
                                              struct ibv_cq_init_attr_ex *attr);
static struct ibv_srq *sn_vctx_create_srq_ex(struct ibv_context *ctx,
                                             struct ibv_srq_init_attr_ex *attr);
static int sn_vctx_get_srq_num(struct ibv_srq *srq, uint32_t *srq_num);
static int sn_vctx_query_rt_values(struct ibv_context *ctx, struct ibv_values_ex *values);
static int sn_vctx_advise_mr(struct ibv_pd *pd, enum ibv_advise_mr_advice advice, uint32_t flags,
                             struct ibv_sge *sg_list, uint32_t num_sges);
static void sn_mw_ops(struct ibv_context *c);
static void sn_dm_ops(struct verbs_context *v);
static void sn_xrc_ops(struct verbs_context *v);
static void sn_pd_ops(struct verbs_context *v);
static struct ibv_qp *sn_qpx_trim(struct ibv_qp *qp, uint64_t send_ops_flags);
static struct ibv_qp *sn_new_xrc_qp(struct ibv_qp_init_attr_ex *attr);
static struct ibv_srq *sn_new_xrc_srq(struct ibv_srq_init_attr_ex *attr);
static void sn_dm_caps(struct ibv_context *ctx, struct ibv_device_attr_ex *attr);

/* What every op softnic does not provide answers, as rdma-core's dummy ops
 * (libibverbs/dummy_ops.c) do: an int op returns EOPNOTSUPP; an op that returns an
 * object returns NULL with errno EOPNOTSUPP.  They are called through pointers of
 * the ops' own types; extra arguments are ignored (the x86-64 and aarch64 calling
 * conventions let a caller pass more than the callee reads), as in the generated
 * stubs of build.py. */
static int sn_nosup_int(void) { return EOPNOTSUPP; }
static void *sn_nosup_ptr(void) { errno = EOPNOTSUPP; return NULL; }

#define SN_NOSUP_INT(slot) do { if (!(slot)) (slot) = (void *)sn_nosup_int; } while (0)
#define SN_NOSUP_PTR(slot) do { if (!(slot)) (slot) = (void *)sn_nosup_ptr; } while (0)

/* Every op of ibv_context and verbs_context that open left unset gets the failing one. */
static void sn_fill_unsupported_ops(struct verbs_context *v)
{
    struct ibv_context_ops *o = &v->context.ops;
    SN_NOSUP_PTR(o->alloc_mw);
    SN_NOSUP_INT(o->bind_mw);
    SN_NOSUP_INT(o->dealloc_mw);
    SN_NOSUP_PTR(o->_compat_alloc_pd);
    SN_NOSUP_PTR(o->_compat_dealloc_pd);
    SN_NOSUP_PTR(o->_compat_reg_mr);
    SN_NOSUP_PTR(o->_compat_rereg_mr);
    SN_NOSUP_PTR(o->_compat_dereg_mr);
    SN_NOSUP_PTR(o->_compat_create_cq);
    SN_NOSUP_PTR(o->_compat_cq_event);
    SN_NOSUP_PTR(o->_compat_resize_cq);
    SN_NOSUP_PTR(o->_compat_destroy_cq);
    SN_NOSUP_PTR(o->_compat_create_srq);
    SN_NOSUP_PTR(o->_compat_modify_srq);
    SN_NOSUP_PTR(o->_compat_query_srq);
    SN_NOSUP_PTR(o->_compat_destroy_srq);
    SN_NOSUP_PTR(o->_compat_create_qp);
    SN_NOSUP_PTR(o->_compat_query_qp);
    SN_NOSUP_PTR(o->_compat_modify_qp);
    SN_NOSUP_PTR(o->_compat_destroy_qp);
    SN_NOSUP_PTR(o->_compat_create_ah);
    SN_NOSUP_PTR(o->_compat_destroy_ah);
    SN_NOSUP_PTR(o->_compat_attach_mcast);
    SN_NOSUP_PTR(o->_compat_detach_mcast);
    SN_NOSUP_PTR(o->_compat_async_event);
    SN_NOSUP_INT(v->advise_mr);
    SN_NOSUP_PTR(v->alloc_null_mr);
    SN_NOSUP_INT(v->read_counters);
    SN_NOSUP_INT(v->attach_counters_point_flow);
    SN_NOSUP_PTR(v->create_counters);
    SN_NOSUP_INT(v->destroy_counters);
    SN_NOSUP_PTR(v->reg_dm_mr);
    SN_NOSUP_PTR(v->alloc_dm);
    SN_NOSUP_INT(v->free_dm);
    SN_NOSUP_INT(v->modify_flow_action_esp);
    SN_NOSUP_INT(v->destroy_flow_action);
    SN_NOSUP_PTR(v->create_flow_action_esp);
    SN_NOSUP_INT(v->modify_qp_rate_limit);
    SN_NOSUP_PTR(v->alloc_parent_domain);
    SN_NOSUP_INT(v->dealloc_td);
    SN_NOSUP_PTR(v->alloc_td);
    SN_NOSUP_INT(v->modify_cq);
    SN_NOSUP_INT(v->post_srq_ops);
    SN_NOSUP_INT(v->destroy_rwq_ind_table);
    SN_NOSUP_PTR(v->create_rwq_ind_table);
    SN_NOSUP_INT(v->destroy_wq);
    SN_NOSUP_INT(v->modify_wq);
    SN_NOSUP_PTR(v->create_wq);
    SN_NOSUP_INT(v->query_rt_values);
    SN_NOSUP_PTR(v->create_cq_ex);
    SN_NOSUP_INT(v->query_device_ex);
    SN_NOSUP_INT(v->ibv_destroy_flow);
    SN_NOSUP_PTR(v->ABI_placeholder2);
    SN_NOSUP_PTR(v->ibv_create_flow);
    SN_NOSUP_PTR(v->ABI_placeholder1);
    SN_NOSUP_PTR(v->open_qp);
    SN_NOSUP_PTR(v->create_qp_ex);
    SN_NOSUP_INT(v->get_srq_num);
    SN_NOSUP_PTR(v->create_srq_ex);
    SN_NOSUP_PTR(v->open_xrcd);
    SN_NOSUP_INT(v->close_xrcd);
}

/* Open contexts, so that ibv_import_device finds one by its command fd (a memfd: one
 * inode per context, shared by the fds a dup or SCM_RIGHTS makes of it). */
#define SN_MAX_CONTEXTS 1024
static struct ibv_context *sn_contexts[SN_MAX_CONTEXTS];
static pthread_mutex_t sn_contexts_lock = PTHREAD_MUTEX_INITIALIZER;

static void sn_context_track(struct ibv_context *c, int add)
{
    pthread_mutex_lock(&sn_contexts_lock);
    for (int i = 0; i < SN_MAX_CONTEXTS; i++) {
        if (add ? sn_contexts[i] == NULL : sn_contexts[i] == c) {
            sn_contexts[i] = add ? c : NULL;
            break;
        }
    }
    pthread_mutex_unlock(&sn_contexts_lock);
}

static struct ibv_context *sn_open_context(struct ibv_device *device, int cmd_fd);

SN_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    return sn_open_context(device, -1);
}

/* ibv_import_device: another context of the device whose context owns cmd_fd (a dup of
 * its command fd, in this process: softnic's devices belong to the process that opened
 * them).  The new context takes cmd_fd, and closes it when it is closed. */
SN_EXPORT struct ibv_context *ibv_import_device(int cmd_fd)
{
    struct stat want, st;
    if (fstat(cmd_fd, &want) != 0)
        return sn_fail_ptr(EBADF);
    struct ibv_device *dev = NULL;
    pthread_mutex_lock(&sn_contexts_lock);
    for (int i = 0; i < SN_MAX_CONTEXTS && !dev; i++) {
        struct ibv_context *c = sn_contexts[i];
        if (c && fstat(c->cmd_fd, &st) == 0 && st.st_dev == want.st_dev &&
            st.st_ino == want.st_ino)
            dev = c->device;
    }
    pthread_mutex_unlock(&sn_contexts_lock);
    if (!dev)
        return sn_fail_ptr(EOPNOTSUPP);  /* not a command fd of softnic's: a kernel uverbs fd */
    return sn_open_context(dev, cmd_fd);
}

static struct ibv_context *sn_open_context(struct ibv_device *device, int cmd_fd)
{
    struct sn_device *d = (struct sn_device *)device;
    struct sn_context *s;
    uint32_t h;
    int err = sn_open(d->index, &h);
    if (err)
        return sn_fail_ptr(err);
    s = calloc(1, sizeof(*s));
    if (!s) {
        sn_close(h);
        return sn_fail_ptr(ENOMEM);
    }
    s->handle = h;
    struct verbs_context *v = &s->vctx;
    struct ibv_context *c = &v->context;
    v->sz = sizeof(*v);
    v->query_port = sn_vctx_query_port;
    v->query_device_ex = sn_vctx_query_device_ex;
    v->create_qp_ex = sn_vctx_create_qp_ex;
    v->create_cq_ex = sn_vctx_create_cq_ex;
    v->create_srq_ex = sn_vctx_create_srq_ex;
    v->get_srq_num = sn_vctx_get_srq_num;
    v->query_rt_values = sn_vctx_query_rt_values;
    v->advise_mr = sn_vctx_advise_mr;
    c->device = device;
    c->ops.poll_cq = sn_op_poll_cq;
    c->ops.req_notify_cq = sn_op_req_notify_cq;
    c->ops.post_send = sn_op_post_send;
    c->ops.post_recv = sn_op_post_recv;
    c->ops.post_srq_recv = sn_op_post_srq_recv;
    c->ops._compat_query_device = ibv_query_device;
    c->ops._compat_query_port = ibv_query_port;
    sn_fill_unsupported_ops(v);
    /* what softnic implements beyond the core ops, over the refusing defaults */
    sn_mw_ops(c);
    sn_dm_ops(v);
    sn_xrc_ops(v);
    sn_pd_ops(v);
    c->cmd_fd = cmd_fd >= 0 ? cmd_fd : memfd_create("softnic-context", MFD_CLOEXEC);
    c->async_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    c->num_comp_vectors = 1;
    pthread_mutex_init(&c->mutex, NULL);
    c->abi_compat = __VERBS_ABI_IS_EXTENDED;
    sn_context_track(c, 1);
    return c;
}

/* Closing a context always succeeds, as rdma-core's does (ibv_close_device returns 0):
 * its backend handle is let go even when the backend is gone (a call from an exit handler,
 * after the interpreter has finished). */
SN_EXPORT int ibv_close_device(struct ibv_context *context)
{
    struct sn_context *s = to_sctx(context);
    sn_context_track(context, 0);
    (void)sn_close(s->handle);
    if (context->cmd_fd >= 0)
        close(context->cmd_fd);
    if (context->async_fd >= 0)
        close(context->async_fd);
    free(s);
    return 0;
}

/* Whether the context whose backend handle is owner shares ctx's command file (the same
 * memfd inode: ctx was imported from it, or it from ctx, or both from a third): the
 * kernel's rule for a handle that ibv_import_pd / ibv_import_mr may name. */
static int sn_shares_cmd_file(struct ibv_context *ctx, uint32_t owner)
{
    struct stat want, st;
    int same = 0;
    if (fstat(ctx->cmd_fd, &want) != 0)
        return 0;
    pthread_mutex_lock(&sn_contexts_lock);
    for (int i = 0; i < SN_MAX_CONTEXTS && !same; i++) {
        struct ibv_context *c = sn_contexts[i];
        if (c && to_sctx(c)->handle == owner && fstat(c->cmd_fd, &st) == 0)
            same = st.st_dev == want.st_dev && st.st_ino == want.st_ino;
    }
    pthread_mutex_unlock(&sn_contexts_lock);
    return same;
}

/* A device's attributes never change: the last answer is kept, and a child forked after
 * the first verbs call (whose engine is not running) is answered from it. */
static struct { struct ibv_device *dev; struct sn_dev_attr d; } sn_attr_cache[SN_MAX_DEVICES];

static int sn_query_device_cached(struct ibv_context *context, struct sn_dev_attr *d)
{
    int err = sn_query_device(ctx_handle(context), d);
    pthread_mutex_lock(&sn_lock);
    for (int i = 0; i < SN_MAX_DEVICES; i++) {
        if (sn_attr_cache[i].dev && sn_attr_cache[i].dev != context->device)
            continue;
        if (!err) {
            sn_attr_cache[i].dev = context->device;
            sn_attr_cache[i].d = *d;
        } else if (err == EIO && sn_attr_cache[i].dev) {
            *d = sn_attr_cache[i].d;
            err = 0;
        }
        break;
    }
    pthread_mutex_unlock(&sn_lock);
    return err;
}

SN_EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *a)
{
    struct sn_dev_attr d;
    memset(&d, 0, sizeof(d));
    int err = sn_query_device_cached(context, &d);
    if (err)
        return err;
    memset(a, 0, sizeof(*a));
    memcpy(a->fw_ver, d.fw_ver, sizeof(a->fw_ver));
    a->fw_ver[sizeof(a->fw_ver) - 1] = 0;
    a->node_guid = d.node_guid;
    a->sys_image_guid = d.sys_image_guid;
    a->max_mr_size = d.max_mr_size;
    a->page_size_cap = d.page_size_cap;
    a->vendor_id = d.vendor_id;
    a->vendor_part_id = d.vendor_part_id;
    a->hw_ver = d.hw_ver;
    a->max_qp = d.max_qp;
    a->max_qp_wr = d.max_qp_wr;
    a->device_cap_flags = d.device_cap_flags;
    a->max_sge = d.max_sge;
    a->max_sge_rd = d.max_sge_rd;
    a->max_cq = d.max_cq;
    a->max_cqe = d.max_cqe;
    a->max_mr = d.max_mr;
    a->max_pd = d.max_pd;
    a->max_qp_rd_atom = d.max_qp_rd_atom;
    a->max_res_rd_atom = d.max_res_rd_atom;
    a->max_qp_init_rd_atom = d.max_qp_init_rd_atom;
    a->atomic_cap = d.atomic_cap;
    a->max_ah = d.max_ah;
    a->max_mcast_grp = d.max_mcast_grp;
    a->max_mcast_qp_attach = d.max_mcast_qp_attach;
    a->max_total_mcast_qp_attach = d.max_total_mcast_qp_attach;
    a->max_srq = d.max_srq;
    a->max_srq_wr = d.max_srq_wr;
    a->max_srq_sge = d.max_srq_sge;
    a->max_pkeys = d.max_pkeys;
    a->local_ca_ack_delay = d.local_ca_ack_delay;
    a->phys_port_cnt = d.phys_port_cnt;
    return 0;
}

static int sn_vctx_query_device_ex(struct ibv_context *ctx,
                                   const struct ibv_query_device_ex_input *input,
                                   struct ibv_device_attr_ex *attr, size_t attr_size)
{
    struct ibv_device_attr_ex full;
    int err;
    (void)input;
    memset(&full, 0, sizeof(full));
    err = ibv_query_device(ctx, &full.orig_attr);
    if (err)
        return err;
    full.device_cap_flags_ex = full.orig_attr.device_cap_flags;
    full.phys_port_cnt_ex = full.orig_attr.phys_port_cnt;
    /* MRs are reached through the process's own address space and never pinned, so
     * on-demand paging is what softnic always does (implicit ODP is not offered) */
    full.odp_caps.general_caps = IBV_ODP_SUPPORT;
    full.odp_caps.per_transport_caps.rc_odp_caps =
        IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
        IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
    full.odp_caps.per_transport_caps.uc_odp_caps =
        IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE;
    full.odp_caps.per_transport_caps.ud_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV;
    sn_dm_caps(ctx, &full);
    full.completion_timestamp_mask = ~0ULL;
    full.hca_core_clock = 1000000;       /* kHz: completion timestamps are nanoseconds */
    memcpy(attr, &full, attr_size < sizeof(full) ? attr_size : sizeof(full));
    return 0;
}

static void sn_fill_port(struct ibv_port_attr *p, const struct sn_port_attr *s)
{
    memset(p, 0, sizeof(*p));
    p->state = IBV_PORT_ACTIVE;
    p->max_mtu = IBV_MTU_4096;
    p->active_mtu = s->active_mtu;
    p->gid_tbl_len = s->gid_tbl_len;
    p->port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS;
    p->max_msg_sz = s->max_msg_sz;
    p->bad_pkey_cntr = s->bad_pkey_cntr;
    p->qkey_viol_cntr = s->qkey_viol_cntr;
    p->pkey_tbl_len = 1;
    p->max_vl_num = 1;
    p->active_width = s->active_width;
    p->active_speed = s->active_speed;
    p->phys_state = 5;
    p->link_layer = IBV_LINK_LAYER_ETHERNET;
}

static int sn_vctx_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr,
                              size_t attr_len)
{
    struct sn_port_attr s;
    struct ibv_port_attr p;
    memset(&s, 0, sizeof(s));
    int err = sn_query_port(ctx_handle(ctx), port, &s);
    if (err)
        return err;
    sn_fill_port(&p, &s);
    memcpy(attr, &p, attr_len < sizeof(p) ? attr_len : sizeof(p));
    return 0;
}

/* The exported symbol is the old ABI's: a struct without the fields added since. */
SN_EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port_num,
                             struct _compat_ibv_port_attr *port_attr)
{
    return sn_vctx_query_port(context, port_num, (struct ibv_port_attr *)port_attr,
                              offsetof(struct ibv_port_attr, link_layer));
}

SN_EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index,
                            union ibv_gid *gid)
{
    int err = sn_query_gid(ctx_handle(context), port_num, index, gid->raw);
    if (err == ENODATA) {               /* an empty entry: zeros, as libibverbs answers */
        memset(gid->raw, 0, 16);
        return 0;
    }
    return err ? -1 : 0;
}

SN_EXPORT int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num,
                                uint32_t gid_index, struct ibv_gid_entry *entry,
                                uint32_t flags, size_t entry_size)
{
    struct ibv_gid_entry e;
    (void)flags;
    memset(&e, 0, sizeof(e));
    int err = sn_query_gid(ctx_handle(context), port_num, gid_index, e.gid.raw);
    if (err)
        return err;
    e.gid_index = gid_index;
    e.port_num = port_num;
    e.gid_type = IBV_GID_TYPE_ROCE_V2;
    e.ndev_ifindex = 1;                 /* the loopback interface */
    memcpy(entry, &e, entry_size < sizeof(e) ? entry_size : sizeof(e));
    return 0;
}

SN_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *context,
                                       struct ibv_gid_entry *entries, size_t max_entries,
                                       uint32_t flags, size_t entry_size)
{
    struct sn_port_attr s;
    memset(&s, 0, sizeof(s));
    int err = sn_query_port(ctx_handle(context), 1, &s);
    if (err)
        return -err;
    /* the populated entries, as the kernel's table query gives them */
    size_t n = 0;
    for (int i = 0; i < s.gid_tbl_len; i++) {
        struct ibv_gid_entry e;
        err = _ibv_query_gid_ex(context, 1, i, &e, flags, sizeof(e));
        if (err == ENODATA)
            continue;
        if (err)
            return -err;
        if (n == max_entries)
            return -EINVAL;
        memcpy((char *)entries + n * entry_size, &e,
               entry_size < sizeof(e) ? entry_size : sizeof(e));
        n++;
    }
    return (ssize_t)n;
}

SN_EXPORT int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num,
                                 unsigned int index, int *type)
{
    uint8_t raw[16];
    int err = sn_query_gid(ctx_handle(context), port_num, index, raw);
    if (err == ENODATA) {             /* an empty entry: libibverbs says IB/RoCE v1 */
        *type = 0;
        return 0;
    }
    if (err)
        return -1;
    *type = 1;                        /* IBV_GID_TYPE_SYSFS_ROCE_V2 (rdma-core's private enum) */
    return 0;
}

SN_EXPORT int ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index,
                             __be16 *pkey)
{
    (void)context;
    if (port_num != 1 || index != 0)
        return -1;
    *pkey = htons(0xffff);
    return 0;
}

SN_EXPORT int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num, __be16 pkey)
{
    (void)context;
    if (port_num != 1 || pkey != htons(0xffff))
        return -1;
    return 0;
}

static int sn_vctx_query_rt_values(struct ibv_context *ctx, struct ibv_values_ex *values)
{
    struct timespec ts;
    (void)ctx;
    clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
    values->raw_clock = ts;
    values->comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
    return 0;
}

/* ------------------------------------------------------------------ PD, MR, AH */

/* Prefetching has nothing to do: the memory is this process's own. */
static int sn_vctx_advise_mr(struct ibv_pd *pd, enum ibv_advise_mr_advice advice, uint32_t flags,
                             struct ibv_sge *sg_list, uint32_t num_sges)
{
    (void)pd; (void)flags; (void)sg_list; (void)num_sges;
    if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH && advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
        advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
        return EOPNOTSUPP;
    return 0;
}

/* The ibv_pd of a PD (or of a parent domain's alias of one) that the backend made. */
static struct ibv_pd *sn_pd_for(int err, struct ibv_context *context, uint32_t h)
{
    struct ibv_pd *pd = sn_object_for(err, sizeof(*pd), sn_dealloc_pd, h);
    if (pd) {
        pd->context = context;
        pd->handle = h;
    }
    return pd;
}

SN_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
    uint32_t h = 0;
    int err = sn_alloc_pd(ctx_handle(context), &h);
    return sn_pd_for(err, context, h);
}

SN_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
    return sn_destroyed(sn_dealloc_pd(pd->handle), pd);
}

/* ibv_import_pd / ibv_import_mr: a PD or MR of a context that shares ctx's command file,
 * named by its handle, seen through ctx (the kernel's lookup in that file: a handle the
 * file does not hold is ENOENT, one of another kind EINVAL).  The object stays the one
 * created: ibv_unimport_* lets the import go, ibv_dealloc_pd / ibv_dereg_mr of either
 * destroys it, as the kernel's object shared by both contexts. */
SN_EXPORT struct ibv_pd *ibv_import_pd(struct ibv_context *ctx, uint32_t pd_handle)
{
    uint32_t owner = 0;
    if (!ctx)
        return sn_fail_ptr(EINVAL);
    int err = sn_import_pd(ctx_handle(ctx), pd_handle, &owner);
    if (!err && !sn_shares_cmd_file(ctx, owner))
        err = ENOENT;
    if (err)
        return sn_fail_ptr(err);
    struct ibv_pd *pd = calloc(1, sizeof(*pd));
    if (!pd)
        return sn_fail_ptr(ENOMEM);
    pd->context = ctx;
    pd->handle = pd_handle;
    return pd;
}

SN_EXPORT void ibv_unimport_pd(struct ibv_pd *pd)
{
    free(pd);
}

SN_EXPORT struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t mr_handle)
{
    uint32_t owner = 0, lkey = 0, rkey = 0;
    uint64_t length = 0;
    unsigned int access = 0;
    if (!pd)
        return sn_fail_ptr(EINVAL);
    int err = sn_import_mr(ctx_handle(pd->context), mr_handle, &owner, &length, &lkey, &rkey,
                           &access);
    if (!err && !sn_shares_cmd_file(pd->context, owner))
        err = ENOENT;
    if (err)
        return sn_fail_ptr(err);
    struct sn_mr *smr = calloc(1, sizeof(*smr));
    if (!smr)
        return sn_fail_ptr(ENOMEM);
    smr->access = access;
    struct ibv_mr *mr = &smr->mr;
    mr->context = pd->context;
    mr->pd = pd;
    mr->addr = NULL;             /* as libibverbs' ibv_cmd_query_mr leaves it */
    mr->length = length;
    mr->handle = mr_handle;
    mr->lkey = lkey;
    mr->rkey = rkey;
    return mr;
}

SN_EXPORT void ibv_unimport_mr(struct ibv_mr *mr)
{
    free(mr);
}

SN_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
                                          uint64_t iova, unsigned int access)
{
    uint32_t h = 0, lkey, rkey;
    if (iova != (uint64_t)(uintptr_t)addr)
        return sn_fail_ptr(EOPNOTSUPP);    /* remote addresses are virtual addresses */
    int err = sn_reg_mr(pd->handle, (uint64_t)(uintptr_t)addr, length,
                        access & ~IBV_ACCESS_OPTIONAL_RANGE, &h, &lkey, &rkey);
    struct sn_mr *smr = sn_object_for(err, sizeof(*smr), sn_dereg_mr, h);
    if (!smr)
        return NULL;
    smr->access = access & ~IBV_ACCESS_OPTIONAL_RANGE;
    struct ibv_mr *mr = &smr->mr;
    mr->context = pd->context;
    mr->pd = pd;
    mr->addr = addr;
    mr->length = length;
    mr->handle = h;
    mr->lkey = lkey;
    mr->rkey = rkey;
    return mr;
}

SN_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, access);
}

SN_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length,
                                         uint64_t iova, int access)
{
    return ibv_reg_mr_iova2(pd, addr, length, iova, access);
}

/* Re-registration in place: the engine changes the MR's translation, PD and/or access and
 * keeps its keys (a peer holding the rkey keeps it). */
SN_EXPORT int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr,
                           size_t length, int access)
{
    if (flags & ~(IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD |
                  IBV_REREG_MR_CHANGE_ACCESS) || !flags) {
        errno = EINVAL;
        return IBV_REREG_MR_ERR_INPUT;
    }
    if ((flags & IBV_REREG_MR_CHANGE_PD) && !pd) {
        errno = EINVAL;
        return IBV_REREG_MR_ERR_INPUT;
    }
    unsigned int naccess = (flags & IBV_REREG_MR_CHANGE_ACCESS)
        ? (unsigned int)access & ~IBV_ACCESS_OPTIONAL_RANGE
        : ((struct sn_mr *)mr)->access & ~(1u << 31);    /* without the device-memory mark */
    int err = sn_rereg_mr(mr->handle, flags, (flags & IBV_REREG_MR_CHANGE_PD) ? pd->handle : 0,
                          (uint64_t)(uintptr_t)addr, length, naccess);
    if (err) {
        errno = err;
        return IBV_REREG_MR_ERR_INPUT;
    }
    if (flags & IBV_REREG_MR_CHANGE_PD) {
        mr->pd = pd;
        mr->context = pd->context;
    }
    if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
        mr->addr = addr;
        mr->length = length;
    }
    ((struct sn_mr *)mr)->access = naccess | (((struct sn_mr *)mr)->access & (1u << 31));
    return 0;
}

static void sn_dm_mr_gone(struct ibv_mr *mr);
#define SN_DM_MR (1u << 31)      /* in sn_mr.access: an sn_dm_mr (no access flag uses it) */

SN_EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
    int err = sn_dereg_mr(mr->handle);
    if (!err) {
        if (((struct sn_mr *)mr)->access & SN_DM_MR)    /* an MR over device memory */
            sn_dm_mr_gone(mr);
        free(mr);
    }
    return err;
}

static void sn_ah_from_ibv(struct sn_ah *s, const struct ibv_ah_attr *a)
{
    memset(s, 0, sizeof(*s));
    memcpy(s->dgid, a->grh.dgid.raw, 16);
    s->flow_label = a->grh.flow_label;
    s->sgid_index = a->grh.sgid_index;
    s->hop_limit = a->grh.hop_limit;
    s->traffic_class = a->grh.traffic_class;
    s->sl = a->sl;
    s->is_global = a->is_global;
    s->port_num = a->port_num;
}

static void sn_ah_to_ibv(struct ibv_ah_attr *a, const struct sn_ah *s)
{
    memset(a, 0, sizeof(*a));
    memcpy(a->grh.dgid.raw, s->dgid, 16);
    a->grh.flow_label = s->flow_label;
    a->grh.sgid_index = s->sgid_index;
    a->grh.hop_limit = s->hop_limit;
    a->grh.traffic_class = s->traffic_class;
    a->sl = s->sl;
    a->is_global = s->is_global;
    a->port_num = s->port_num;
}

SN_EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
    struct sn_ah s;
    uint32_t h = 0;
    sn_ah_from_ibv(&s, attr);
    int err = sn_create_ah(pd->handle, &s, &h);
    struct ibv_ah *ah = sn_object_for(err, sizeof(*ah), sn_destroy_ah, h);
    if (!ah)
        return NULL;
    ah->context = pd->context;
    ah->pd = pd;
    ah->handle = h;
    return ah;
}

SN_EXPORT int ibv_destroy_ah(struct ibv_ah *ah)
{
    return sn_destroyed(sn_destroy_ah(ah->handle), ah);
}

/* RoCEv2: the 40-byte GRH area of a UD receive holds the IPv4 header in its last
 * 20 bytes, or the IPv6 header; the sender's address makes the reply's GID. */
SN_EXPORT int ibv_init_ah_from_wc(struct ibv_context *context, uint8_t port_num,
                                  struct ibv_wc *wc, struct ibv_grh *grh,
                                  struct ibv_ah_attr *ah_attr)
{
    (void)context;
    const uint8_t *ip6 = (const uint8_t *)grh;
    const uint8_t *ip4 = (const uint8_t *)grh + 20;
    memset(ah_attr, 0, sizeof(*ah_attr));
    if (!(wc->wc_flags & IBV_WC_GRH))
        return -1;
    if ((ip6[0] >> 4) == 6) {
        ah_attr->is_global = 1;
        ah_attr->port_num = port_num;
        ah_attr->sl = wc->sl;
        memcpy(ah_attr->grh.dgid.raw, ip6 + 8, 16);
        ah_attr->grh.hop_limit = ip6[7];
        ah_attr->grh.traffic_class = (uint8_t)(((ip6[0] & 0x0f) << 4) | (ip6[1] >> 4));
        return 0;
    }
    if ((ip4[0] >> 4) != 4)
        return -1;
    ah_attr->is_global = 1;
    ah_attr->port_num = port_num;
    ah_attr->sl = wc->sl;
    ah_attr->grh.dgid.raw[10] = 0xff;
    ah_attr->grh.dgid.raw[11] = 0xff;
    memcpy(&ah_attr->grh.dgid.raw[12], ip4 + 12, 4);
    ah_attr->grh.hop_limit = ip4[8];
    ah_attr->grh.traffic_class = ip4[1];
    return 0;
}

SN_EXPORT struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc,
                                               struct ibv_grh *grh, uint8_t port_num)
{
    struct ibv_ah_attr a;
    if (ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &a))
        return sn_fail_ptr(EINVAL);
    return ibv_create_ah(pd, &a);
}

/* ------------------------------------------------------------------ CQ and channels */

/* The channel's fd is an eventfd the engine adds one to per completion event, so a
 * program may poll() it (or make it non-blocking) as it would the kernel's. */
SN_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
    uint32_t h;
    struct sn_channel *c = calloc(1, sizeof(*c));
    if (!c)
        return sn_fail_ptr(ENOMEM);
    c->ch.fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
    if (c->ch.fd < 0) {
        int e = errno;
        free(c);
        return sn_fail_ptr(e);
    }
    int err = sn_create_channel(ctx_handle(context), c->ch.fd, &h);
    if (err) {
        close(c->ch.fd);
        free(c);
        return sn_fail_ptr(err);
    }
    c->handle = h;
    c->ch.context = context;
    return &c->ch;
}

SN_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
    struct sn_channel *c = (struct sn_channel *)channel;
    int err = sn_destroy_channel(c->handle);
    if (err)
        return err;
    if (channel->fd >= 0)
        close(channel->fd);
    free(c);
    return 0;
}

static int sn_cqx_start_poll(struct ibv_cq_ex *cq, struct ibv_poll_cq_attr *attr);
static int sn_cqx_next_poll(struct ibv_cq_ex *cq);
static void sn_cqx_end_poll(struct ibv_cq_ex *cq);
static enum ibv_wc_opcode sn_cqx_read_opcode(struct ibv_cq_ex *cq);
static uint32_t sn_cqx_read_vendor_err(struct ibv_cq_ex *cq);
static uint32_t sn_cqx_read_byte_len(struct ibv_cq_ex *cq);
static __be32 sn_cqx_read_imm_data(struct ibv_cq_ex *cq);
static uint32_t sn_cqx_read_qp_num(struct ibv_cq_ex *cq);
static uint32_t sn_cqx_read_src_qp(struct ibv_cq_ex *cq);
static unsigned int sn_cqx_read_wc_flags(struct ibv_cq_ex *cq);
static uint32_t sn_cqx_read_slid(struct ibv_cq_ex *cq);
static uint8_t sn_cqx_read_sl(struct ibv_cq_ex *cq);
static uint8_t sn_cqx_read_dlid_path_bits(struct ibv_cq_ex *cq);
static uint64_t sn_cqx_read_completion_ts(struct ibv_cq_ex *cq);
static uint64_t sn_cqx_read_completion_wallclock_ns(struct ibv_cq_ex *cq);
/* no VLANs, flow tags or tag matching: a CQ cannot be created asking for them, and
 * reading them anyway gives zeros */
static uint16_t sn_cqx_read_cvlan(struct ibv_cq_ex *cq) { (void)cq; return 0; }
static uint32_t sn_cqx_read_flow_tag(struct ibv_cq_ex *cq) { (void)cq; return 0; }
static void sn_cqx_read_tm_info(struct ibv_cq_ex *cq, struct ibv_wc_tm_info *tm)
{
    (void)cq;
    memset(tm, 0, sizeof(*tm));
}

static struct sn_cq *sn_new_cq(struct ibv_context *context, int cqe, void *cq_context,
                               struct ibv_comp_channel *channel, int *errp)
{
    struct sn_cq *s = calloc(1, sizeof(*s));
    uint32_t h;
    int actual;
    if (!s) {
        *errp = ENOMEM;
        return NULL;
    }
    uint32_t ch = channel ? ((struct sn_channel *)channel)->handle : 0;
    int err = sn_create_cq(ctx_handle(context), cqe, ch, s, &h, &actual);
    if (err) {
        free(s);
        *errp = err;
        return NULL;
    }
    struct ibv_cq_ex *c = &s->cqx;
    c->context = context;
    c->channel = channel;
    c->cq_context = cq_context;
    c->handle = h;
    c->cqe = actual;
    pthread_mutex_init(&c->mutex, NULL);
    pthread_cond_init(&c->cond, NULL);
    c->start_poll = sn_cqx_start_poll;
    c->next_poll = sn_cqx_next_poll;
    c->end_poll = sn_cqx_end_poll;
    c->read_opcode = sn_cqx_read_opcode;
    c->read_vendor_err = sn_cqx_read_vendor_err;
    c->read_byte_len = sn_cqx_read_byte_len;
    c->read_imm_data = sn_cqx_read_imm_data;
    c->read_qp_num = sn_cqx_read_qp_num;
    c->read_src_qp = sn_cqx_read_src_qp;
    c->read_wc_flags = sn_cqx_read_wc_flags;
    c->read_slid = sn_cqx_read_slid;
    c->read_sl = sn_cqx_read_sl;
    c->read_dlid_path_bits = sn_cqx_read_dlid_path_bits;
    c->read_completion_ts = sn_cqx_read_completion_ts;
    c->read_completion_wallclock_ns = sn_cqx_read_completion_wallclock_ns;
    c->read_cvlan = sn_cqx_read_cvlan;
    c->read_flow_tag = sn_cqx_read_flow_tag;
    c->read_tm_info = sn_cqx_read_tm_info;
    uint64_t view[4] = {0, 0, 0, 0};
    if (sn_cq_fastpoll(h, view) == 0 && view[0] && view[1] && view[2] && view[3]) {
        s->fp_cq = (volatile int32_t *)(uintptr_t)view[0];
        s->fp_lease = (volatile int64_t *)(uintptr_t)view[1];
        s->fp_sock = (volatile int32_t *)(uintptr_t)view[2];
        s->fp_open = (volatile int64_t *)(uintptr_t)view[3];
    }
    return s;
}

SN_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                                       struct ibv_comp_channel *channel, int comp_vector)
{
    int err;
    if (comp_vector < 0 || comp_vector >= context->num_comp_vectors)
        return sn_fail_ptr(EINVAL);
    struct sn_cq *s = sn_new_cq(context, cqe, cq_context, channel, &err);
    if (!s)
        return sn_fail_ptr(err);
    return ibv_cq_ex_to_cq(&s->cqx);
}

static struct ibv_cq_ex *sn_vctx_create_cq_ex(struct ibv_context *context,
                                              struct ibv_cq_init_attr_ex *attr)
{
    int err;
    if (attr->comp_mask & ~(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD))
        return sn_fail_ptr(EOPNOTSUPP);
    /* as rxe: fields softnic's completions never carry are refused */
    if (attr->wc_flags & (IBV_WC_EX_WITH_CVLAN | IBV_WC_EX_WITH_FLOW_TAG |
                          IBV_WC_EX_WITH_TM_INFO))
        return sn_fail_ptr(EOPNOTSUPP);
    if (attr->comp_vector >= (uint32_t)context->num_comp_vectors)
        return sn_fail_ptr(EINVAL);
    struct sn_cq *s = sn_new_cq(context, attr->cqe, attr->cq_context, attr->channel, &err);
    if (!s)
        return sn_fail_ptr(err);
    return &s->cqx;
}

SN_EXPORT int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
    int actual;
    int err = sn_resize_cq(cq->handle, cqe, &actual);
    if (!err)
        cq->cqe = actual;
    return err;
}

SN_EXPORT int ibv_destroy_cq(struct ibv_cq *cq)
{
    int err = sn_destroy_cq(cq->handle);
    if (err)
        return err;
    pthread_mutex_destroy(&cq->mutex);
    pthread_cond_destroy(&cq->cond);
    free(cq);
    return 0;
}

static void sn_wc_to_ibv(struct ibv_wc *w, const struct sn_wc *s)
{
    memset(w, 0, sizeof(*w));
    w->wr_id = s->wr_id;
    w->status = s->status;
    w->opcode = s->opcode;
    w->vendor_err = s->vendor_err;
    w->byte_len = s->byte_len;
    if (s->wc_flags & IBV_WC_WITH_INV)
        w->invalidated_rkey = s->imm_data;
    else
        w->imm_data = htonl(s->imm_data);
    w->qp_num = s->qp_num;
    w->src_qp = s->src_qp;
    w->wc_flags = s->wc_flags;
    w->pkey_index = s->pkey_index;
    w->slid = s->slid;
    w->sl = s->sl;
    w->dlid_path_bits = s->dlid_path_bits;
}

#define SN_POLL_BATCH 32

/* CLOCK_MONOTONIC in ns, the clock of the lease (softnic/accel/wait.c) */
static int64_t sn_mono_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* this thread's id, as the lease records its holder (lease[4], NIC.poll's
   threading.get_native_id()): asked of the kernel once per thread */
static pid_t sn_tid(void)
{
    static __thread pid_t tid;
    if (!tid)
        tid = (pid_t)syscall(SYS_gettid);
    return tid;
}

/* the devices sn_cq_idle looks at, at most (its arrays' size; nic._open_view's count
   never exceeds nic.FAST_DEVICES, the pairs it has room for, so a smaller limit here
   only sends more polls into Python) */
#define SN_FAST_DEVICES 8

/* Output held for the program's next call (lease[1]) that a poll with nothing
 * to do would send now: 1, held for whatever call comes next; above 1, ACKs held
 * for the program's answer until that time in ns (NIC.poll leaves them held
 * until then). */
static inline int sn_held_due(int64_t held, int64_t now)
{
    return held == 1 || (held > 1 && now >= held);
}

/* A poll that would find nothing and do nothing: NIC.poll's idle case, read from
 * memory the Python side keeps (sn_cq_fastpoll), without entering the interpreter.
 * It is so when the CQ holds no completion and was not armed since its last poll
 * (the first poll after an arm gives the lease back: sn_poll_cq), and on every
 * device open in the process (an empty poll moves the others along too:
 * sn_poll_cq) nothing waits on the socket, no deadline of the engine has come
 * (lease[3]) and no output held is due (lease[1]: sn_held_due).  Then, as NIC.poll does on each, it renews their leases
 * (lease[0]): the progress threads leave what arrives to this caller.  Anything
 * else enters Python, as does a process with a device the list cannot show (one
 * without the compiled sleep, or more than SN_FAST_DEVICES).  *seen: set where
 * this poll() saw a datagram waiting on the CQ's own device (sn_poll_cq's step then
 * does not ask the socket a second time). */
static int sn_cq_idle(struct sn_cq *s, int *seen)
{
    if (!s->fp_cq || sn_forked || (sn_host_python && !Py_IsInitialized()) ||
        s->fp_cq[0] != 0 || s->fp_cq[1])
        return 0;
    int64_t now = sn_mono_ns();
    if (sn_held_due(s->fp_lease[1], now))
        return 0;
    int64_t n = s->fp_open[0];
    if (n < 1 || n > SN_FAST_DEVICES)
        return 0;
    volatile int64_t *lease[SN_FAST_DEVICES];
    struct pollfd p[SN_FAST_DEVICES];
    int own = -1;
    for (int i = 0; i < n; i++) {
        volatile int64_t *l = (volatile int64_t *)(uintptr_t)s->fp_open[1 + 2 * i];
        volatile int32_t *sock = (volatile int32_t *)(uintptr_t)s->fp_open[2 + 2 * i];
        if (!l || !sock || sn_held_due(l[1], now) || l[3] <= now || *sock < 0)
            return 0;
        if (l == s->fp_lease)
            own = i;
        lease[i] = l;
        p[i].fd = *sock;
        p[i].events = POLLIN;
        p[i].revents = 0;
    }
    if (own < 0)
        return 0;                         /* (the list changed under us: Python decides) */
    if (poll(p, (nfds_t)n, 0) != 0) {
        *seen = (p[own].revents & POLLIN) != 0;
        return 0;                         /* a datagram (or an error to report) */
    }
    pid_t tid = sn_tid();
    for (int i = 0; i < n; i++) {
        lease[i][0] = now;
        lease[i][4] = tid;            /* (the lease is kept while this thread runs) */
    }
    return 1;
}

static int sn_op_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
    struct sn_wc buf[SN_POLL_BATCH];
    int total = 0, seen = 0;
    if (num_entries > 0 && sn_cq_idle((struct sn_cq *)cq, &seen))
        return 0;
    while (total < num_entries) {
        int want = num_entries - total;
        if (want > SN_POLL_BATCH)
            want = SN_POLL_BATCH;
        int got = sn_poll_cq(cq->handle, want, buf, seen);
        seen = 0;
        if (got < 0)
            return total ? total : got;
        for (int i = 0; i < got; i++)
            sn_wc_to_ibv(&wc[total + i], &buf[i]);
        total += got;
        if (got < want)
            break;
    }
    return total;
}

static int sn_op_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
    return sn_req_notify_cq(cq->handle, solicited_only);
}

/* Could a signal that interrupted a wait here have come to a handler installed
 * without SA_RESTART?  The kernel's ibv_get_cq_event is a read() of the channel,
 * which such a handler interrupts (EINTR: qperf ends each test with SIGALRM) and
 * any other restarts; poll() is never restarted, so a wait here returns EINTR
 * where some installed handler would interrupt a read, and waits on otherwise. */
static int sn_signal_interrupts(void)
{
    for (int s = 1; s < NSIG; s++) {
        struct sigaction sa;
        if (s == SIGKILL || s == SIGSTOP || sigaction(s, NULL, &sa))
            continue;
        if (sa.sa_flags & SA_RESTART)
            continue;
        if (sa.sa_flags & SA_SIGINFO ? sa.sa_sigaction != NULL
                                     : sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN)
            return 1;
    }
    return 0;
}

static void sn_cq_wait_cancelled(void *channel)
{
    sn_cq_wait_end(((struct sn_channel *)channel)->handle);
}

/* Wait for the channel's next event asleep on the device's socket as well as the
 * channel: a datagram wakes this thread, which steps the device itself, so the
 * completion it makes reaches the program in one wake-up (not the progress
 * thread's and then this thread's).  It holds the device's lease meanwhile
 * (sn_cq_wait_begin): the progress thread leaves what arrives to it and keeps the
 * timers.  For spin_ns from the call (the progress thread's busy poll after
 * traffic, SOFTNIC_PROGRESS_SPIN_US) it looks at both without sleeping, as a
 * driver busy-polls its NIC (Linux's busy_poll): a peer's answer that lands
 * meanwhile costs neither side the wake-up of a sleeping thread (on a virtual
 * machine an idle vCPU's, which the sender pays inside its sendmsg).  The wait is
 * in C, and the only cancellation point of the call: programs cancel a thread
 * blocked here (rping stops its CQ thread with pthread_cancel), which unwinds C
 * frames only, and the cleanup handler gives the lease back.
 * 0: an event waits on the channel (read it); else an errno. */
static int sn_cq_wait(struct sn_channel *c)
{
    int sock = -1, err, ret = 0;
    int64_t spin_ns = 0;
    err = sn_cq_wait_begin(c->handle, &sock, &spin_ns);
    if (err)
        return err;
    if (sock < 0)
        return 0;                         /* (a device without it: read() waits) */
    int64_t spin_until = spin_ns > 0 ? sn_mono_ns() + spin_ns : 0;
    pthread_cleanup_push(sn_cq_wait_cancelled, c);
    for (;;) {
        struct pollfd p[2] = {{c->ch.fd, POLLIN, 0}, {sock, POLLIN, 0}};
        int n = 0, spun = 0;
        while (spin_until && n == 0 && sn_mono_ns() < spin_until) {
            n = poll(p, 2, 0);           /* spinning: look, do not sleep */
            spun = n > 0;
        }
        if (n == 0)
            n = poll(p, 2, 1000);         /* (each second: the lease renewed) */
        if (n < 0) {
            int e = errno;               /* (sn_signal_interrupts may change errno) */
            if (e == EINTR && !sn_signal_interrupts())
                continue;
            ret = e;
            break;
        }
        if (p[0].revents & POLLIN)
            break;
        if (p[0].revents & (POLLERR | POLLNVAL)) {
            ret = EBADF;
            break;
        }
        /* a datagram (or a second without): step the device here */
        err = sn_cq_wait_step(c->handle, spun);
        if (err) {
            ret = err;
            break;
        }
    }
    pthread_cleanup_pop(0);
    err = sn_cq_wait_end(c->handle);
    return ret ? ret : err;
}

SN_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq,
                               void **cq_context)
{
    struct sn_channel *c = (struct sn_channel *)channel;
    void *cookie = NULL;
    uint64_t one;
    void *gil = sn_gil_release();         /* a Python caller: its other threads run meanwhile */
    int fl = fcntl(channel->fd, F_GETFL);
    int err = fl >= 0 && !(fl & O_NONBLOCK) ? sn_cq_wait(c) : 0;
    ssize_t n = -1;
    int read_errno = err;
    if (!err) {
        n = read(channel->fd, &one, sizeof(one));
        read_errno = errno;
    }
    sn_gil_restore(gil);
    if (n != sizeof(one)) {
        errno = read_errno;
        return -1;                        /* EAGAIN on a non-blocking channel, as the kernel's */
    }
    err = sn_get_cq_event(c->handle, &cookie);
    if (err || !cookie) {
        errno = err ? err : EIO;
        return -1;
    }
    *cq = ibv_cq_ex_to_cq(&((struct sn_cq *)cookie)->cqx);
    *cq_context = (*cq)->cq_context;
    return 0;
}

SN_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
    pthread_mutex_lock(&cq->mutex);
    cq->comp_events_completed += nevents;
    pthread_cond_signal(&cq->cond);
    pthread_mutex_unlock(&cq->mutex);
}

/* extended polling: one completion at a time, read through the read_* calls */

static inline struct sn_cq *to_scq(struct ibv_cq_ex *cq) { return (struct sn_cq *)cq; }

static int sn_cq_idle(struct sn_cq *s, int *seen);

static int sn_cqx_fetch(struct ibv_cq_ex *cq)
{
    struct sn_cq *s = to_scq(cq);
    int seen = 0;
    if (sn_cq_idle(s, &seen))
        return ENOENT;
    int got = sn_poll_cq(cq->handle, 1, &s->cur, seen);
    if (got < 0)
        return EINVAL;
    if (got == 0)
        return ENOENT;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
    s->cur_ts = (uint64_t)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
    cq->wr_id = s->cur.wr_id;
    cq->status = s->cur.status;
    return 0;
}

static int sn_cqx_start_poll(struct ibv_cq_ex *cq, struct ibv_poll_cq_attr *attr)
{
    if (attr && attr->comp_mask)
        return EINVAL;
    return sn_cqx_fetch(cq);
}

static int sn_cqx_next_poll(struct ibv_cq_ex *cq) { return sn_cqx_fetch(cq); }
static void sn_cqx_end_poll(struct ibv_cq_ex *cq) { (void)cq; }
static enum ibv_wc_opcode sn_cqx_read_opcode(struct ibv_cq_ex *cq) { return to_scq(cq)->cur.opcode; }
static uint32_t sn_cqx_read_vendor_err(struct ibv_cq_ex *cq) { return to_scq(cq)->cur.vendor_err; }
static uint32_t sn_cqx_read_byte_len(struct ibv_cq_ex *cq) { return to_scq(cq)->cur.byte_len; }
static __be32 sn_cqx_read_imm_data(struct ibv_cq_ex *cq)
{
    struct sn_cq *s = to_scq(cq);
    return (s->cur.wc_flags & IBV_WC_WITH_INV) ? s->cur.imm_data : htonl(s->cur.imm_data);
}
static uint32_t sn_cqx_read_qp_num(struct ibv_cq_ex *cq) { return to_scq(cq)->cur.qp_num; }
static uint32_t sn_cqx_read_src_qp(struct ibv_cq_ex *cq) { return to_scq(cq)->cur.src_qp; }
static unsigned int sn_cqx_read_wc_flags(struct ibv_cq_ex *cq) { return to_scq(cq)->cur.wc_flags; }
static uint32_t sn_cqx_read_slid(struct ibv_cq_ex *cq) { return to_scq(cq)->cur.slid; }
static uint8_t sn_cqx_read_sl(struct ibv_cq_ex *cq) { return to_scq(cq)->cur.sl; }
static uint8_t sn_cqx_read_dlid_path_bits(struct ibv_cq_ex *cq) { return to_scq(cq)->cur.dlid_path_bits; }
static uint64_t sn_cqx_read_completion_ts(struct ibv_cq_ex *cq) { return to_scq(cq)->cur_ts; }
static uint64_t sn_cqx_read_completion_wallclock_ns(struct ibv_cq_ex *cq) { return to_scq(cq)->cur_ts; }

/* ------------------------------------------------------------------ SRQ */

static struct ibv_srq *sn_new_srq(struct ibv_pd *pd, void *srq_context, struct ibv_srq_attr *a)
{
    struct ibv_srq *srq = calloc(1, sizeof(*srq));
    uint32_t h;
    if (!srq)
        return sn_fail_ptr(ENOMEM);
    int err = sn_create_srq(pd->handle, a->max_wr, a->max_sge, a->srq_limit, srq, &h);
    if (err)
        return sn_unmade(srq, err);
    srq->context = pd->context;
    srq->srq_context = srq_context;
    srq->pd = pd;
    srq->handle = h;
    pthread_mutex_init(&srq->mutex, NULL);
    pthread_cond_init(&srq->cond, NULL);
    return srq;
}

SN_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
    return sn_new_srq(pd, attr->srq_context, &attr->attr);
}

static struct ibv_srq *sn_vctx_create_srq_ex(struct ibv_context *ctx,
                                             struct ibv_srq_init_attr_ex *attr)
{
    (void)ctx;
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD))
        return sn_fail_ptr(EINVAL);
    if ((attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && attr->srq_type == IBV_SRQT_XRC)
        return sn_new_xrc_srq(attr);
    if ((attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && attr->srq_type != IBV_SRQT_BASIC)
        return sn_fail_ptr(EOPNOTSUPP);
    return sn_new_srq(attr->pd, attr->srq_context, &attr->attr);
}

static int sn_vctx_get_srq_num(struct ibv_srq *srq, uint32_t *srq_num)
{
    return sn_srq_num(srq->handle, srq_num);     /* the number an XRCETH names */
}

SN_EXPORT int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int attr_mask)
{
    return sn_modify_srq(srq->handle, attr->max_wr, attr->srq_limit, attr_mask);
}

SN_EXPORT int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr)
{
    return sn_query_srq(srq->handle, &attr->max_wr, &attr->max_sge, &attr->srq_limit);
}

SN_EXPORT int ibv_destroy_srq(struct ibv_srq *srq)
{
    return sn_destroyed(sn_destroy_srq(srq->handle), srq);
}

/* Work requests of a chain that one call into Python posts (a longer chain takes
 * more calls; its order and its first refused WR are kept across them). */
#define SN_POST_BATCH 32

typedef int (*sn_recv_list_fn)(uint32_t h, struct sn_recv_wr *wrs, int n, int *done);

/* ibv_post_recv / ibv_post_srq_recv: the chain in order, SN_POST_BATCH at a time; on
 * the first WR refused, *bad is that WR and the ones before it stay posted, as
 * mlx5 leaves them (its doorbell rung for the WQEs built before the bad one). */
static int sn_post_recv_chain(sn_recv_list_fn post, uint32_t h, struct ibv_recv_wr *wr,
                              struct ibv_recv_wr **bad)
{
    struct sn_recv_wr buf[SN_POST_BATCH];
    struct ibv_recv_wr *src[SN_POST_BATCH];
    while (wr) {
        int n = 0, done = 0;
        for (; wr && n < SN_POST_BATCH; wr = wr->next, n++) {
            buf[n].wr_id = wr->wr_id;
            buf[n].sg_list = (struct sn_sge *)wr->sg_list;
            buf[n].num_sge = wr->num_sge;
            src[n] = wr;
        }
        int err = post(h, buf, n, &done);
        if (err) {
            *bad = src[done >= 0 && done < n ? done : 0];
            return err;
        }
    }
    return 0;
}

static int sn_op_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr,
                               struct ibv_recv_wr **bad)
{
    return sn_post_recv_chain(sn_post_srq_recv_list, srq->handle, wr, bad);
}

/* ------------------------------------------------------------------ QP */

static void sn_qpx_install(struct sn_qp *s);

/* the ibv_wr_* builders softnic posts, per QP type (send_ops_flags) */
#define SN_UD_SEND_OPS (IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM)
#define SN_UC_SEND_OPS (SN_UD_SEND_OPS | IBV_QP_EX_WITH_RDMA_WRITE | \
                        IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND_WITH_INV | \
                        IBV_QP_EX_WITH_BIND_MW)
#define SN_RC_SEND_OPS (SN_UC_SEND_OPS | IBV_QP_EX_WITH_RDMA_READ | \
                        IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | \
                        IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_LOCAL_INV | \
                        IBV_QP_EX_WITH_ATOMIC_WRITE | SN_QP_EX_WITH_FLUSH)

static struct ibv_qp *sn_new_qp(struct ibv_pd *pd, struct ibv_qp_init_attr_ex *a, int is_ex)
{
    struct sn_qp *s;
    struct sn_qp_init init;
    uint32_t h, qpn;
    if (a->qp_type != IBV_QPT_RC && a->qp_type != IBV_QPT_UC && a->qp_type != IBV_QPT_UD)
        return sn_fail_ptr(EOPNOTSUPP);
    if (!a->send_cq || !a->recv_cq)
        return sn_fail_ptr(EINVAL);
    s = calloc(1, sizeof(*s));
    if (!s)
        return sn_fail_ptr(ENOMEM);
    memset(&init, 0, sizeof(init));
    init.qp_type = a->qp_type;
    init.send_cq = a->send_cq->handle;
    init.recv_cq = a->recv_cq->handle;
    init.srq = a->srq ? a->srq->handle : 0;
    init.sq_sig_all = a->sq_sig_all;
    init.cap.max_send_wr = a->cap.max_send_wr;
    init.cap.max_recv_wr = a->cap.max_recv_wr;
    init.cap.max_send_sge = a->cap.max_send_sge;
    init.cap.max_recv_sge = a->cap.max_recv_sge;
    init.cap.max_inline_data = a->cap.max_inline_data;
    int err = sn_create_qp(pd->handle, &init, s, &h, &qpn);
    if (err)
        return sn_unmade(s, err);
    a->cap.max_send_wr = init.cap.max_send_wr;
    a->cap.max_recv_wr = init.cap.max_recv_wr;
    a->cap.max_send_sge = init.cap.max_send_sge;
    a->cap.max_recv_sge = init.cap.max_recv_sge;
    a->cap.max_inline_data = init.cap.max_inline_data;
    struct ibv_qp *qp = &s->qpx.qp_base;
    qp->context = pd->context;
    qp->qp_context = a->qp_context;
    qp->pd = pd;
    qp->send_cq = a->send_cq;
    qp->recv_cq = a->recv_cq;
    qp->srq = a->srq;
    qp->handle = h;
    qp->qp_num = qpn;
    qp->state = IBV_QPS_RESET;
    qp->qp_type = a->qp_type;
    pthread_mutex_init(&qp->mutex, NULL);
    pthread_cond_init(&qp->cond, NULL);
    s->is_ex = is_ex;
    if (is_ex)
        sn_qpx_install(s);
    return qp;
}

SN_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    struct ibv_qp_init_attr_ex a;
    memset(&a, 0, sizeof(a));
    memcpy(&a, attr, sizeof(*attr));
    a.comp_mask = IBV_QP_INIT_ATTR_PD;
    a.pd = pd;
    struct ibv_qp *qp = a.qp_type == IBV_QPT_XRC_SEND ? sn_new_xrc_qp(&a)   /* an initiator */
                                                     : sn_new_qp(pd, &a, 0);
    if (qp)
        attr->cap = a.cap;
    return qp;
}

static struct ibv_qp *sn_vctx_create_qp_ex(struct ibv_context *ctx,
                                           struct ibv_qp_init_attr_ex *attr)
{
    if (attr->qp_type == IBV_QPT_XRC_SEND || attr->qp_type == IBV_QPT_XRC_RECV)
        return sn_new_xrc_qp(attr);
    (void)ctx;
    uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS |
                     IBV_QP_INIT_ATTR_CREATE_FLAGS;
    if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd)
        return sn_fail_ptr(EINVAL);
    /* creation flags and a TSO header are accepted when they ask for nothing */
    if ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags)
        return sn_fail_ptr(EOPNOTSUPP);
    if ((attr->comp_mask & IBV_QP_INIT_ATTR_MAX_TSO_HEADER) && attr->max_tso_header)
        return sn_fail_ptr(EOPNOTSUPP);
    known |= IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_MAX_TSO_HEADER;
    if (attr->comp_mask & ~known)
        return sn_fail_ptr(EOPNOTSUPP);
    if ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags)
        return sn_fail_ptr(EOPNOTSUPP);
    /* as rxe: a QP is refused if it asks for a builder its type cannot post */
    if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
        uint64_t ok = attr->qp_type == IBV_QPT_RC ? SN_RC_SEND_OPS
                    : attr->qp_type == IBV_QPT_UC ? SN_UC_SEND_OPS
                    : attr->qp_type == IBV_QPT_UD ? SN_UD_SEND_OPS : 0;
        if (attr->send_ops_flags & ~ok)
            return sn_fail_ptr(EOPNOTSUPP);
    }
    int is_ex = (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0;
    return sn_qpx_trim(sn_new_qp(attr->pd, attr, is_ex), is_ex ? attr->send_ops_flags : 0);
}

SN_EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
    struct sn_qp *s = (struct sn_qp *)qp;
    return s->is_ex ? &s->qpx : NULL;
}

SN_EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
    struct sn_qp_attr s;
    memset(&s, 0, sizeof(s));
    s.qp_state = attr->qp_state;
    s.cur_qp_state = attr->cur_qp_state;
    s.path_mtu = attr->path_mtu;
    s.path_mig_state = attr->path_mig_state;
    s.qkey = attr->qkey;
    s.rq_psn = attr->rq_psn;
    s.sq_psn = attr->sq_psn;
    s.dest_qp_num = attr->dest_qp_num;
    s.qp_access_flags = attr->qp_access_flags;
    sn_ah_from_ibv(&s.ah, &attr->ah_attr);
    s.pkey_index = attr->pkey_index;
    s.en_sqd_async_notify = attr->en_sqd_async_notify;
    s.max_rd_atomic = attr->max_rd_atomic;
    s.max_dest_rd_atomic = attr->max_dest_rd_atomic;
    s.min_rnr_timer = attr->min_rnr_timer;
    s.port_num = attr->port_num;
    s.timeout = attr->timeout;
    s.retry_cnt = attr->retry_cnt;
    s.rnr_retry = attr->rnr_retry;
    int err = sn_modify_qp(qp->handle, &s, attr_mask);
    if (!err && (attr_mask & IBV_QP_STATE))
        qp->state = attr->qp_state;
    return err;
}

SN_EXPORT int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
                           struct ibv_qp_init_attr *init_attr)
{
    struct sn_qp_attr s;
    struct sn_qp_init i;
    (void)attr_mask;
    memset(&s, 0, sizeof(s));
    memset(&i, 0, sizeof(i));
    int err = sn_query_qp(qp->handle, &s, &i);
    if (err)
        return err;
    memset(attr, 0, sizeof(*attr));
    attr->qp_state = s.qp_state;
    attr->cur_qp_state = s.cur_qp_state;
    attr->path_mtu = s.path_mtu;
    attr->path_mig_state = s.path_mig_state;
    attr->qkey = s.qkey;
    attr->rq_psn = s.rq_psn;
    attr->sq_psn = s.sq_psn;
    attr->dest_qp_num = s.dest_qp_num;
    attr->qp_access_flags = s.qp_access_flags;
    attr->cap.max_send_wr = s.cap.max_send_wr;
    attr->cap.max_recv_wr = s.cap.max_recv_wr;
    attr->cap.max_send_sge = s.cap.max_send_sge;
    attr->cap.max_recv_sge = s.cap.max_recv_sge;
    attr->cap.max_inline_data = s.cap.max_inline_data;
    sn_ah_to_ibv(&attr->ah_attr, &s.ah);
    attr->pkey_index = s.pkey_index;
    attr->en_sqd_async_notify = s.en_sqd_async_notify;
    attr->sq_draining = s.sq_draining;
    attr->max_rd_atomic = s.max_rd_atomic;
    attr->max_dest_rd_atomic = s.max_dest_rd_atomic;
    attr->min_rnr_timer = s.min_rnr_timer;
    attr->port_num = s.port_num;
    attr->timeout = s.timeout;
    attr->retry_cnt = s.retry_cnt;
    attr->rnr_retry = s.rnr_retry;
    qp->state = s.qp_state;
    if (init_attr) {
        memset(init_attr, 0, sizeof(*init_attr));
        init_attr->qp_context = qp->qp_context;
        init_attr->send_cq = qp->send_cq;
        init_attr->recv_cq = qp->recv_cq;
        init_attr->srq = qp->srq;
        init_attr->cap = attr->cap;
        init_attr->qp_type = qp->qp_type;
        init_attr->sq_sig_all = i.sq_sig_all;
    }
    return 0;
}

SN_EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
    struct sn_qp *s = (struct sn_qp *)qp;
    int err = sn_destroy_qp(qp->handle);
    if (err)
        return err;
    for (int i = 0; i < s->npend; i++)
        free(s->pend[i].inline_buf);
    free(s->pend);
    free(s);
    return 0;
}

/* UD multicast: the QP joins or leaves a group (softnic/driver/mcast.py); the LID is
 * unused on RoCE. */
SN_EXPORT int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
    (void)lid;
    if (!qp || !gid)
        return EINVAL;
    return sn_mcast(qp->handle, gid->raw, 1);
}

SN_EXPORT int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
    (void)lid;
    if (!qp || !gid)
        return EINVAL;
    return sn_mcast(qp->handle, gid->raw, 0);
}

static int sn_post_bind_mw(struct ibv_qp *qp, struct ibv_send_wr *wr);
static void sn_wr_bind_mw(struct ibv_qp_ex *q, struct ibv_mw *mw, uint32_t rkey,
                          const struct ibv_mw_bind_info *info);
static void sn_wr_atomic_write(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr,
                               const void *atomic_wr);
static void sn_wr_set_xrc_srqn(struct ibv_qp_ex *q, uint32_t remote_srqn);

/* The flat record of one WR of ibv_post_send (not BIND_MW: sn_post_bind_mw). */
static void sn_send_record(struct ibv_qp *qp, struct ibv_send_wr *wr, struct sn_send_wr *out)
{
    struct sn_send_wr s;
    memset(&s, 0, sizeof(s));
    s.wr_id = wr->wr_id;
    s.sg_list = (struct sn_sge *)wr->sg_list;
    s.num_sge = wr->num_sge;
    s.opcode = wr->opcode;
    s.send_flags = wr->send_flags;
    if (wr->opcode == IBV_WR_SEND_WITH_INV || wr->opcode == IBV_WR_LOCAL_INV)
        s.invalidate_rkey = wr->invalidate_rkey;
    else
        s.imm_data = ntohl(wr->imm_data);
    switch (wr->opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
        s.remote_addr = wr->wr.rdma.remote_addr;
        s.rkey = wr->wr.rdma.rkey;
        break;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
        s.remote_addr = wr->wr.atomic.remote_addr;
        s.rkey = wr->wr.atomic.rkey;
        s.compare_add = wr->wr.atomic.compare_add;
        s.swap = wr->wr.atomic.swap;
        break;
    default:
        break;
    }
    if (qp->qp_type == IBV_QPT_XRC_SEND)      /* the remote XRC SRQ, carried in remote_qpn */
        s.remote_qpn = wr->qp_type.xrc.remote_srqn;
    if (qp->qp_type == IBV_QPT_UD) {
        s.ah = wr->wr.ud.ah ? wr->wr.ud.ah->handle : 0;
        s.remote_qpn = wr->wr.ud.remote_qpn;
        s.remote_qkey = wr->wr.ud.remote_qkey;
    }
    *out = s;
}

/* ibv_post_send: the chain in order, SN_POST_BATCH WRs per call into Python (a
 * BIND_MW on its own); on the first WR refused, *bad is that WR and the ones before
 * it stay posted (mlx5's rule, as sn_post_recv_chain). */
static int sn_op_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    struct sn_send_wr buf[SN_POST_BATCH];
    struct ibv_send_wr *src[SN_POST_BATCH];
    while (wr) {
        int n = 0, done = 0, err;
        if (wr->opcode == IBV_WR_BIND_MW) {
            err = sn_post_bind_mw(qp, wr);
            if (err) {
                *bad = wr;
                return err;
            }
            wr = wr->next;
            continue;
        }
        for (; wr && n < SN_POST_BATCH && wr->opcode != IBV_WR_BIND_MW; wr = wr->next, n++) {
            sn_send_record(qp, wr, &buf[n]);
            src[n] = wr;
        }
        err = sn_post_send_list(qp->handle, buf, n, &done);
        if (err) {
            *bad = src[done >= 0 && done < n ? done : 0];
            return err;
        }
    }
    return 0;
}

static int sn_op_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    return sn_post_recv_chain(sn_post_recv_list, qp->handle, wr, bad);
}

/* the ibv_wr_* API: each builder call starts a WR; setters fill the last one;
 * ibv_wr_complete posts them all in order */

static inline struct sn_qp *to_sqp(struct ibv_qp_ex *q) { return (struct sn_qp *)q; }

static struct sn_pending *sn_wr_new(struct ibv_qp_ex *q, int opcode)
{
    struct sn_qp *s = to_sqp(q);
    if (s->npend == s->cap_pend) {
        int cap = s->cap_pend ? 2 * s->cap_pend : 16;
        struct sn_pending *p = realloc(s->pend, cap * sizeof(*p));
        if (!p) {
            s->wr_err = ENOMEM;
            return NULL;
        }
        s->pend = p;
        s->cap_pend = cap;
    }
    struct sn_pending *p = &s->pend[s->npend++];
    memset(p, 0, sizeof(*p));
    p->wr.wr_id = q->wr_id;
    p->wr.send_flags = q->wr_flags;
    p->wr.opcode = opcode;
    p->wr.sg_list = p->sge;
    return p;
}

static struct sn_pending *sn_wr_cur(struct ibv_qp_ex *q)
{
    struct sn_qp *s = to_sqp(q);
    if (!s->npend) {
        s->wr_err = EINVAL;
        return NULL;
    }
    return &s->pend[s->npend - 1];
}

static int sn_post_pending_bind(struct ibv_qp_ex *q, struct sn_send_wr *w);

static void sn_wr_start(struct ibv_qp_ex *q)
{
    struct sn_qp *s = to_sqp(q);
    for (int i = 0; i < s->npend; i++)
        free(s->pend[i].inline_buf);
    s->npend = 0;
    s->wr_err = 0;
}

static void sn_wr_abort(struct ibv_qp_ex *q) { sn_wr_start(q); }

static int sn_wr_complete(struct ibv_qp_ex *q)
{
    struct sn_qp *s = to_sqp(q);
    int err = s->wr_err;
    for (int i = 0; i < s->npend && !err; i++)
        err = s->pend[i].wr.opcode == IBV_WR_BIND_MW ? sn_post_pending_bind(q, &s->pend[i].wr)
                                                     : sn_post_send(q->qp_base.handle,
                                                                    &s->pend[i].wr);
    sn_wr_start(q);
    return err;
}

static void sn_wr_rdma(struct ibv_qp_ex *q, int op, uint32_t rkey, uint64_t addr, uint32_t imm)
{
    struct sn_pending *p = sn_wr_new(q, op);
    if (p) {
        p->wr.rkey = rkey;
        p->wr.remote_addr = addr;
        p->wr.imm_data = imm;
    }
}

static void sn_wr_rdma_write(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr)
{
    sn_wr_rdma(q, IBV_WR_RDMA_WRITE, rkey, addr, 0);
}

static void sn_wr_rdma_write_imm(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr, __be32 imm)
{
    sn_wr_rdma(q, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, addr, ntohl(imm));
}

static void sn_wr_rdma_read(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr)
{
    sn_wr_rdma(q, IBV_WR_RDMA_READ, rkey, addr, 0);
}

static void sn_wr_atomic_cmp_swp(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr,
                                 uint64_t compare, uint64_t swap)
{
    struct sn_pending *p = sn_wr_new(q, IBV_WR_ATOMIC_CMP_AND_SWP);
    if (p) {
        p->wr.rkey = rkey;
        p->wr.remote_addr = addr;
        p->wr.compare_add = compare;
        p->wr.swap = swap;
    }
}

static void sn_wr_atomic_fetch_add(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr,
                                   uint64_t add)
{
    struct sn_pending *p = sn_wr_new(q, IBV_WR_ATOMIC_FETCH_AND_ADD);
    if (p) {
        p->wr.rkey = rkey;
        p->wr.remote_addr = addr;
        p->wr.compare_add = add;
    }
}

static void sn_wr_send(struct ibv_qp_ex *q) { sn_wr_new(q, IBV_WR_SEND); }

static void sn_wr_send_imm(struct ibv_qp_ex *q, __be32 imm)
{
    struct sn_pending *p = sn_wr_new(q, IBV_WR_SEND_WITH_IMM);
    if (p)
        p->wr.imm_data = ntohl(imm);
}

static void sn_wr_send_inv(struct ibv_qp_ex *q, uint32_t rkey)
{
    struct sn_pending *p = sn_wr_new(q, IBV_WR_SEND_WITH_INV);
    if (p)
        p->wr.invalidate_rkey = rkey;
}

static void sn_wr_local_inv(struct ibv_qp_ex *q, uint32_t rkey)
{
    struct sn_pending *p = sn_wr_new(q, IBV_WR_LOCAL_INV);
    if (p)
        p->wr.invalidate_rkey = rkey;
}

static void sn_wr_set_ud_addr(struct ibv_qp_ex *q, struct ibv_ah *ah, uint32_t remote_qpn,
                              uint32_t remote_qkey)
{
    struct sn_pending *p = sn_wr_cur(q);
    if (p) {
        p->wr.ah = ah ? ah->handle : 0;
        p->wr.remote_qpn = remote_qpn;
        p->wr.remote_qkey = remote_qkey;
    }
}

static void sn_wr_set_sge_list(struct ibv_qp_ex *q, size_t n, const struct ibv_sge *sg)
{
    struct sn_pending *p = sn_wr_cur(q);
    if (!p)
        return;
    if (n > sizeof(p->sge) / sizeof(p->sge[0])) {
        to_sqp(q)->wr_err = EINVAL;
        return;
    }
    memcpy(p->sge, sg, n * sizeof(*sg));
    p->wr.num_sge = n;
}

static void sn_wr_set_sge(struct ibv_qp_ex *q, uint32_t lkey, uint64_t addr, uint32_t length)
{
    struct ibv_sge sge = { .addr = addr, .length = length, .lkey = lkey };
    sn_wr_set_sge_list(q, 1, &sge);
}

static void sn_wr_set_inline_data_list(struct ibv_qp_ex *q, size_t n,
                                       const struct ibv_data_buf *bufs)
{
    struct sn_pending *p = sn_wr_cur(q);
    size_t total = 0, off = 0;
    if (!p)
        return;
    for (size_t i = 0; i < n; i++)
        total += bufs[i].length;
    free(p->inline_buf);
    p->inline_buf = malloc(total ? total : 1);
    if (!p->inline_buf) {
        to_sqp(q)->wr_err = ENOMEM;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        memcpy((char *)p->inline_buf + off, bufs[i].addr, bufs[i].length);
        off += bufs[i].length;
    }
    p->sge[0].addr = (uintptr_t)p->inline_buf;
    p->sge[0].length = total;
    p->sge[0].lkey = 0;
    p->wr.num_sge = 1;
    p->wr.send_flags |= IBV_SEND_INLINE;
}

static void sn_wr_set_inline_data(struct ibv_qp_ex *q, void *addr, size_t length)
{
    struct ibv_data_buf b = { .addr = addr, .length = length };
    sn_wr_set_inline_data_list(q, 1, &b);
}

/* A builder softnic does not provide (wr_send_tso, wr_set_xrc_srqn, wr_atomic_write,
 * and those of later headers): the WR list fails at wr_complete with EOPNOTSUPP and
 * nothing of it is posted. */
static void sn_wr_unsupported(struct ibv_qp_ex *q)
{
    to_sqp(q)->wr_err = EOPNOTSUPP;
}

static void sn_qpx_install(struct sn_qp *s)
{
    struct ibv_qp_ex *q = &s->qpx;
    q->wr_send_tso = (void *)sn_wr_unsupported;
    q->wr_set_xrc_srqn = (void *)sn_wr_unsupported;
    q->wr_atomic_write = (void *)sn_wr_unsupported;
    for (int i = 0; i < SN_QPX_SPARE; i++)
        s->spare_wr[i] = sn_wr_unsupported;
    q->wr_start = sn_wr_start;
    q->wr_complete = sn_wr_complete;
    q->wr_abort = sn_wr_abort;
    q->wr_rdma_write = sn_wr_rdma_write;
    q->wr_rdma_write_imm = sn_wr_rdma_write_imm;
    q->wr_rdma_read = sn_wr_rdma_read;
    q->wr_atomic_cmp_swp = sn_wr_atomic_cmp_swp;
    q->wr_atomic_fetch_add = sn_wr_atomic_fetch_add;
    q->wr_send = sn_wr_send;
    q->wr_send_imm = sn_wr_send_imm;
    q->wr_send_inv = sn_wr_send_inv;
    q->wr_local_inv = sn_wr_local_inv;
    q->wr_bind_mw = sn_wr_bind_mw;
    q->wr_atomic_write = sn_wr_atomic_write;
    q->wr_set_xrc_srqn = sn_wr_set_xrc_srqn;
    q->wr_set_ud_addr = sn_wr_set_ud_addr;
    q->wr_set_sge = sn_wr_set_sge;
    q->wr_set_sge_list = sn_wr_set_sge_list;
    q->wr_set_inline_data = sn_wr_set_inline_data;
    q->wr_set_inline_data_list = sn_wr_set_inline_data_list;
}

/* ------------------------------------------------------------------ async events */

SN_EXPORT int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
    int type = 0;
    void *cookie = NULL;
    int err = sn_get_async_event(ctx_handle(context), &type, &cookie);
    if (err) {
        errno = err;
        return -1;
    }
    memset(event, 0, sizeof(*event));
    event->event_type = type;
    switch (type) {
    case IBV_EVENT_CQ_ERR:
        event->element.cq = ibv_cq_ex_to_cq(&((struct sn_cq *)cookie)->cqx);
        break;
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED:
        event->element.srq = cookie;
        break;
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_PORT_ERR:
        event->element.port_num = 1;
        break;
    default:
        event->element.qp = &((struct sn_qp *)cookie)->qpx.qp_base;
        break;
    }
    return 0;
}

SN_EXPORT void ibv_ack_async_event(struct ibv_async_event *event) { (void)event; }

/* ------------------------------------------------------------------ no-ops and strings */

SN_EXPORT int ibv_fork_init(void) { return 0; }
SN_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }
SN_EXPORT int ibv_dontfork_range(void *base, size_t size) { (void)base; (void)size; return 0; }
SN_EXPORT int ibv_dofork_range(void *base, size_t size) { (void)base; (void)size; return 0; }
SN_EXPORT void verbs_register_driver_34(void *ops) { (void)ops; }
SN_EXPORT void ibv_register_driver(const char *name, void *init) { (void)name; (void)init; }
SN_EXPORT int verbs_allow_disassociate_destroy;

SN_EXPORT int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op,
                                         uint32_t flags)
{
    (void)qp; (void)op; (void)flags;
    return 0;     /* the responder places data in PSN order, but promises nothing more */
}

SN_EXPORT int ibv_resolve_eth_l2_from_gid(struct ibv_context *context,
                                          struct ibv_ah_attr *attr, uint8_t eth_mac[6],
                                          uint16_t *vid)
{
    (void)context; (void)attr;
    memset(eth_mac, 0, 6);       /* UDP carries the frames: no link-layer address */
    if (vid)
        *vid = 0xffff;
    return 0;
}

SN_EXPORT const char *ibv_node_type_str(enum ibv_node_type t)
{
    static const char *const names[] = {
        [IBV_NODE_CA] = "InfiniBand channel adapter", [IBV_NODE_SWITCH] = "InfiniBand switch",
        [IBV_NODE_ROUTER] = "InfiniBand router", [IBV_NODE_RNIC] = "iWARP NIC",
        [IBV_NODE_USNIC] = "usNIC", [IBV_NODE_USNIC_UDP] = "usNIC UDP",
        [IBV_NODE_UNSPECIFIED] = "unspecified",
    };
    if (t < IBV_NODE_CA || t > IBV_NODE_UNSPECIFIED || !names[t])
        return "unknown";
    return names[t];
}

SN_EXPORT const char *ibv_port_state_str(enum ibv_port_state s)
{
    static const char *const names[] = {"no state change (NOP)", "down", "init", "armed",
                                        "active", "active deferred"};
    if ((unsigned)s > IBV_PORT_ACTIVE_DEFER)
        return "unknown";
    return names[s];
}

SN_EXPORT const char *ibv_event_type_str(enum ibv_event_type e)
{
    static const char *const names[] = {
        "CQ error", "local work queue catastrophic error", "invalid request local work queue error",
        "local access violation work queue error", "communication established",
        "send queue drained", "path migrated", "path migration request error",
        "local catastrophic error", "port active", "port error", "LID change",
        "P_Key change", "SM change", "SRQ catastrophic error", "SRQ limit reached",
        "last WQE reached", "client reregistration", "GID table change",
        "WQ catastrophic error",
    };
    if ((unsigned)e >= sizeof(names) / sizeof(names[0]))
        return "unknown";
    return names[e];
}

SN_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status status)
{
    static const char *const names[] = {
        "success", "local length error", "local QP operation error",
        "local EE context operation error", "local protection error", "Work Request Flushed Error",
        "memory management operation error", "bad response error", "local access error",
        "remote invalid request error", "remote access error", "remote operation error",
        "transport retry counter exceeded", "RNR retry counter exceeded",
        "local RDD violation error", "remote invalid RD request", "aborted error",
        "invalid EE context number", "invalid EE context state", "fatal error",
        "response timeout error", "general error", "TM error", "TM rendezvous error",
    };
    if ((unsigned)status >= sizeof(names) / sizeof(names[0]))
        return "unknown";
    return names[status];
}

static const int sn_rate_mult[] = {
    [IBV_RATE_2_5_GBPS] = 1, [IBV_RATE_5_GBPS] = 2, [IBV_RATE_10_GBPS] = 4,
    [IBV_RATE_20_GBPS] = 8, [IBV_RATE_30_GBPS] = 12, [IBV_RATE_40_GBPS] = 16,
    [IBV_RATE_60_GBPS] = 24, [IBV_RATE_80_GBPS] = 32, [IBV_RATE_120_GBPS] = 48,
};

SN_EXPORT int ibv_rate_to_mult(enum ibv_rate rate)
{
    if ((unsigned)rate < sizeof(sn_rate_mult) / sizeof(sn_rate_mult[0]) && sn_rate_mult[rate])
        return sn_rate_mult[rate];
    return -1;
}

SN_EXPORT enum ibv_rate mult_to_ibv_rate(int mult)
{
    for (unsigned r = 0; r < sizeof(sn_rate_mult) / sizeof(sn_rate_mult[0]); r++)
        if (sn_rate_mult[r] == mult && mult)
            return r;
    return IBV_RATE_MAX;
}

SN_EXPORT int ibv_rate_to_mbps(enum ibv_rate rate)
{
    int m = ibv_rate_to_mult(rate);
    return m > 0 ? m * 2500 : -1;
}

SN_EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps)
{
    return mbps % 2500 ? IBV_RATE_MAX : mult_to_ibv_rate(mbps / 2500);
}

/* sysfs: softnic's devices have none (ibv_devinfo then leaves out board_id) */
SN_EXPORT int ibv_get_sysfs_path(char *buf, size_t len)
{
    (void)buf; (void)len;
    errno = ENOENT;
    return -1;
}

SN_EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
    (void)dir; (void)file; (void)buf; (void)size;
    errno = ENOENT;
    return -1;
}

SN_EXPORT int ibv_read_ibdev_sysfs_file(char *buf, size_t size, struct ibv_device *dev,
                                        const char *fnfmt, ...)
{
    (void)buf; (void)size; (void)dev; (void)fnfmt;
    errno = ENOENT;
    return -1;
}

/* ------------------------------------------------------------------ memory windows
 * Type 1 is bound by ibv_bind_mw and type 2 by an IBV_WR_BIND_MW work request; both are a
 * BIND_MW in the send queue, checked by the engine as rxe checks them (a refused bind
 * completes with IBV_WC_MW_BIND_ERR). */

static struct ibv_mw *sn_op_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
    uint32_t h = 0, rkey;
    int err = sn_alloc_mw(pd->handle, (int)type, &h, &rkey);
    struct ibv_mw *mw = sn_object_for(err, sizeof(*mw), sn_dealloc_mw, h);
    if (!mw)
        return NULL;
    mw->context = pd->context;
    mw->pd = pd;
    mw->rkey = rkey;
    mw->handle = h;
    mw->type = type;
    return mw;
}

static int sn_op_dealloc_mw(struct ibv_mw *mw)
{
    return sn_destroyed(sn_dealloc_mw(mw->handle), mw);
}

static int sn_bind(struct ibv_qp *qp, uint64_t wr_id, unsigned int flags, struct ibv_mw *mw,
                   uint32_t rkey, const struct ibv_mw_bind_info *info)
{
    if (!mw || !info || (!info->mr && info->length))
        return EINVAL;
    return sn_bind_mw(qp->handle, wr_id, flags, mw->rkey, rkey, info->mr ? info->mr->lkey : 0,
                      info->addr, info->length, info->mw_access_flags);
}

static int sn_post_bind_mw(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
    return sn_bind(qp, wr->wr_id, wr->send_flags, wr->bind_mw.mw, wr->bind_mw.rkey,
                   &wr->bind_mw.bind_info);
}

/* ibv_bind_mw (type 1): posted like rxe's provider posts it; the window's rkey moves to the
 * next key byte when the bind is queued. */
static int sn_op_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *bind)
{
    if (!mw || !bind || mw->type != IBV_MW_TYPE_1)
        return EINVAL;
    uint32_t rkey = ibv_inc_rkey(mw->rkey);
    int err = sn_bind(qp, bind->wr_id, bind->send_flags, mw, rkey, &bind->bind_info);
    if (!err)
        mw->rkey = rkey;
    return err;
}

static void sn_mw_ops(struct ibv_context *c)
{
    c->ops.alloc_mw = sn_op_alloc_mw;
    c->ops.dealloc_mw = sn_op_dealloc_mw;
    c->ops.bind_mw = sn_op_bind_mw;
}

/* ibv_wr_bind_mw: a pending BIND_MW keeps its fields in the pending WR's record (window's
 * rkey in invalidate_rkey, new rkey in rkey, MR lkey in imm_data, range in remote_addr and
 * compare_add, access in swap) until ibv_wr_complete posts it. */
static void sn_wr_bind_mw(struct ibv_qp_ex *q, struct ibv_mw *mw, uint32_t rkey,
                          const struct ibv_mw_bind_info *info)
{
    struct sn_pending *p = sn_wr_new(q, IBV_WR_BIND_MW);
    if (!p)
        return;
    if (!mw || !info || (!info->mr && info->length)) {
        to_sqp(q)->wr_err = EINVAL;
        return;
    }
    p->wr.invalidate_rkey = mw->rkey;
    p->wr.rkey = rkey;
    p->wr.imm_data = info->mr ? info->mr->lkey : 0;
    p->wr.remote_addr = info->addr;
    p->wr.compare_add = info->length;
    p->wr.swap = info->mw_access_flags;
}

static int sn_post_pending_bind(struct ibv_qp_ex *q, struct sn_send_wr *w)
{
    return sn_bind_mw(q->qp_base.handle, w->wr_id, w->send_flags, w->invalidate_rkey, w->rkey,
                      w->imm_data, w->remote_addr, w->compare_add, (unsigned int)w->swap);
}

/* ------------------------------------------------------------------ device memory
 * Emulated NIC-side memory: memory the library owns for the device (max_dm_size bytes per
 * device, counted here so that a forked child, whose engine is not running, allocates as
 * a parent does), written and read only in 4-byte words through ibv_memcpy_to/from_dm (as
 * mlx5), reached by the wire through a zero-based MR the engine registers over it.  It is
 * freed only once no MR is registered over it (EBUSY before). */

struct sn_dm {
    struct ibv_dm dm;
    uint8_t *buf;
    uint64_t length, map_len;
    int nmr;                       /* MRs registered over it */
    struct sn_dm *orig;            /* an imported DM: the one allocated (NULL: this one) */
    int nimport;                   /* imports of this one that live */
    struct sn_dm *next;            /* the allocated DMs, for ibv_import_dm */
};
static struct sn_dm *sn_dms;       /* under sn_dm_lock */
static uint32_t sn_dm_handles;

struct sn_dm_mr {                  /* an MR over device memory: SN_DM_MR in its access */
    struct sn_mr smr;
    struct sn_dm *dm;
};

static struct { struct ibv_device *dev; uint64_t size, used; } sn_dm_pool[SN_MAX_DEVICES];
static pthread_mutex_t sn_dm_lock = PTHREAD_MUTEX_INITIALIZER;

static int sn_dm_slot(struct ibv_context *ctx)     /* under sn_dm_lock */
{
    for (int i = 0; i < SN_MAX_DEVICES; i++) {
        if (sn_dm_pool[i].dev == ctx->device)
            return i;
        if (!sn_dm_pool[i].dev) {
            uint64_t size = 0;
            if (sn_dm_size(ctx_handle(ctx), &size))
                return -1;
            sn_dm_pool[i].dev = ctx->device;
            sn_dm_pool[i].size = size;
            return i;
        }
    }
    return -1;
}

static void sn_dm_caps(struct ibv_context *ctx, struct ibv_device_attr_ex *attr)
{   /* the caps of device memory (and of XRC's and implicit ODP), set after the rest */
    pthread_mutex_lock(&sn_dm_lock);
    int i = sn_dm_slot(ctx);
    if (i >= 0)
        attr->max_dm_size = sn_dm_pool[i].size;
    pthread_mutex_unlock(&sn_dm_lock);
    /* an implicit MR reaches any address the process's mapping allows */
    attr->odp_caps.general_caps |= IBV_ODP_SUPPORT_IMPLICIT;
    /* XRC reaches memory as RC does: on demand, never pinned */
    attr->xrc_odp_caps = attr->odp_caps.per_transport_caps.rc_odp_caps;
}

static int sn_dm_range(struct ibv_dm *dm, uint64_t offset, size_t length)
{
    struct sn_dm *d = (struct sn_dm *)dm;
    if ((offset & 3) || (length & 3) || offset > d->length || length > d->length - offset)
        return EINVAL;
    return 0;
}

static int sn_memcpy_to_dm(struct ibv_dm *dm, uint64_t offset, const void *host, size_t length)
{
    int err = sn_dm_range(dm, offset, length);
    if (!err && length)
        memcpy(((struct sn_dm *)dm)->buf + offset, host, length);
    return err;
}

static int sn_memcpy_from_dm(void *host, struct ibv_dm *dm, uint64_t offset, size_t length)
{
    int err = sn_dm_range(dm, offset, length);
    if (!err && length)
        memcpy(host, ((struct sn_dm *)dm)->buf + offset, length);
    return err;
}

static struct ibv_dm *sn_vctx_alloc_dm(struct ibv_context *ctx, struct ibv_alloc_dm_attr *attr)
{
    if (!attr || attr->comp_mask || !attr->length || attr->log_align_req > 12)
        return sn_fail_ptr(EINVAL);
    pthread_mutex_lock(&sn_dm_lock);
    int i = sn_dm_slot(ctx);
    int err = i < 0 ? EIO : attr->length > sn_dm_pool[i].size - sn_dm_pool[i].used ? ENOMEM : 0;
    if (!err)
        sn_dm_pool[i].used += attr->length;
    pthread_mutex_unlock(&sn_dm_lock);
    if (err)
        return sn_fail_ptr(err);
    struct sn_dm *d = calloc(1, sizeof(*d));
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t map_len = (attr->length + page - 1) / page * page;
    void *buf = d ? mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                         -1, 0) : MAP_FAILED;
    if (buf == MAP_FAILED) {
        free(d);
        pthread_mutex_lock(&sn_dm_lock);
        sn_dm_pool[i].used -= attr->length;
        pthread_mutex_unlock(&sn_dm_lock);
        return sn_fail_ptr(ENOMEM);
    }
    d->dm.context = ctx;
    d->dm.memcpy_to_dm = sn_memcpy_to_dm;
    d->dm.memcpy_from_dm = sn_memcpy_from_dm;
    d->buf = buf;
    d->length = attr->length;
    d->map_len = map_len;
    pthread_mutex_lock(&sn_dm_lock);
    d->dm.handle = ++sn_dm_handles;
    d->next = sn_dms;
    sn_dms = d;
    pthread_mutex_unlock(&sn_dm_lock);
    return &d->dm;
}

/* ibv_import_dm: the device memory of handle (a DM allocated on this device, in this
 * process), seen through another context; ibv_unimport_dm lets it go, the memory stays
 * with the DM allocated.  An unknown handle is EINVAL, as the kernel's lookup says. */
SN_EXPORT struct ibv_dm *ibv_import_dm(struct ibv_context *ctx, uint32_t dm_handle)
{
    if (!ctx)
        return sn_fail_ptr(EINVAL);
    struct sn_dm *n = calloc(1, sizeof(*n));
    if (!n)
        return sn_fail_ptr(ENOMEM);
    pthread_mutex_lock(&sn_dm_lock);
    struct sn_dm *d = sn_dms;
    while (d && !(d->dm.handle == dm_handle && d->dm.context->device == ctx->device))
        d = d->next;
    if (d)
        d->nimport++;
    pthread_mutex_unlock(&sn_dm_lock);
    if (!d) {
        free(n);
        return sn_fail_ptr(EINVAL);
    }
    *n = *d;
    n->dm.context = ctx;
    n->nmr = 0;
    n->nimport = 0;
    n->next = NULL;
    n->orig = d;
    return &n->dm;
}

SN_EXPORT void ibv_unimport_dm(struct ibv_dm *dm)
{
    struct sn_dm *n = (struct sn_dm *)dm;
    if (!n || !n->orig)
        return;
    pthread_mutex_lock(&sn_dm_lock);
    n->orig->nimport--;
    pthread_mutex_unlock(&sn_dm_lock);
    free(n);
}

static int sn_vctx_free_dm(struct ibv_dm *dm)
{
    struct sn_dm *d = (struct sn_dm *)dm;
    pthread_mutex_lock(&sn_dm_lock);
    /* (an imported DM's memory is its allocator's: it is let go by ibv_unimport_dm) */
    int busy = d->nmr > 0 || d->nimport > 0 || d->orig;
    if (!busy) {
        for (int i = 0; i < SN_MAX_DEVICES; i++)
            if (sn_dm_pool[i].dev == dm->context->device)
                sn_dm_pool[i].used -= d->length;
        for (struct sn_dm **p = &sn_dms; *p; p = &(*p)->next)
            if (*p == d) {
                *p = d->next;
                break;
            }
    }
    pthread_mutex_unlock(&sn_dm_lock);
    if (busy)
        return EBUSY;
    munmap(d->buf, d->map_len);
    free(d);
    return 0;
}

static struct ibv_mr *sn_vctx_reg_dm_mr(struct ibv_pd *pd, struct ibv_dm *dm, uint64_t offset,
                                        size_t length, unsigned int access)
{
    uint32_t h, lkey, rkey;
    struct sn_dm *d = (struct sn_dm *)dm;
    if (!dm)
        return sn_fail_ptr(EINVAL);
    int err = sn_reg_dm_mr(pd->handle, (uint64_t)(uintptr_t)d->buf, d->length, offset, length,
                           access, &h, &lkey, &rkey);
    if (err)
        return sn_fail_ptr(err);
    struct sn_dm_mr *m = calloc(1, sizeof(*m));
    if (!m) {
        sn_dereg_mr(h);
        return sn_fail_ptr(ENOMEM);
    }
    m->smr.access = access | SN_DM_MR;    /* ibv_dereg_mr finds the DM by it */
    m->dm = d;
    pthread_mutex_lock(&sn_dm_lock);
    d->nmr++;
    pthread_mutex_unlock(&sn_dm_lock);
    struct ibv_mr *mr = &m->smr.mr;
    mr->context = pd->context;
    mr->pd = pd;
    mr->addr = NULL;                /* zero-based */
    mr->length = length;
    mr->handle = h;
    mr->lkey = lkey;
    mr->rkey = rkey;
    return mr;
}

/* ibv_dereg_mr of an MR over device memory: the memory may be freed once none is left */
static void sn_dm_mr_gone(struct ibv_mr *mr)
{
    struct sn_dm_mr *m = (struct sn_dm_mr *)mr;
    pthread_mutex_lock(&sn_dm_lock);
    m->dm->nmr--;
    pthread_mutex_unlock(&sn_dm_lock);
}

static void sn_dm_ops(struct verbs_context *v)
{
    v->alloc_dm = sn_vctx_alloc_dm;
    v->free_dm = sn_vctx_free_dm;
    v->reg_dm_mr = sn_vctx_reg_dm_mr;
}

/* ibv_wr_atomic_write: 8 bytes placed as one (rxe since Linux 6.2); the pending WR keeps
 * them in its swap field until ibv_wr_complete posts it. */
static void sn_wr_atomic_write(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr,
                               const void *atomic_wr)
{
    struct sn_pending *p = sn_wr_new(q, IBV_WR_ATOMIC_WRITE);
    if (!p)
        return;
    if (!atomic_wr) {
        to_sqp(q)->wr_err = EINVAL;
        return;
    }
    p->wr.rkey = rkey;
    p->wr.remote_addr = addr;
    memcpy(&p->wr.swap, atomic_wr, 8);
}

/* ibv_wr_flush (rdma-core 45's qp_ex.wr_flush): the placement type and selectivity level
 * of a FLUSH of [addr, +len) of rkey's region; the pending WR carries len in compare_add
 * and type | level << 8 in swap (backend.py). */
static void sn_wr_flush(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr, size_t len,
                        uint8_t type, uint8_t level)
{
    struct sn_pending *p = sn_wr_new(q, SN_WR_FLUSH);
    if (!p)
        return;
    p->wr.rkey = rkey;
    p->wr.remote_addr = addr;
    p->wr.compare_add = len;
    p->wr.swap = (uint64_t)type | (uint64_t)level << 8;
}

/* ------------------------------------------------------------------ XRC
 * XRC domains (one per file on a device, shared by its openers), XRC SRQs, and XRC
 * initiator and target QPs: RC inside the engine, whose packets it turns into XRC ones
 * (the XRC opcodes, the XRCETH naming the remote XRC SRQ). */

struct sn_xrcd {
    struct ibv_xrcd xrcd;
    uint32_t handle;
};

static inline uint32_t xrcd_handle(struct ibv_xrcd *x) { return ((struct sn_xrcd *)x)->handle; }

static struct ibv_xrcd *sn_vctx_open_xrcd(struct ibv_context *ctx,
                                          struct ibv_xrcd_init_attr *attr)
{
    uint32_t h = 0;
    if (!attr || (attr->comp_mask & ~(IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS)))
        return sn_fail_ptr(EINVAL);
    int fd = (attr->comp_mask & IBV_XRCD_INIT_ATTR_FD) ? attr->fd : -1;
    int oflags = (attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS) ? attr->oflags : 0;
    int err = sn_open_xrcd(ctx_handle(ctx), fd, oflags, &h);
    struct sn_xrcd *x = sn_object_for(err, sizeof(*x), sn_close_xrcd, h);
    if (!x)
        return NULL;
    x->xrcd.context = ctx;
    x->handle = h;
    return &x->xrcd;
}

static int sn_vctx_close_xrcd(struct ibv_xrcd *xrcd)
{
    if (!xrcd)
        return EINVAL;
    return sn_destroyed(sn_close_xrcd(xrcd_handle(xrcd)), xrcd);
}

static struct ibv_srq *sn_new_xrc_srq(struct ibv_srq_init_attr_ex *attr)
{
    uint32_t need = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
    if ((attr->comp_mask & need) != need || !attr->pd || !attr->xrcd || !attr->cq)
        return sn_fail_ptr(EINVAL);
    struct ibv_srq *srq = sn_new_srq(attr->pd, attr->srq_context, &attr->attr);
    if (!srq)
        return NULL;
    int err = sn_make_xrc_srq(srq->handle, xrcd_handle(attr->xrcd), attr->cq->handle);
    if (err) {
        ibv_destroy_srq(srq);
        return sn_fail_ptr(err);
    }
    return srq;
}

static struct ibv_qp *sn_new_xrc_qp(struct ibv_qp_init_attr_ex *a)
{
    int tgt = a->qp_type == IBV_QPT_XRC_RECV;
    struct sn_qp_cap cap;
    uint32_t h, qpn, xh = 0;
    if (tgt ? !(a->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !a->xrcd
            : !(a->comp_mask & IBV_QP_INIT_ATTR_PD) || !a->pd || !a->send_cq)
        return sn_fail_ptr(EINVAL);
    if ((a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
        (tgt || (a->send_ops_flags & ~(uint64_t)(SN_RC_SEND_OPS & ~IBV_QP_EX_WITH_BIND_MW))))
        return sn_fail_ptr(EOPNOTSUPP);
    if (tgt)
        xh = xrcd_handle(a->xrcd);
    struct sn_qp *s = calloc(1, sizeof(*s));
    if (!s)
        return sn_fail_ptr(ENOMEM);
    memset(&cap, 0, sizeof(cap));
    cap.max_send_wr = a->cap.max_send_wr;
    cap.max_send_sge = a->cap.max_send_sge;
    cap.max_inline_data = a->cap.max_inline_data;
    int err = sn_create_xrc_qp(tgt ? 0 : a->pd->handle, xh, tgt, tgt ? 0 : a->send_cq->handle,
                               &cap, a->sq_sig_all, s, &h, &qpn);
    if (err)
        return sn_unmade(s, err);
    a->cap.max_send_wr = tgt ? 0 : cap.max_send_wr;
    a->cap.max_send_sge = tgt ? 0 : cap.max_send_sge;
    a->cap.max_recv_wr = a->cap.max_recv_sge = 0;
    a->cap.max_inline_data = cap.max_inline_data;
    struct ibv_qp *qp = &s->qpx.qp_base;
    qp->context = tgt ? a->xrcd->context : a->pd->context;
    qp->qp_context = a->qp_context;
    qp->pd = tgt ? NULL : a->pd;
    qp->send_cq = tgt ? NULL : a->send_cq;
    qp->handle = h;
    qp->qp_num = qpn;
    qp->state = IBV_QPS_RESET;
    qp->qp_type = a->qp_type;
    pthread_mutex_init(&qp->mutex, NULL);
    pthread_cond_init(&qp->cond, NULL);
    s->is_ex = !tgt && (a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0;
    if (s->is_ex)
        sn_qpx_install(s);
    return sn_qpx_trim(qp, s->is_ex ? a->send_ops_flags : 0);
}

static void sn_wr_set_xrc_srqn(struct ibv_qp_ex *q, uint32_t remote_srqn)
{
    struct sn_pending *p = sn_wr_cur(q);
    if (p)
        p->wr.remote_qpn = remote_srqn;
}

static void sn_xrc_ops(struct verbs_context *v)
{
    v->open_xrcd = sn_vctx_open_xrcd;
    v->close_xrcd = sn_vctx_close_xrcd;
}

/* ------------------------------------------------------------------ parent domains
 * ibv_alloc_parent_domain: a PD standing for attr->pd (objects made on it are in that
 * protection domain).  softnic keeps its queues inside the engine, not in user memory, so
 * it has no buffer to ask the allocators for and never calls them; thread domains are not
 * offered (no td). */

static struct ibv_pd *sn_vctx_alloc_parent_domain(struct ibv_context *ctx,
                                                  struct ibv_parent_domain_init_attr *attr)
{
    uint32_t h = 0;
    /* rdma-core 64's IBV_PARENT_DOMAIN_INIT_ATTR_ALLOW_CC_UNPROTECTED_ALLOC (memory shared
     * with a confidential guest's host): softnic has no memory of another kind to offer */
    if (attr && (attr->comp_mask & (1u << 2)))
        return sn_fail_ptr(EOPNOTSUPP);
    if (!attr || !attr->pd || (attr->comp_mask & ~(IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
                                                   IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT)))
        return sn_fail_ptr(EINVAL);
    if (attr->td)
        return sn_fail_ptr(EOPNOTSUPP);
    int err = sn_alias_pd(attr->pd->handle, &h);
    return sn_pd_for(err, ctx, h);
}

static void sn_pd_ops(struct verbs_context *v)
{
    v->alloc_parent_domain = sn_vctx_alloc_parent_domain;
}

/* As rxe: an ibv_qp_ex has the ATOMIC_WRITE, FLUSH and BIND_MW builders only if its send_ops_flags
 * asked for them, and wr_set_xrc_srqn only as an XRC initiator; elsewhere they fail the
 * WR list at wr_complete with EOPNOTSUPP. */
static struct ibv_qp *sn_qpx_trim(struct ibv_qp *qp, uint64_t send_ops_flags)
{
    struct sn_qp *s = (struct sn_qp *)qp;
    if (!qp || !s->is_ex)
        return qp;
    if (!(send_ops_flags & IBV_QP_EX_WITH_ATOMIC_WRITE))
        s->qpx.wr_atomic_write = (void *)sn_wr_unsupported;
    if (send_ops_flags & SN_QP_EX_WITH_FLUSH)
        s->spare_wr[0] = (void (*)(struct ibv_qp_ex *))sn_wr_flush;
    if (!(send_ops_flags & IBV_QP_EX_WITH_BIND_MW))
        s->qpx.wr_bind_mw = (void *)sn_wr_unsupported;
    if (qp->qp_type != IBV_QPT_XRC_SEND)
        s->qpx.wr_set_xrc_srqn = (void *)sn_wr_unsupported;
    return qp;
}
