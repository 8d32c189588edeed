/*
 * metabench - metadata micro-benchmark used by bench/run.
 *
 * Usage: metabench DIR NFILES READDIR_REPEATS
 *
 * DIR must be an existing, empty directory. Phases, each timed with
 * CLOCK_MONOTONIC, all using *at() calls relative to an fd for DIR so
 * that path resolution of DIR's prefix is not measured:
 *
 *   create      openat(O_CREAT|O_EXCL|O_WRONLY) + close, NFILES empty files
 *   stat_warm   fstatat() every file, immediately after create (warm dcache)
 *   stat_cold   sync(); echo 2 > drop_caches (dentries+inodes); fstatat() all
 *   readdir     open DIR + getdents64 until EOF, counting entries; repeated
 *               READDIR_REPEATS times (ops = entries returned)
 *   rename      renameat() f<i> -> r<i> within DIR
 *   unlink      unlinkat() every r<i>
 *
 * Prints one JSON object: {"phase": {"ops": N, "secs": S}, ...}.
 * Written in C so that interpreter overhead does not dominate the numbers.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what, const char *name)
{
	fprintf(stderr, "metabench: %s %s: %s\n", what, name ? name : "",
		strerror(errno));
	exit(1);
}

static int drop_dentries(void)
{
	sync();
	int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
	if (fd < 0)
		return -1;
	int ok = write(fd, "2\n", 2) == 2;
	close(fd);
	return ok ? 0 : -1;
}

struct linux_dirent64 {
	unsigned long long d_ino;
	long long d_off;
	unsigned short d_reclen;
	unsigned char d_type;
	char d_name[];
};

static long count_dir(const char *dir)
{
	static char buf[64 * 1024];
	long n = 0;
	int fd = open(dir, O_RDONLY | O_DIRECTORY);
	if (fd < 0)
		die("open dir", dir);
	for (;;) {
		long nread = syscall(SYS_getdents64, fd, buf, sizeof(buf));
		if (nread < 0)
			die("getdents64", dir);
		if (nread == 0)
			break;
		for (long off = 0; off < nread;) {
			struct linux_dirent64 *d = (void *)(buf + off);
			if (strcmp(d->d_name, ".") && strcmp(d->d_name, ".."))
				n++;
			off += d->d_reclen;
		}
	}
	close(fd);
	return n;
}

/* fstatat every file of the create loop; prints one JSON member. */
static void stat_all(int dfd, long n, const char *label)
{
	char name[32];
	struct stat st;
	double t0 = now();
	for (long i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "f%07ld", i);
		if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			die("stat", name);
	}
	printf(", \"%s\": {\"ops\": %ld, \"secs\": %.6f}", label, n, now() - t0);
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: %s DIR NFILES READDIR_REPEATS\n", argv[0]);
		return 2;
	}
	const char *dir = argv[1];
	long n = atol(argv[2]);
	int reps = atoi(argv[3]);
	char name[32], name2[32];
	double t0, t;
	int dfd = open(dir, O_RDONLY | O_DIRECTORY);
	if (dfd < 0)
		die("open", dir);

	printf("{");

	t0 = now();
	for (long i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "f%07ld", i);
		int fd = openat(dfd, name, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
		if (fd < 0)
			die("create", name);
		close(fd);
	}
	t = now() - t0;
	printf("\"create\": {\"ops\": %ld, \"secs\": %.6f}", n, t);

	stat_all(dfd, n, "stat_warm");

	close(dfd);
	if (drop_dentries() == 0) {
		dfd = open(dir, O_RDONLY | O_DIRECTORY);
		if (dfd < 0)
			die("open", dir);
		stat_all(dfd, n, "stat_cold");
	} else {
		dfd = open(dir, O_RDONLY | O_DIRECTORY);
		if (dfd < 0)
			die("open", dir);
	}

	long total = 0;
	t0 = now();
	for (int r = 0; r < reps; r++) {
		long c = count_dir(dir);
		if (c != n) {
			fprintf(stderr, "metabench: readdir returned %ld entries, expected %ld\n", c, n);
			return 1;
		}
		total += c;
	}
	t = now() - t0;
	printf(", \"readdir\": {\"ops\": %ld, \"secs\": %.6f, \"listings\": %d}", total, t, reps);

	t0 = now();
	for (long i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "f%07ld", i);
		snprintf(name2, sizeof(name2), "r%07ld", i);
		if (renameat(dfd, name, dfd, name2) < 0)
			die("rename", name);
	}
	t = now() - t0;
	printf(", \"rename\": {\"ops\": %ld, \"secs\": %.6f}", n, t);

	t0 = now();
	for (long i = 0; i < n; i++) {
		snprintf(name2, sizeof(name2), "r%07ld", i);
		if (unlinkat(dfd, name2, 0) < 0)
			die("unlink", name2);
	}
	t = now() - t0;
	printf(", \"unlink\": {\"ops\": %ld, \"secs\": %.6f}", n, t);

	printf("}\n");
	close(dfd);
	return 0;
}
