/* The driver's gathered send (send.c): I/O, as wait.c. */
int sn_send_gather(int fd, uint32_t ip, uint32_t port, const uint8_t *first,
                   uint32_t first_len, const uint8_t *heads, const uint8_t *src, uint32_t mtu,
                   uint32_t count, const uint8_t *last, uint32_t last_len, uint32_t per_call,
                   uint32_t *lost, int *err);
