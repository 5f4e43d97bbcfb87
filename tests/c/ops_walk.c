/* Walks every function pointer a program can reach in the objects a provider hands
 * out (ibv_context's ops, the verbs_context around it, ibv_qp_ex's wr_* builders,
 * ibv_cq_ex's poll and read calls), calls each one, and checks that none is NULL and
 * that each either works or fails the way rdma-core's dummy ops do (EOPNOTSUPP, or
 * NULL with errno EOPNOTSUPP; an op softnic provides, given no object, EINVAL).  Also
 * checks that a QP or CQ asking for what the provider cannot do is refused with
 * EOPNOTSUPP (as rxe does).  Prints one line per
 * pointer and "all N pointers answered" at the end; exits 1 at the first failure. */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int nptr;

static void die(const char *what)
{
    fprintf(stderr, "FAIL: %s (errno %d: %s)\n", what, errno, strerror(errno));
    exit(1);
}

#define CHECK(cond, what) do { if (!(cond)) die(what); } while (0)

static void nonnull(const void *p, const char *name)
{
    if (!p) {
        fprintf(stderr, "FAIL: %s is NULL\n", name);
        exit(1);
    }
    nptr++;
}

#define NONNULL(p, name) nonnull((const void *)(p), name)

static struct ibv_context *open_dev(int index)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n > index, "ibv_get_device_list: not enough devices");
    struct ibv_context *ctx = ibv_open_device(list[index]);
    CHECK(ctx, "ibv_open_device");
    ibv_free_device_list(list);
    return ctx;
}

/* An op softnic does not provide fails as rdma-core's dummy ops do (EOPNOTSUPP); one it
 * provides, called here with no object or attributes, refuses them (EINVAL).  Either
 * way it answers, never crashes and never succeeds. */
#define REFUSES(e) ((e) == EOPNOTSUPP || (e) == EINVAL)

/* an op returning int: EOPNOTSUPP (or EINVAL for the missing arguments) */
#define INT_NOSUP(call, name) do { \
    int r_ = (call); \
    if (!REFUSES(r_)) { fprintf(stderr, "FAIL: %s returned %d, not EOPNOTSUPP or EINVAL\n", \
                                name, r_); exit(1); } \
    printf("%-40s %s\n", name, r_ == EOPNOTSUPP ? "EOPNOTSUPP" : "EINVAL"); } while (0)

/* an op returning an object: NULL with errno EOPNOTSUPP (or EINVAL) */
#define PTR_NOSUP(call, name) do { \
    errno = 0; void *p_ = (void *)(call); \
    if (p_ || !REFUSES(errno)) { \
        fprintf(stderr, "FAIL: %s returned %p errno %d, not NULL/EOPNOTSUPP or EINVAL\n", \
                name, p_, errno); exit(1); } \
    printf("%-40s NULL, %s\n", name, errno == EOPNOTSUPP ? "EOPNOTSUPP" : "EINVAL"); } while (0)

/* what softnic must refuse as unsupported whatever else is implemented: EOPNOTSUPP */
#define PTR_EOPNOTSUPP(call, name) do { \
    errno = 0; void *p_ = (void *)(call); \
    if (p_ || errno != EOPNOTSUPP) { \
        fprintf(stderr, "FAIL: %s returned %p errno %d, not NULL/EOPNOTSUPP\n", name, p_, errno); \
        exit(1); } \
    printf("%-40s NULL, EOPNOTSUPP\n", name); } while (0)

#define OP(obj, f) (NONNULL((obj)->f, #f), (obj)->f)

int main(void)
{
    struct ibv_context *ctx = open_dev(0);
    struct verbs_context *v = verbs_get_ctx(ctx);
    CHECK(v, "verbs_get_ctx: not an extended context");
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd, "ibv_alloc_pd");
    struct ibv_context_ops *o = &ctx->ops;

    /* ibv_context ops */
    {
        struct ibv_device_attr da;
        CHECK(OP(o, _compat_query_device)(ctx, &da) == 0 && da.phys_port_cnt == 1,
              "ops._compat_query_device");
        struct ibv_port_attr pa;       /* the old layout is its first part */
        CHECK(OP(o, _compat_query_port)(ctx, 1, (struct _compat_ibv_port_attr *)&pa) == 0 &&
              pa.state == IBV_PORT_ACTIVE, "ops._compat_query_port");
        printf("%-40s works\n%-40s works\n", "ops._compat_query_device", "ops._compat_query_port");
    }
    {
        /* memory windows: allocated, a type-1 bind of no window refused, freed */
        struct ibv_mw *mw = OP(o, alloc_mw)(pd, IBV_MW_TYPE_1);
        CHECK(mw && mw->type == IBV_MW_TYPE_1, "ops.alloc_mw");
        CHECK(OP(o, bind_mw)(NULL, NULL, NULL) == EINVAL, "ops.bind_mw of no window: EINVAL");
        CHECK(OP(o, dealloc_mw)(mw) == 0, "ops.dealloc_mw");
        printf("%-40s works\n", "ops.alloc_mw, bind_mw, dealloc_mw");
    }
#define COMPAT(f) PTR_NOSUP(OP(o, f)(), "ops." #f)
    COMPAT(_compat_alloc_pd); COMPAT(_compat_dealloc_pd); COMPAT(_compat_reg_mr);
    COMPAT(_compat_rereg_mr); COMPAT(_compat_dereg_mr); COMPAT(_compat_create_cq);
    COMPAT(_compat_cq_event); COMPAT(_compat_resize_cq); COMPAT(_compat_destroy_cq);
    COMPAT(_compat_create_srq); COMPAT(_compat_modify_srq); COMPAT(_compat_query_srq);
    COMPAT(_compat_destroy_srq); COMPAT(_compat_create_qp); COMPAT(_compat_query_qp);
    COMPAT(_compat_modify_qp); COMPAT(_compat_destroy_qp); COMPAT(_compat_create_ah);
    COMPAT(_compat_destroy_ah); COMPAT(_compat_attach_mcast); COMPAT(_compat_detach_mcast);
    COMPAT(_compat_async_event);
    NONNULL(o->poll_cq, "ops.poll_cq");                 /* exercised below */
    NONNULL(o->req_notify_cq, "ops.req_notify_cq");
    NONNULL(o->post_srq_recv, "ops.post_srq_recv");
    NONNULL(o->post_send, "ops.post_send");
    NONNULL(o->post_recv, "ops.post_recv");

    /* verbs_context ops */
    {
        struct ibv_port_attr pa;
        CHECK(OP(v, query_port)(ctx, 1, &pa, sizeof(pa)) == 0 && pa.gid_tbl_len > 0,
              "query_port");
        struct ibv_device_attr_ex dx;
        CHECK(OP(v, query_device_ex)(ctx, NULL, &dx, sizeof(dx)) == 0, "query_device_ex");
        struct ibv_values_ex vals = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
        CHECK(OP(v, query_rt_values)(ctx, &vals) == 0, "query_rt_values");
        CHECK(OP(v, advise_mr)(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, NULL, 0) == 0, "advise_mr");
        NONNULL(v->create_qp_ex, "create_qp_ex");
        NONNULL(v->create_cq_ex, "create_cq_ex");
        NONNULL(v->create_srq_ex, "create_srq_ex");
        NONNULL(v->get_srq_num, "get_srq_num");
        printf("%-40s works\n", "query_port, query_device_ex, query_rt_values, advise_mr");
    }
    PTR_NOSUP(OP(v, alloc_null_mr)(pd), "alloc_null_mr");
    INT_NOSUP(OP(v, read_counters)(NULL, NULL, 0, 0), "read_counters");
    INT_NOSUP(OP(v, attach_counters_point_flow)(NULL, NULL, NULL), "attach_counters_point_flow");
    PTR_NOSUP(OP(v, create_counters)(ctx, NULL), "create_counters");
    INT_NOSUP(OP(v, destroy_counters)(NULL), "destroy_counters");
    {
        /* device memory: allocated, registered, freed */
        struct ibv_alloc_dm_attr da = { .length = 64 };
        struct ibv_dm *dm = OP(v, alloc_dm)(ctx, &da);
        CHECK(dm, "alloc_dm");
        struct ibv_mr *dmr = OP(v, reg_dm_mr)(pd, dm, 0, 64, IBV_ACCESS_ZERO_BASED |
                                              IBV_ACCESS_LOCAL_WRITE);
        CHECK(dmr, "reg_dm_mr");
        CHECK(ibv_dereg_mr(dmr) == 0 && OP(v, free_dm)(dm) == 0, "free_dm");
        printf("%-40s works\n", "alloc_dm, reg_dm_mr, free_dm");
    }
    INT_NOSUP(OP(v, modify_flow_action_esp)(NULL, NULL), "modify_flow_action_esp");
    INT_NOSUP(OP(v, destroy_flow_action)(NULL), "destroy_flow_action");
    PTR_NOSUP(OP(v, create_flow_action_esp)(ctx, NULL), "create_flow_action_esp");
    INT_NOSUP(OP(v, modify_qp_rate_limit)(NULL, NULL), "modify_qp_rate_limit");
    errno = 0;
    CHECK(!OP(v, alloc_parent_domain)(ctx, NULL) && errno == EINVAL,
          "alloc_parent_domain of no attributes: EINVAL");
    {   /* rdma-core 64's IBV_PARENT_DOMAIN_INIT_ATTR_ALLOW_CC_UNPROTECTED_ALLOC (1 << 2) */
        struct ibv_pd *cc_pd = ibv_alloc_pd(ctx);
        CHECK(cc_pd, "ibv_alloc_pd");
        struct ibv_parent_domain_init_attr cc = { .pd = cc_pd, .comp_mask = 1u << 2 };
        errno = 0;
        CHECK(!ibv_alloc_parent_domain(ctx, &cc) && errno == EOPNOTSUPP,
              "alloc_parent_domain for a confidential guest's shared memory: EOPNOTSUPP");
        cc.comp_mask = 1u << 3;
        errno = 0;
        CHECK(!ibv_alloc_parent_domain(ctx, &cc) && errno == EINVAL,
              "alloc_parent_domain with an unknown comp_mask bit: EINVAL");
        CHECK(ibv_dealloc_pd(cc_pd) == 0, "ibv_dealloc_pd");
    }
    INT_NOSUP(OP(v, dealloc_td)(NULL), "dealloc_td");
    PTR_NOSUP(OP(v, alloc_td)(ctx, NULL), "alloc_td");
    INT_NOSUP(OP(v, modify_cq)(NULL, NULL), "modify_cq");
    INT_NOSUP(OP(v, post_srq_ops)(NULL, NULL, NULL), "post_srq_ops");
    INT_NOSUP(OP(v, destroy_rwq_ind_table)(NULL), "destroy_rwq_ind_table");
    PTR_NOSUP(OP(v, create_rwq_ind_table)(ctx, NULL), "create_rwq_ind_table");
    INT_NOSUP(OP(v, destroy_wq)(NULL), "destroy_wq");
    INT_NOSUP(OP(v, modify_wq)(NULL, NULL), "modify_wq");
    PTR_NOSUP(OP(v, create_wq)(ctx, NULL), "create_wq");
    INT_NOSUP(OP(v, ibv_destroy_flow)(NULL), "ibv_destroy_flow");
    PTR_NOSUP(OP(v, ibv_create_flow)(NULL, NULL), "ibv_create_flow");
    PTR_NOSUP(((void *(*)(void))OP(v, ABI_placeholder1))(), "ABI_placeholder1");
    PTR_NOSUP(((void *(*)(void))OP(v, ABI_placeholder2))(), "ABI_placeholder2");
    PTR_NOSUP(OP(v, open_qp)(ctx, NULL), "open_qp");
    errno = 0;
    CHECK(!OP(v, open_xrcd)(ctx, NULL) && errno == EINVAL, "open_xrcd of no attributes: EINVAL");
    CHECK(OP(v, close_xrcd)(NULL) == EINVAL, "close_xrcd of no domain: EINVAL");
    /* and through rdma-core's inline wrappers */
    {
        /* with valid attributes: works (then freed) or EOPNOTSUPP */
        struct ibv_td_init_attr ta = { 0 };
        errno = 0;
        struct ibv_td *td = ibv_alloc_td(ctx, &ta);
        CHECK(td ? ibv_dealloc_td(td) == 0 : errno == EOPNOTSUPP, "ibv_alloc_td()");
        printf("%-40s %s\n", "ibv_alloc_td()", td ? "works" : "NULL, EOPNOTSUPP");
        struct ibv_xrcd_init_attr xa = { .comp_mask = IBV_XRCD_INIT_ATTR_FD |
                                         IBV_XRCD_INIT_ATTR_OFLAGS, .fd = -1,
                                         .oflags = O_CREAT };
        struct ibv_xrcd *xrcd = ibv_open_xrcd(ctx, &xa);
        CHECK(xrcd && ibv_close_xrcd(xrcd) == 0, "ibv_open_xrcd(), ibv_close_xrcd()");
        printf("%-40s works\n", "ibv_open_xrcd()");
    }

    /* ibv_cq_ex: refused flags, then every call */
    {
        struct ibv_cq_init_attr_ex ca = { .cqe = 16, .wc_flags = IBV_WC_EX_WITH_FLOW_TAG };
        PTR_EOPNOTSUPP(ibv_create_cq_ex(ctx, &ca), "create_cq_ex(WITH_FLOW_TAG)");
        ca.wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
        struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &ca);
        CHECK(cq, "ibv_create_cq_ex");
        struct ibv_poll_cq_attr pa = { 0 };
        CHECK(OP(cq, start_poll)(cq, &pa) == ENOENT, "start_poll of an empty CQ: ENOENT");
        CHECK(OP(cq, next_poll)(cq) == ENOENT, "next_poll of an empty CQ: ENOENT");
        NONNULL(cq->end_poll, "end_poll");
        /* the read_* calls read the last completion reached; none yet: zeros */
        (void)OP(cq, read_opcode)(cq); (void)OP(cq, read_vendor_err)(cq);
        (void)OP(cq, read_byte_len)(cq); (void)OP(cq, read_imm_data)(cq);
        (void)OP(cq, read_qp_num)(cq); (void)OP(cq, read_src_qp)(cq);
        (void)OP(cq, read_wc_flags)(cq); (void)OP(cq, read_slid)(cq); (void)OP(cq, read_sl)(cq);
        (void)OP(cq, read_dlid_path_bits)(cq); (void)OP(cq, read_completion_ts)(cq);
        (void)OP(cq, read_completion_wallclock_ns)(cq);
        CHECK(OP(cq, read_cvlan)(cq) == 0 && OP(cq, read_flow_tag)(cq) == 0, "read_cvlan/flow_tag");
        struct ibv_wc_tm_info tm;
        memset(&tm, 0xff, sizeof(tm));
        OP(cq, read_tm_info)(cq, &tm);
        CHECK(tm.tag == 0 && tm.priv == 0, "read_tm_info gives zeros");
        printf("%-40s answered\n", "ibv_cq_ex: start/next/end_poll, read_*");

        /* ibv_qp_ex: refused builders, then every builder */
        struct ibv_qp_init_attr_ex qa = {
            .qp_type = IBV_QPT_RC, .send_cq = ibv_cq_ex_to_cq(cq), .recv_cq = ibv_cq_ex_to_cq(cq),
            .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 2, .max_recv_sge = 2 },
            .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pd,
            .send_ops_flags = IBV_QP_EX_WITH_ATOMIC_WRITE,
        };
        struct ibv_qp *aw = ibv_create_qp_ex(ctx, &qa);      /* ATOMIC_WRITE, as rxe */
        CHECK(aw && ibv_destroy_qp(aw) == 0, "create_qp_ex(WITH_ATOMIC_WRITE)");
        printf("%-40s works\n", "create_qp_ex(WITH_ATOMIC_WRITE)");
        qa.send_ops_flags = IBV_QP_EX_WITH_TSO;
        PTR_EOPNOTSUPP(ibv_create_qp_ex(ctx, &qa), "create_qp_ex(WITH_TSO)");
        qa.qp_type = IBV_QPT_UD;
        qa.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE;
        PTR_EOPNOTSUPP(ibv_create_qp_ex(ctx, &qa), "create_qp_ex(UD, WITH_RDMA_WRITE)");
        qa.qp_type = IBV_QPT_RC;
        qa.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
        struct ibv_qp *qp = ibv_create_qp_ex(ctx, &qa);
        CHECK(qp, "ibv_create_qp_ex");
        struct ibv_qp_ex *q = ibv_qp_to_qp_ex(qp);
        CHECK(q, "ibv_qp_to_qp_ex");
        char buf[64];
        struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = 0 };
        struct ibv_data_buf db = { .addr = buf, .length = 8 };
        struct ibv_mw_bind_info bi = { 0 };
        /* each builder in a WR list of its own, aborted: nothing is posted */
#define BUILD(...) do { OP(q, wr_start)(q); __VA_ARGS__; OP(q, wr_abort)(q); } while (0)
        BUILD(OP(q, wr_atomic_cmp_swp)(q, 1, 0, 0, 0));
        BUILD(OP(q, wr_atomic_fetch_add)(q, 1, 0, 0));
        BUILD(OP(q, wr_local_inv)(q, 1));
        BUILD(OP(q, wr_rdma_read)(q, 1, 0));
        BUILD(OP(q, wr_rdma_write)(q, 1, 0));
        BUILD(OP(q, wr_rdma_write_imm)(q, 1, 0, 0));
        BUILD(OP(q, wr_send)(q));
        BUILD(OP(q, wr_send_imm)(q, 0));
        BUILD(OP(q, wr_send_inv)(q, 1));
        BUILD(OP(q, wr_send)(q); OP(q, wr_set_ud_addr)(q, NULL, 1, 1));
        BUILD(OP(q, wr_send)(q); OP(q, wr_set_inline_data)(q, buf, 8));
        BUILD(OP(q, wr_send)(q); OP(q, wr_set_inline_data_list)(q, 1, &db));
        BUILD(OP(q, wr_send)(q); OP(q, wr_set_sge)(q, 0, (uintptr_t)buf, 8));
        BUILD(OP(q, wr_send)(q); OP(q, wr_set_sge_list)(q, 1, &sge));
        BUILD(OP(q, wr_bind_mw)(q, NULL, 1, &bi));
        printf("%-40s build and abort\n", "ibv_qp_ex: wr_* builders and setters");
        /* the builders softnic does not provide: wr_complete fails, nothing posted */
        uint64_t word = 0;
#define REFUSED(call, name) do { OP(q, wr_start)(q); call; \
        int r_ = OP(q, wr_complete)(q); \
        if (r_ != EOPNOTSUPP) { fprintf(stderr, "FAIL: %s: wr_complete %d\n", name, r_); exit(1); } \
        printf("%-40s wr_complete: EOPNOTSUPP\n", name); } while (0)
        REFUSED(OP(q, wr_send_tso)(q, buf, 8, 1), "wr_send_tso");
        REFUSED(OP(q, wr_send)(q); OP(q, wr_set_xrc_srqn)(q, 1), "wr_set_xrc_srqn");
        REFUSED(OP(q, wr_atomic_write)(q, 1, 0, &word), "wr_atomic_write");
        /* pointers rdma-core's later headers add after wr_atomic_write (wr_flush) */
        void (**after)(struct ibv_qp_ex *) =
            (void (**)(struct ibv_qp_ex *))((char *)q + sizeof(*q));
        REFUSED(after[0](q), "the slot after wr_atomic_write (wr_flush)");
        /* a WR list with a bad builder in it posts nothing of it */
        OP(q, wr_start)(q);
        q->wr_id = 1;
        OP(q, wr_send)(q);
        OP(q, wr_set_sge)(q, 0, (uintptr_t)buf, 8);
        OP(q, wr_atomic_write)(q, 1, 0, &word);
        CHECK(OP(q, wr_complete)(q) == EOPNOTSUPP, "a list with an unsupported builder fails");
        CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
        CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0, "ibv_destroy_cq");
    }
    CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
    CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
    printf("all %d pointers answered\n", nptr);
    return 0;
}
