/* bench/union's timing helper: one pass = lstat every path (stat) or read
 * every directory to its end (readdir), each name taken from a list file
 * relative to ROOT. Prints the seconds of each pass, one per line, so the
 * Python driver's own per-call overhead is not in the figure.
 *
 *   unionwalk stat|readdir ROOT LIST PASSES
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
    if (argc != 5) {
        fprintf(stderr, "usage: unionwalk stat|readdir ROOT LIST PASSES\n");
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
    long entries = 0;
    for (int p = 0; p < passes; p++) {
        double t0 = now();
        for (size_t i = 0; i < n; i++) {
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
        printf("%.6f\n", now() - t0);
    }
    if (!do_stat) fprintf(stderr, "entries %ld\n", entries);
    return 0;
}
