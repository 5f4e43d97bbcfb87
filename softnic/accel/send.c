/* The UDP driver's send of a run built by sn_tx_heads (requester.Gather): if
   ``first``, one datagram of first_len = seg bytes ahead of the run (a datagram
   of the run's size to its address that was to leave just before it: a SEND's
   FIRST, which carries no extended header), then count
   packets of seg = 12 + mtu + 4 bytes, each gathered from its BTH (heads + 16 i,
   12 bytes), its MTU of payload (src + mtu i, registered memory: the one copy
   is the kernel's, into the socket buffer) and its ICRC (heads + 16 i + 12),
   then, if ``last``, one more datagram of last_len bytes (a LAST, built whole,
   never longer than seg).  Up to per_call datagrams go down in each sendmsg(2),
   cut apart by UDP GSO (UDP_SEGMENT = seg); a lone one without it.

   As UdpSocket._send_gso: a sendmsg the socket refuses for want of room or
   route (EAGAIN, ECONNREFUSED, ENETUNREACH, EHOSTUNREACH, EMSGSIZE, EPERM) loses
   its datagrams, counted in *lost, as a wire would; any other error stops the
   run with *err set (EINVAL and the like: no GSO here; the caller sends the
   rest another way).  Returns how many datagrams were dealt with (sent or
   lost): (first != 0) + count + (last != 0) unless *err. */
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* Linux's values (linux/udp.h), each as the Python constant named beside it */
#define SN_SOL_UDP 17             /* softnic.transport.udp.SOL_UDP */
#define SN_UDP_SEGMENT 103        /* softnic.transport.udp.UDP_SEGMENT */
#define SN_GATHER_MAX 64          /* softnic.transport.udp.GSO_MAX_SEGMENTS */

int sn_send_gather(int fd, uint32_t ip, uint32_t port, const uint8_t *first,
                   uint32_t first_len, const uint8_t *heads, const uint8_t *src, uint32_t mtu,
                   uint32_t count, const uint8_t *last, uint32_t last_len, uint32_t per_call,
                   uint32_t *lost, int *err)
{
    struct sockaddr_in sa;
    struct iovec iov[3 * SN_GATHER_MAX + 1];
    uint32_t lead = first != 0;
    union {
        char buf[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } ctl;
    uint32_t total = lead + count + (last != 0), done = 0;
    uint16_t seg = (uint16_t)(12 + mtu + 4);
    *lost = 0;
    *err = 0;
    if (per_call < 1)
        per_call = 1;
    if (per_call > SN_GATHER_MAX)
        per_call = SN_GATHER_MAX;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(ip);
    while (done < total) {
        uint32_t n = total - done, v = 0;
        struct msghdr m;
        ssize_t r;
        if (n > per_call)
            n = per_call;
        for (uint32_t k = done; k < done + n; k++) {
            uint32_t i = k - lead;      /* the run's packet (k = 0 is first, if any) */
            if (k < lead) {
                iov[v].iov_base = (void *)first;
                iov[v++].iov_len = first_len;
            } else if (i < count) {
                iov[v].iov_base = (void *)(heads + 16 * (size_t)i);
                iov[v++].iov_len = 12;
                iov[v].iov_base = (void *)(src + (size_t)mtu * i);
                iov[v++].iov_len = mtu;
                iov[v].iov_base = (void *)(heads + 16 * (size_t)i + 12);
                iov[v++].iov_len = 4;
            } else {
                iov[v].iov_base = (void *)last;
                iov[v++].iov_len = last_len;
            }
        }
        memset(&m, 0, sizeof m);
        m.msg_name = &sa;
        m.msg_namelen = sizeof sa;
        m.msg_iov = iov;
        m.msg_iovlen = v;
        if (n > 1) {
            struct cmsghdr *c;
            memset(&ctl, 0, sizeof ctl);
            m.msg_control = ctl.buf;
            m.msg_controllen = sizeof ctl.buf;
            c = CMSG_FIRSTHDR(&m);
            c->cmsg_level = SN_SOL_UDP;
            c->cmsg_type = SN_UDP_SEGMENT;
            c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            memcpy(CMSG_DATA(c), &seg, sizeof seg);
        }
        do
            r = sendmsg(fd, &m, 0);
        while (r < 0 && errno == EINTR);
        if (r < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK || e == ECONNREFUSED || e == ENETUNREACH
                    || e == EHOSTUNREACH || e == EMSGSIZE || e == EPERM)
                *lost += n;
            else {
                *err = e;
                return (int)done;
            }
        }
        done += n;
    }
    return (int)done;
}
