/* One receive of the UDP driver's (rx.c): I/O, as wait.c. */
int sn_rx_one(int fd, uint8_t *buf, size_t cap, uint32_t *out);
/* The driver's receive of a stream of a WRITE's MIDDLEs (rx.c): I/O, as wait.c. */
int sn_rx_stream(int fd, uint8_t *buf, size_t cap, uint32_t peer_ip, uint32_t peer_port,
                 uint32_t w0, uint32_t dqpn, uint32_t epsn, uint32_t start, uint32_t seg,
                 uint8_t *dst, uint64_t off, uint64_t len, uint32_t max_runs,
                 uint64_t max_bytes, uint32_t *acks, uint32_t cap_acks, uint32_t *out);
/* The driver's answer to a peer's READs and ATOMICs (rx.c): I/O, as wait.c. */
int sn_rx_answers(int fd, uint8_t *buf, size_t cap, uint32_t peer_ip, uint32_t peer_port,
                  uint32_t kind, uint32_t w0, uint32_t qpn, uint32_t epsn, uint32_t req_start,
                  uint32_t rkey, uint32_t length, uint64_t lo, uint64_t hi, uint8_t *mem,
                  uint32_t resp_w0, uint32_t dqpn, uint32_t syndrome, uint32_t msn,
                  uint32_t resp_start, uint8_t *resp, uint32_t max, uint64_t *origs,
                  uint32_t mtu, uint32_t mid_w0, uint32_t mid_start, uint32_t last_w0,
                  uint32_t last_start, uint8_t *heads, uint32_t max_middles, size_t in_len,
                  uint32_t in_seg, size_t in_off, uint32_t max_runs, uint32_t *out);
/* The driver's receive of a QP's READ responses for its outstanding READs (rx.c). */
int sn_rx_reads(int fd, uint8_t *buf, size_t cap, uint32_t peer_ip, uint32_t peer_port,
                uint32_t qpn, uint32_t epsn, uint32_t mtu, uint32_t first_w0,
                uint32_t first_start, uint32_t mid_w0, uint32_t mid_start, uint32_t nreads,
                uint8_t **dst, const uint32_t *len, const uint32_t *last_w0,
                const uint32_t *last_start, uint32_t p0, uint32_t max_runs, uint32_t *out);
