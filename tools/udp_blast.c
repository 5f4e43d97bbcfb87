/* A C UDP blaster: the harness's reference where Debian's sockperf is missing.
 *
 *   udp_blast rx PORT SECONDS        count bytes received on 127.0.0.1:PORT, print the total
 *   udp_blast tx PORT SECONDS SIZE   send SIZE-byte datagrams to 127.0.0.1:PORT for SECONDS
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s rx PORT SECONDS | tx PORT SECONDS SIZE\n", argv[0]);
        return 2;
    }
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    int buf = 8 << 20;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(atoi(argv[2]));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    double seconds = atof(argv[3]);
    if (strcmp(argv[1], "rx") == 0) {
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
        if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0) { perror("bind"); return 1; }
        struct timeval tv = {0, 200000};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        static char data[65536];
        long long total = 0;
        double end = now() + seconds;
        while (now() < end) {
            ssize_t n = recv(fd, data, sizeof data, 0);
            if (n > 0) total += n;
        }
        printf("%lld\n", total);
        return 0;
    }
    if (argc < 5) { fprintf(stderr, "tx needs SIZE\n"); return 2; }
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    size_t size = (size_t)atoi(argv[4]);
    char *data = calloc(1, size);
    double end = now() + seconds;
    while (now() < end)
        for (int i = 0; i < 64; i++)
            sendto(fd, data, size, 0, (struct sockaddr *)&a, sizeof a);
    return 0;
}
