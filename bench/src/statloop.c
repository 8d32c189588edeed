/* bench/warmstat's timing helper: warm lstat of every name in a list,
 * relative to a directory descriptor, so that only the kernel's answer is
 * timed (no request reaches a FUSE daemon once the names are cached).
 *
 *   statloop ROOT LIST WARMUP PASSES
 *
 * WARMUP untimed passes, then PASSES timed ones; prints the median
 * nanoseconds per call. */
#define _GNU_SOURCE
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

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: statloop ROOT LIST WARMUP PASSES\n");
        return 2;
    }
    int root = open(argv[1], O_RDONLY | O_DIRECTORY);
    if (root < 0) { perror(argv[1]); return 1; }
    FILE *lf = fopen(argv[2], "r");
    if (!lf) { perror(argv[2]); return 1; }
    size_t n = 0, cap = 1024, len = 0;
    char **names = malloc(cap * sizeof *names), *line = NULL;
    ssize_t got;
    while ((got = getline(&line, &len, lf)) > 0) {
        if (line[got - 1] == '\n') line[got - 1] = 0;
        if (n == cap) names = realloc(names, (cap *= 2) * sizeof *names);
        names[n++] = strdup(line);
    }
    int warm = atoi(argv[3]), passes = atoi(argv[4]);
    if (n == 0 || passes < 1) { fprintf(stderr, "statloop: nothing to do\n"); return 2; }
    double *t = malloc(passes * sizeof *t);
    for (int p = -warm; p < passes; p++) {
        double t0 = now();
        for (size_t i = 0; i < n; i++) {
            struct stat st;
            if (fstatat(root, names[i], &st, AT_SYMLINK_NOFOLLOW) != 0) {
                perror(names[i]);
                return 1;
            }
        }
        if (p >= 0) t[p] = (now() - t0) / n * 1e9;
    }
    qsort(t, passes, sizeof *t, cmp);
    printf("%.1f\n", t[passes / 2]);
    return 0;
}
