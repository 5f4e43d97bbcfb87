/* softnic's per-packet kernel: the loops of the bulk data path, and the answer to
   a READ or an ATOMIC.  Pure: memory in, memory out; no I/O, no
   allocation, no global state but the CRC hook. */
int sn_set_crc(uintptr_t fn, int kind);
uint32_t sn_crc32(uint32_t crc, const uint8_t *p, size_t n);
int sn_rx_middles(const uint8_t *buf, size_t n, size_t o, size_t seg, uint32_t w0,
                  uint32_t dqpn, uint32_t epsn, uint32_t start, uint8_t *dst,
                  uint64_t off, uint64_t len, uint32_t max, uint32_t *acks,
                  uint32_t cap, uint32_t *nacks);
int sn_rx_edge(const uint8_t *p, size_t n, uint32_t w0, uint32_t dqpn, uint32_t epsn,
               uint32_t start, int ext, uint8_t *dst, uint64_t off, uint64_t len,
               uint64_t cap);
int sn_rx_send_run(const uint8_t *buf, size_t n, size_t o, size_t seg, uint32_t qpn,
                   uint32_t epsn, uint32_t first_w0, uint32_t first_start, uint32_t mid_w0,
                   uint32_t mid_start, size_t last_at, uint32_t last_w0, uint32_t last_start,
                   int ext, uint64_t last_len, uint8_t *dst, uint64_t room, uint32_t *acks,
                   uint32_t cap, uint32_t *nacks);
uint32_t sn_tx_middles(uint8_t *buf, size_t o, uint32_t count, uint32_t w0, uint32_t dqpn,
                       uint32_t psn, uint32_t s, uint32_t ack_every, const uint8_t *src,
                       size_t mtu, uint32_t start);
uint32_t sn_tx_heads(uint8_t *heads, uint32_t count, uint32_t w0, uint32_t dqpn,
                     uint32_t psn, uint32_t s, uint32_t ack_every, const uint8_t *src,
                     size_t mtu, uint32_t start);
size_t sn_read_only(const uint8_t *req, size_t n, uint32_t w0, uint32_t qpn, uint32_t epsn,
                    uint32_t req_start, uint32_t rkey, uint32_t length, uint64_t lo,
                    uint64_t hi, const uint8_t *mem, uint32_t resp_w0, uint32_t dqpn,
                    uint32_t aeth, uint32_t resp_start, uint8_t *resp);
size_t sn_read_run(const uint8_t *req, size_t n, uint32_t w0, uint32_t qpn, uint32_t epsn,
                   uint32_t req_start, uint32_t rkey, uint32_t length, uint64_t lo,
                   uint64_t hi, const uint8_t *mem, uint32_t mtu, uint32_t first_w0,
                   uint32_t mid_w0, uint32_t last_w0, uint32_t dqpn, uint32_t aeth,
                   uint32_t first_start, uint32_t mid_start, uint32_t last_start,
                   uint32_t max_middles, uint8_t *first, uint8_t *heads, uint8_t *last,
                   uint64_t *at);
size_t sn_atomic_ack(const uint8_t *req, size_t n, uint32_t w0, uint32_t qpn, uint32_t epsn,
                     uint32_t req_start, uint32_t rkey, int compare_swap, uint64_t lo,
                     uint64_t hi, uint8_t *mem, uint32_t resp_w0, uint32_t dqpn,
                     uint32_t aeth, uint32_t resp_start, uint8_t *resp, uint64_t *orig);
