/* P6 (issue #14 item 6): MPI ping-pong and allreduce timings, for bench/mpi_p6.py to compare.
 *
 * Ping-pong between ranks 0 and 1 at 8 B, 4 KiB, 64 KiB, 1 MiB and 16 MiB: latency is half the
 * round trip, bandwidth is the message size over that half round trip (MB/s = 1e6 bytes/s).
 * Then MPI_Allreduce (MPI_SUM of doubles, every rank) at 8 B, 64 KiB, 1 MiB and 16 MiB: time per
 * call, the slowest rank's.
 *
 * After 0.3 s of warm-up for the whole job, each size: a few warm-up rounds (TCP connections are
 * made on first use), then a calibration that doubles the round count until it takes CALIB_S,
 * then REPS timed repetitions that together take about TARGET_S. The median repetition is the headline figure, the best one is printed
 * beside it. Every repetition's data is checked: the echo must equal what was sent (on both
 * ranks), every allreduce element must equal the exact sum. A mismatch prints "P6 FAIL ..." on
 * stderr and aborts the job with status 1.
 *
 * Output (rank 0 only), one "P6 ..." line each, key=value fields:
 *   P6 library <MPI_Get_library_version, first line>
 *   P6 rank rank=R host=H slurm_node=N      (N: SLURMD_NODENAME, "-" outside Slurm)
 *   P6 pingpong bytes=B iters=I reps=R lat_us=.. lat_us_best=.. mb_s=.. mb_s_best=..
 *   P6 allreduce bytes=B iters=I reps=R us=.. us_best=..
 *   P6 done
 * Build: mpicc -O2 -o mpi_p6 mpi_p6.c
 */
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define REPS 7
#define TARGET_S 1.0      /* timed seconds per size, all repetitions together */
#define CALIB_S 0.05      /* the calibration stops once a batch takes this long */
#define WARMUP 3           /* rounds before each size's calibration */
#define JOB_WARMUP_S 0.3  /* 8 B ping-pong before the first size */
#define MAX_ITERS 200000L
#define TAG 6

static int rank, nranks;

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "P6 FAIL rank %d: ", rank);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) fail("cannot allocate %zu bytes", n);
    return p;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A byte pattern that differs per repetition (seed), so a stale buffer never passes the check. */
static void fill(unsigned char *buf, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(((i * 2654435761u) >> 13) ^ (seed * 131u + 7u));
}

/* ---------------------------------------------------------------- ping-pong, ranks 0 and 1 */

struct pp { unsigned char *snd, *rcv; int n; };

static void pingpong(long iters, void *arg) {
    struct pp *p = arg;
    for (long i = 0; i < iters; i++) {
        if (rank == 0) {
            MPI_Send(p->snd, p->n, MPI_BYTE, 1, TAG, MPI_COMM_WORLD);
            MPI_Recv(p->rcv, p->n, MPI_BYTE, 1, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == 1) {  /* echo what arrived */
            MPI_Recv(p->rcv, p->n, MPI_BYTE, 0, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(p->rcv, p->n, MPI_BYTE, 0, TAG, MPI_COMM_WORLD);
        }
    }
}

/* ---------------------------------------------------------------- allreduce, every rank */

struct ar { double *in, *out; int count; };

static void allreduce(long iters, void *arg) {
    struct ar *a = arg;
    for (long i = 0; i < iters; i++)
        MPI_Allreduce(a->in, a->out, a->count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
}

/* Seconds `iters` rounds of `op` take, the slowest rank's (every rank gets the same answer). */
static double timed(void (*op)(long, void *), void *arg, long iters) {
    double mine, slowest;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    op(iters, arg);
    mine = MPI_Wtime() - t0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return slowest;
}

/* Run `op` in growing batches for at least `seconds` (every rank stops together: timed() agrees). */
static void warm_up(void (*op)(long, void *), void *arg, double seconds) {
    double total = 0;
    for (long n = 1; total < seconds; n *= 2) total += timed(op, arg, n);
}

/* Rounds per repetition so that REPS repetitions take about TARGET_S (the same on every rank). */
static long calibrate(void (*op)(long, void *), void *arg) {
    op(WARMUP, arg);
    long n = 1;
    for (;;) {
        double dt = timed(op, arg, n);
        if (dt >= CALIB_S || n >= MAX_ITERS) {
            long iters = (long)(TARGET_S / REPS / (dt / n));
            return iters < 1 ? 1 : iters > MAX_ITERS ? MAX_ITERS : iters;
        }
        n *= 2;
    }
}

static void median_best(double *t, double *median, double *best) {
    qsort(t, REPS, sizeof *t, cmp_double);
    *median = t[REPS / 2];
    *best = t[0];
}

static void run_pingpong(int n) {
    struct pp p = {xmalloc(n), xmalloc(n), n};
    double t[REPS], med, best;
    fill(p.snd, n, 0);
    long iters = calibrate(pingpong, &p);
    for (int r = 0; r < REPS; r++) {
        unsigned seed = (unsigned)(r + 1) * 1000003u + (unsigned)n;
        fill(p.snd, n, seed);  /* rank 1 fills it too: its expected data */
        memset(p.rcv, 0, n);
        t[r] = timed(pingpong, &p, iters) / iters / 2;  /* half a round trip */
        if ((rank == 0 || rank == 1) && memcmp(p.snd, p.rcv, n) != 0)
            fail("ping-pong %d bytes, repetition %d: %s differs from what was sent", n, r,
                 rank == 0 ? "the echo" : "the message");
    }
    median_best(t, &med, &best);
    if (rank == 0)
        printf("P6 pingpong bytes=%d iters=%ld reps=%d lat_us=%.3f lat_us_best=%.3f mb_s=%.2f mb_s_best=%.2f\n",
               n, iters, REPS, med * 1e6, best * 1e6, n / med / 1e6, n / best / 1e6);
    free(p.snd);
    free(p.rcv);
}

static void run_allreduce(int bytes) {
    int count = bytes / (int)sizeof(double);
    struct ar a = {xmalloc(count * sizeof(double)), xmalloc(count * sizeof(double)), count};
    double t[REPS], med, best;
    /* small whole numbers: every sum is exact in double, whatever the reduction order */
    const double ranks_sum = nranks * (nranks + 1) / 2.0;
    for (int i = 0; i < count; i++) a.in[i] = rank + 1 + (i % 1024);
    long iters = calibrate(allreduce, &a);
    for (int r = 0; r < REPS; r++) {
        for (int i = 0; i < count; i++) {
            a.in[i] = rank + 1 + (i % 1024) + r;
            a.out[i] = -1;
        }
        t[r] = timed(allreduce, &a, iters) / iters;
        for (int i = 0; i < count; i++) {
            double want = ranks_sum + (double)nranks * ((i % 1024) + r);
            if (a.out[i] != want)
                fail("allreduce %d bytes, repetition %d: element %d is %.17g, the sum is %.17g", bytes, r, i,
                     a.out[i], want);
        }
    }
    median_best(t, &med, &best);
    if (rank == 0)
        printf("P6 allreduce bytes=%d iters=%ld reps=%d us=%.3f us_best=%.3f\n", bytes, iters, REPS, med * 1e6,
               best * 1e6);
    free(a.in);
    free(a.out);
}

int main(int argc, char **argv) {
    static const int pp_sizes[] = {8, 4 << 10, 64 << 10, 1 << 20, 16 << 20};
    static const int ar_sizes[] = {8, 64 << 10, 1 << 20, 16 << 20};
    char me[128], *all = NULL, lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (nranks < 2) fail("needs at least 2 ranks, has %d", nranks);

    /* where each rank runs: the script checks the two ranks are on two nodes */
    char host[64];
    const char *node = getenv("SLURMD_NODENAME");
    gethostname(host, sizeof host);
    host[sizeof host - 1] = 0;
    snprintf(me, sizeof me, "%s %s", host, node && *node ? node : "-");
    if (rank == 0) all = xmalloc(sizeof me * nranks);
    MPI_Gather(me, sizeof me, MPI_CHAR, all, sizeof me, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Get_library_version(lib, &len);
        lib[strcspn(lib, "\n")] = 0;
        printf("P6 library %s\n", lib);
        for (int r = 0; r < nranks; r++) {
            char h[128], s[128];
            if (sscanf(all + r * sizeof me, "%127s %127s", h, s) != 2) fail("bad host line from rank %d", r);
            printf("P6 rank rank=%d host=%s slurm_node=%s\n", r, h, s);
        }
        fflush(stdout);
        free(all);
    }

    /* the first size would otherwise also time the job's start settling (the other rank's and the
     * launcher's last start-up work, first page faults) */
    struct pp first = {xmalloc(8), xmalloc(8), 8};
    warm_up(pingpong, &first, JOB_WARMUP_S);
    free(first.snd);
    free(first.rcv);

    for (size_t i = 0; i < sizeof pp_sizes / sizeof *pp_sizes; i++) {
        run_pingpong(pp_sizes[i]);
        if (rank == 0) fflush(stdout);
    }
    for (size_t i = 0; i < sizeof ar_sizes / sizeof *ar_sizes; i++) {
        run_allreduce(ar_sizes[i]);
        if (rank == 0) fflush(stdout);
    }
    if (rank == 0) printf("P6 done\n");
    MPI_Finalize();
    return 0;
}
