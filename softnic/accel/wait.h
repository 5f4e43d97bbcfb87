/* The progress thread's sleep (wait.c): the one part of the module that does I/O. */
int sn_wait(int sock, int bell, int64_t timeout_ns, int64_t *lease, int64_t grace_ns,
            int64_t hold_ns);
