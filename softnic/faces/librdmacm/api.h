/* The flat records the C side of softnic's librdmacm passes to its Python side.
 * Read by both the C compiler and cffi's cdef: plain declarations only. */

/* family 2 (AF_INET: ip[0..3]) or 10 (AF_INET6: ip[0..15]); port in host order */
struct sn_cm_addr { uint8_t ip[16]; uint16_t port; int family; };

struct sn_cm_param {
    uint8_t private_data[256]; int private_data_len;
    uint8_t responder_resources; uint8_t initiator_depth; uint8_t retry_count;
    uint8_t rnr_retry_count; uint8_t srq; uint32_t qp_num; uint32_t qkey;
};

struct sn_cm_qp_attr {
    int qp_state; int path_mtu; uint32_t qkey; uint32_t rq_psn; uint32_t sq_psn;
    uint32_t dest_qp_num; unsigned int qp_access_flags; uint8_t dgid[16];
    uint8_t hop_limit; uint8_t port_num; uint8_t max_rd_atomic; uint8_t max_dest_rd_atomic;
    uint8_t min_rnr_timer; uint8_t timeout; uint8_t retry_cnt; uint8_t rnr_retry;
    uint16_t pkey_index;
};

struct sn_cm_event {
    int event; int status; uint32_t id; uint32_t listen_id; void *id_cookie; void *listen_cookie;
    int is_new; uint8_t private_data[256]; int private_data_len;
    uint8_t responder_resources; uint8_t initiator_depth; uint8_t retry_count;
    uint8_t rnr_retry_count; uint8_t srq; uint32_t qp_num; uint32_t qkey;
    uint8_t mgid[16];       /* MULTICAST_JOIN: the group's GID */
};

struct sn_cm_info {
    char dev_name[64]; int has_dev; int has_src; int has_dst;
    int src_family; uint8_t src_ip[16]; uint16_t src_port;     /* as sn_cm_addr */
    int dst_family; uint8_t dst_ip[16]; uint16_t dst_port;
    uint8_t sgid[16]; uint8_t dgid[16]; int routed;
};
