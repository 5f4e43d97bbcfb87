/* The progress thread's sleep (wait.c): the one part of the module that does I/O. */
int sn_wait(int sock, int bell, int64_t timeout_ns, int64_t *lease, int64_t grace_ns,
            int64_t hold_ns);
/* sn_wait, but watching the socket and the bell without sleeping for spin_ns
   first where it would sleep on both (no caller's lease); 4 where it found a
   datagram while doing so (sn_wait's 1) */
int sn_wait_spin(int sock, int bell, int64_t timeout_ns, int64_t *lease, int64_t grace_ns,
                 int64_t hold_ns, int64_t spin_ns);
/* About to wait out the lease stamped l0: lease[2] set (end_lease rings a thread
   that set it), then the stamp read again: 1 if the lease was given back in
   between (lease[2] cleared: look again), else 0 */
int sn_announce_park(int64_t *lease, int64_t l0);
