/* The wire facts the kernel reads: each the value of the Python constant named
   beside it, which is its one definition (tests/test_kernel.py checks that every
   line here agrees with the constant it names).  Not part of the cffi cdef. */
#define BTH_LEN 12                 /* softnic.wire.roce.BTH_LEN */
#define ICRC_LEN 4                 /* softnic.wire.roce.ICRC_LEN */
#define PSN_MASK 0xFFFFFFu         /* softnic.wire.psn.PSN_MASK */
#define QPN_MASK 0xFFFFFFu         /* softnic.wire.roce.QPN_MASK */
#define BTH_FECN 0x80000000u       /* softnic.wire.roce.BTH_FECN */
#define BTH_BECN 0x40000000u       /* softnic.wire.roce.BTH_BECN */
#define BTH_ACKREQ 0x80000000u     /* softnic.wire.roce.BTH_ACKREQ */
#define RETH_LEN 16                /* softnic.wire.roce.RETH_LEN */
#define ATOMICETH_LEN 28           /* softnic.wire.roce.ATOMICETH_LEN */
#define ATOMICACKETH_LEN 8         /* softnic.wire.roce.ATOMICACKETH_LEN */
#define AETH_LEN 4                 /* softnic.wire.roce.AETH_LEN */
#define IMMDT_LEN 4                /* softnic.wire.roce.IMMDT_LEN */
#define MSN_MASK 0xFFFFFFu         /* softnic.wire.roce.MSN_MASK */
/* sn_rx_edge's extended header after the BTH: an AETH (a READ response's), or an
   ImmDt or IETH (a SEND LAST's) */
#define EXT_AETH 1                 /* softnic.core.responder.EXT_AETH */
#define EXT_TAIL 2                 /* softnic.core.responder.EXT_TAIL */
