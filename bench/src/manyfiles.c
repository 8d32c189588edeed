/* manyfiles DIR N create|remove: creates (or removes) N empty files spread
 * over DIRS subdirectories of DIR, as a package manager or an untar of a
 * large tree would; prints {"ops":N,"secs":S} as JSON. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DIRS 1000

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: manyfiles DIR N create|remove\n");
        return 2;
    }
    const char *dir = argv[1];
    long n = atol(argv[2]);
    int create = strcmp(argv[3], "create") == 0;
    char p[4096];
    double t0 = now();
    for (long d = 0; d < DIRS && create; d++) {
        snprintf(p, sizeof p, "%s/d%03ld", dir, d);
        if (mkdir(p, 0755) != 0) { perror(p); return 1; }
    }
    for (long i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/d%03ld/f%07ld", dir, i % DIRS, i);
        if (create) {
            int fd = open(p, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
            if (fd < 0 || close(fd) != 0) { perror(p); return 1; }
        } else if (unlink(p) != 0) { perror(p); return 1; }
    }
    for (long d = 0; d < DIRS && !create; d++) {
        snprintf(p, sizeof p, "%s/d%03ld", dir, d);
        if (rmdir(p) != 0) { perror(p); return 1; }
    }
    printf("{\"ops\": %ld, \"secs\": %.6f}\n", n, now() - t0);
    return 0;
}
