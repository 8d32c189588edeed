/* bench/union's timing helper: one pass = lstat every path (stat) or read
 * every directory to its end (readdir), each name taken from a list file
 * relative to ROOT. Prints the seconds of each pass, one per line, so the
 * Python driver's own per-call overhead is not in the figure.
 *
 *   unionwalk stat|readdir ROOT LIST PASSES [CHUNK]
 *
 * With CHUNK > 0 every run of CHUNK names is gone through once untimed and
 * then once timed: "warm" then means looked up a moment ago, well inside a
 * FUSE mount's 1 s entry and attribute timeouts, which a whole 40k-file
 * pass at FUSE speed would outlast (every stat then reaches the daemon).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: unionwalk stat|readdir ROOT LIST PASSES [CHUNK]\n");
        return 2;
    }
    int do_stat = strcmp(argv[1], "stat") == 0;
    int root = open(argv[2], O_RDONLY | O_DIRECTORY);
    if (root < 0) { perror(argv[2]); return 1; }
    FILE *lf = fopen(argv[3], "r");
    if (!lf) { perror(argv[3]); return 1; }
    size_t n = 0, cap = 1024;
    char **names = malloc(cap * sizeof *names);
    char *line = NULL;
    size_t len = 0;
    ssize_t got;
    while ((got = getline(&line, &len, lf)) > 0) {
        if (line[got - 1] == '\n') line[got - 1] = 0;
        if (n == cap) names = realloc(names, (cap *= 2) * sizeof *names);
        names[n++] = strdup(line);
    }
    int passes = atoi(argv[4]);
    size_t chunk = argc == 6 ? (size_t)atol(argv[5]) : 0;
    if (chunk == 0) chunk = n ? n : 1;
    long entries = 0;
    for (int p = 0; p < passes; p++) {
        double timed = 0;
        for (size_t c0 = 0; c0 < n; c0 += chunk) {
            size_t c1 = c0 + chunk < n ? c0 + chunk : n;
            /* the untimed warm-up round only when chunked */
            for (int round = chunk < n || argc == 6 ? 0 : 1; round < 2; round++) {
                double t0 = now();
                for (size_t i = c0; i < c1; i++) {
                    if (do_stat) {
                        struct stat st;
                        if (fstatat(root, names[i], &st, AT_SYMLINK_NOFOLLOW) != 0) {
                            perror(names[i]);
                            return 1;
                        }
                    } else {
                        int fd = openat(root, names[i], O_RDONLY | O_DIRECTORY);
                        if (fd < 0) { perror(names[i]); return 1; }
                        DIR *d = fdopendir(fd);
                        if (!d) { perror(names[i]); return 1; }
                        while (readdir(d)) entries++;
                        closedir(d);
                    }
                }
                if (round == 1) timed += now() - t0;
            }
        }
        printf("%.6f\n", timed);
    }
    if (!do_stat) fprintf(stderr, "entries %ld\n", entries);
    return 0;
}
