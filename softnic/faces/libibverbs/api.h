/* The flat records the C side of softnic's libibverbs passes to its Python side.
 * Read by both the C compiler and cffi's cdef: plain declarations only. */

struct sn_sge { uint64_t addr; uint32_t length; uint32_t lkey; };

struct sn_dev_attr {
    char fw_ver[64];
    uint64_t node_guid; uint64_t sys_image_guid; uint64_t max_mr_size; uint64_t page_size_cap;
    uint32_t vendor_id; uint32_t vendor_part_id; uint32_t hw_ver;
    int max_qp; int max_qp_wr; unsigned int device_cap_flags; int max_sge; int max_sge_rd;
    int max_cq; int max_cqe; int max_mr; int max_pd; int max_qp_rd_atom; int max_res_rd_atom;
    int max_qp_init_rd_atom; int atomic_cap; int max_ah; int max_srq; int max_srq_wr;
    int max_srq_sge; int max_pkeys; int local_ca_ack_delay; int phys_port_cnt;
    int max_inline_data; int max_mcast_grp; int max_mcast_qp_attach;
    int max_total_mcast_qp_attach;
};

struct sn_port_attr {
    int active_mtu; uint32_t max_msg_sz; uint32_t bad_pkey_cntr; uint32_t qkey_viol_cntr;
    int gid_tbl_len; uint8_t active_speed; uint8_t active_width;
};

struct sn_ah {
    uint8_t dgid[16]; uint32_t flow_label; uint8_t sgid_index; uint8_t hop_limit;
    uint8_t traffic_class; uint8_t sl; uint8_t is_global; uint8_t port_num;
};

struct sn_qp_cap {
    uint32_t max_send_wr; uint32_t max_recv_wr; uint32_t max_send_sge; uint32_t max_recv_sge;
    uint32_t max_inline_data;
};

struct sn_qp_attr {
    int qp_state; int cur_qp_state; int path_mtu; int path_mig_state;
    uint32_t qkey; uint32_t rq_psn; uint32_t sq_psn; uint32_t dest_qp_num;
    unsigned int qp_access_flags; struct sn_qp_cap cap; struct sn_ah ah;
    uint16_t pkey_index; uint8_t en_sqd_async_notify; uint8_t sq_draining;
    uint8_t max_rd_atomic; uint8_t max_dest_rd_atomic; uint8_t min_rnr_timer; uint8_t port_num;
    uint8_t timeout; uint8_t retry_cnt; uint8_t rnr_retry;
};

struct sn_qp_init {
    int qp_type; uint32_t send_cq; uint32_t recv_cq; uint32_t srq; int sq_sig_all;
    struct sn_qp_cap cap;
};

struct sn_send_wr {
    uint64_t wr_id; struct sn_sge *sg_list; int num_sge; int opcode; unsigned int send_flags;
    uint32_t imm_data;          /* host order */
    uint32_t invalidate_rkey; uint64_t remote_addr; uint32_t rkey;
    uint64_t compare_add; uint64_t swap;
    uint32_t ah; uint32_t remote_qpn; uint32_t remote_qkey;
};

struct sn_recv_wr { uint64_t wr_id; struct sn_sge *sg_list; int num_sge; };

struct sn_wc {
    uint64_t wr_id; int status; int opcode; uint32_t vendor_err; uint32_t byte_len;
    uint32_t imm_data;          /* host order; the invalidated rkey with IBV_WC_WITH_INV */
    uint32_t qp_num; uint32_t src_qp; unsigned int wc_flags; uint16_t pkey_index;
    uint16_t slid; uint8_t sl; uint8_t dlid_path_bits;
};

/* a C function the Python side calls (embed.c) */
void sn_fork_resumed(void);
