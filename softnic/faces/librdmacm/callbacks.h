/* The calls the C side of librdmacm makes into softnic (backend.py), one per line.
 * Each returns 0 or a positive errno. */
int sn_cm_create_channel(int fd, uint32_t *ch);
int sn_cm_destroy_channel(uint32_t ch);
int sn_cm_create_id(uint32_t ch, void *cookie, int ps, int qp_type, uint32_t *id);
int sn_cm_set_cookie(uint32_t id, void *cookie);
int sn_cm_migrate_id(uint32_t id, uint32_t ch);
int sn_cm_destroy_id(uint32_t id);
int sn_cm_bind(uint32_t id, struct sn_cm_addr *a);
int sn_cm_resolve_addr(uint32_t id, struct sn_cm_addr *src, struct sn_cm_addr *dst);
int sn_cm_resolve_route(uint32_t id);
int sn_cm_listen(uint32_t id, int backlog);
int sn_cm_connect(uint32_t id, struct sn_cm_param *p);
int sn_cm_accept(uint32_t id, struct sn_cm_param *p);
int sn_cm_reject(uint32_t id, uint8_t *pd, int len);
int sn_cm_establish(uint32_t id);
int sn_cm_disconnect(uint32_t id);
int sn_cm_init_qp_attr(uint32_t id, struct sn_cm_qp_attr *a, int *mask);
int sn_cm_get_event(uint32_t ch, struct sn_cm_event *e);
int sn_cm_id_info(uint32_t id, struct sn_cm_info *info);
int sn_cm_set_ack_timeout(uint32_t id, int timeout);
int sn_cm_exit(void);
