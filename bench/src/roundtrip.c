/* Latency of one metadata call, to show what a FUSE round trip costs.
 * Usage: roundtrip FILE [N]
 * Prints the mean time of fstat(fd) and of stat(path) over N calls. With
 * attr_timeout=0 every fstat is a GETATTR round trip to the daemon; with
 * the default timeouts the kernel answers from its attribute cache. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: roundtrip FILE [N]\n");
        return 2;
    }
    long n = argc > 2 ? atol(argv[2]) : 100000;
    struct stat st;
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    double t0 = now_us();
    for (long i = 0; i < n; i++)
        if (fstat(fd, &st) != 0) { perror("fstat"); return 1; }
    double t1 = now_us();
    for (long i = 0; i < n; i++)
        if (stat(argv[1], &st) != 0) { perror("stat"); return 1; }
    double t2 = now_us();
    printf("{\"fstat_us\": %.3f, \"stat_us\": %.3f}\n", (t1 - t0) / n, (t2 - t1) / n);
    return 0;
}
