/* tests/test_comm.c - §2 RANKS, GROUPS, COMMUNICATORS: the threads backend.
 *
 *   cc -std=c11 -O2 -I. -o tests/test_comm tests/test_comm.c -lm -pthread && ./tests/test_comm
 *
 * Every reduction is compared BIT FOR BIT (memcmp, no tolerance) with a serial reference that
 * adds the inputs in group-rank order: that order is the backend's promise. The inputs span
 * 1e-3 .. 1e3, so a different order of the adds gives different bits (test_order_matters
 * checks that the inputs are that sensitive, so the exact comparisons can fail).
 * Rank threads never call mt_expect (the harness counters are not thread-safe): they store
 * what they got, and the main thread checks after mt_world_run has joined them, or they use
 * rank_expect, which takes a mutex.
 * A broken backend hangs rather than fails: main sets alarm(20), so a hang kills the test.
 */
#define MEGATRON_IMPLEMENTATION
#include "../megatron.h"
#include "harness.h"

static pthread_mutex_t rank_expect_mu = PTHREAD_MUTEX_INITIALIZER;
static void rank_expect(int cond, const char *fmt, ...) {
    if (cond) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&rank_expect_mu);
    mt_expect(0, "%s", msg);
    pthread_mutex_unlock(&rank_expect_mu);
}

// input element i of global rank `rank`: a hash, scaled to 1e-3 .. 1e3 so the order of adds matters
static float test_value(int rank, size_t i, unsigned salt) {
    uint32_t x = (uint32_t)rank * 2654435761u ^ (uint32_t)i * 2246822519u ^ salt * 3266489917u;
    x ^= x >> 15; x *= 0x2c1b3c6du; x ^= x >> 12; x *= 0x297a2d39u; x ^= x >> 15;
    static const float scale[7] = {1e-3f, 1e-2f, 1e-1f, 1.0f, 1e1f, 1e2f, 1e3f};
    return ((float)(x & 0xffffffu) / 16777216.0f - 0.5f) * scale[(x >> 24) % 7];
}
static void fill(float *x, size_t n, int rank, unsigned salt) {
    for (size_t i = 0; i < n; i++) x[i] = test_value(rank, i, salt);
}
// the reference semantics, written out: MT_MAX lets NaN through
static float ref_op(float a, float b, mt_reduce_op op) {
    if (op == MT_SUM) return a + b;
    return (b > a || isnan(b)) ? b : a;
}

static int is_member(const int *members, int size, int rank) {
    for (int i = 0; i < size; i++) if (members[i] == rank) return i;
    return -1;
}
static int iota4[4] = {0, 1, 2, 3};

// ---------------------------------------------------------------------------------------------
// one collective on one group inside a world of 4; rank threads store, main checks
// ---------------------------------------------------------------------------------------------
typedef struct {
    const int *members;   // the group under test (global ranks in group-rank order)
    int size;
    size_t n;             // count (per rank for all-gather / reduce-scatter)
    mt_reduce_op op;
    int root;             // broadcast
    int in_place;         // all-gather / reduce-scatter in-place variants
    unsigned salt;
    float *in;            // (4, in_n) inputs by global rank
    float *out;           // (4, out_n) results by global rank
    size_t in_n, out_n;
    double *din, *dout;   // all_reduce_double
    int kind;             // 0 all_reduce, 1 all_reduce_double, 2 all_gather, 3 reduce_scatter, 4 broadcast
} coll_test;

static void coll_rank(mt_world *w, int rank, void *arg) {
    coll_test *t = (coll_test *)arg;
    int me = is_member(t->members, t->size, rank);
    if (me < 0) return;   // not in the group under test
    mt_comm c;
    mt_comm_init(&c, w, rank, t->members, t->size);
    rank_expect(c.rank == me && c.size == t->size && c.global_rank == rank, "rank %d: comm fields", rank);
    float *in = t->in + (size_t)rank * t->in_n, *out = t->out + (size_t)rank * t->out_n;
    switch (t->kind) {
    case 0:
        memcpy(out, in, t->n * sizeof(float));
        mt_all_reduce(&c, out, t->n, t->op);
        break;
    case 1: {
        double *d = t->dout + (size_t)rank * t->n;
        memcpy(d, t->din + (size_t)rank * t->n, t->n * sizeof(double));
        mt_all_reduce_double(&c, d, t->n, t->op);
        break;
    }
    case 2:
        if (t->in_place) {
            memcpy(out + (size_t)me * t->n, in, t->n * sizeof(float));
            mt_all_gather(&c, out + (size_t)me * t->n, out, t->n);
        } else {
            mt_all_gather(&c, in, out, t->n);
        }
        break;
    case 3:
        if (t->in_place) {   // reduce in the caller's input buffer; result lands in chunk `me`
            float *send = (float *)malloc(t->in_n * sizeof(float));
            memcpy(send, in, t->in_n * sizeof(float));
            mt_reduce_scatter(&c, send, send + (size_t)me * t->n, t->n, t->op);
            memcpy(out, send + (size_t)me * t->n, t->n * sizeof(float));
            free(send);
        } else {
            mt_reduce_scatter(&c, in, out, t->n, t->op);
        }
        break;
    case 4:
        memcpy(out, in, t->n * sizeof(float));
        mt_broadcast(&c, out, t->n, t->root);
        break;
    }
}

static int run_coll(coll_test *t, int kind, const int *members, int size, size_t n) {
    t->kind = kind;
    t->members = members;
    t->size = size;
    t->n = n;
    t->in_n = kind == 3 ? (size_t)size * n : n;
    t->out_n = kind == 2 ? (size_t)size * n : n;
    t->in = (float *)calloc(4 * t->in_n + 1, sizeof(float));
    t->out = (float *)calloc(4 * t->out_n + 1, sizeof(float));
    t->din = (double *)calloc(4 * n + 1, sizeof(double));
    t->dout = (double *)calloc(4 * n + 1, sizeof(double));
    for (int r = 0; r < 4; r++) {
        fill(t->in + (size_t)r * t->in_n, t->in_n, r, t->salt);
        for (size_t i = 0; i < n; i++) t->din[(size_t)r * n + i] = (double)test_value(r, i, t->salt) * (1.0 + 1e-9 * (double)i);
    }
    mt_world *w = mt_world_create(4);
    int rc = mt_world_run(w, coll_rank, t);
    mt_world_destroy(w);
    return rc;
}
static void free_coll(coll_test *t) { free(t->in); free(t->out); free(t->din); free(t->dout); }

// group orders that are not sorted, so "group-rank order" and "global order" differ
static const int group1[1] = {2}, group2[2] = {3, 1}, group3[3] = {2, 0, 3}, group4[4] = {1, 3, 0, 2};
static const int *groups_by_size[5] = {NULL, group1, group2, group3, group4};
static const size_t odd_counts[] = {0, 1, 7, 1001, 3001};   // 3001: several 1024-element blocks per slice

MT_TEST(all_reduce) {
    for (int size = 1; size <= 4; size++) {
        for (size_t ci = 0; ci < sizeof odd_counts / sizeof odd_counts[0]; ci++) {
            for (int op = 0; op < 2; op++) {
                coll_test t;
                memset(&t, 0, sizeof t);
                t.op = (mt_reduce_op)op;
                t.salt = (unsigned)(size * 100 + (int)ci * 10 + op);
                size_t n = odd_counts[ci];
                const int *g = groups_by_size[size];
                mt_expect(run_coll(&t, 0, g, size, n) == 0, "all_reduce world failed");
                float *want = (float *)malloc((n + 1) * sizeof(float));
                for (size_t i = 0; i < n; i++) {
                    float acc = t.in[(size_t)g[0] * n + i];
                    for (int j = 1; j < size; j++) acc = ref_op(acc, t.in[(size_t)g[j] * n + i], t.op);
                    want[i] = acc;
                }
                for (int j = 0; j < size; j++) {
                    int ok = n == 0 || memcmp(t.out + (size_t)g[j] * n, want, n * sizeof(float)) == 0;
                    mt_expect(ok, "all_reduce %s size %d n %zu: rank %d differs from the serial reference",
                              op ? "max" : "sum", size, n, g[j]);
                    if (!ok) mt_check_tensor("all_reduce", t.out + (size_t)g[j] * n, want, n, 0.0);   // exact
                }
                free(want);
                free_coll(&t);
            }
        }
    }
}

MT_TEST(all_reduce_max_nan_and_double) {
    // MT_MAX propagates a NaN from any rank (a found-nan flag must not be lost)
    coll_test t;
    memset(&t, 0, sizeof t);
    t.op = MT_MAX;
    t.kind = 0;
    t.members = iota4;
    t.size = 4;
    t.n = t.in_n = t.out_n = 5;
    t.in = (float *)calloc(20, sizeof(float));
    t.out = (float *)calloc(20, sizeof(float));
    for (int i = 0; i < 20; i++) t.in[i] = (float)i;
    t.in[2 * 5 + 3] = NAN;   // rank 2, element 3
    mt_world *w = mt_world_create(4);
    mt_expect(mt_world_run(w, coll_rank, &t) == 0, "run");
    mt_world_destroy(w);
    for (int r = 0; r < 4; r++) {
        mt_expect(t.out[r * 5 + 0] == 15.0f && t.out[r * 5 + 4] == 19.0f, "max of rank %d", r);
        mt_expect(isnan(t.out[r * 5 + 3]), "rank %d: NaN lost in MT_MAX", r);
    }
    free(t.in);
    free(t.out);

    // all_reduce_double: sum in double, group-rank order, exact
    for (int size = 2; size <= 4; size++) {
        for (int op = 0; op < 2; op++) {
            coll_test d;
            memset(&d, 0, sizeof d);
            d.op = (mt_reduce_op)op;
            d.salt = 77u + (unsigned)size;
            size_t n = 1001;
            const int *g = groups_by_size[size];
            mt_expect(run_coll(&d, 1, g, size, n) == 0, "run");
            for (size_t i = 0; i < n; i++) {
                double acc = d.din[(size_t)g[0] * n + i];
                for (int j = 1; j < size; j++) {
                    double x = d.din[(size_t)g[j] * n + i];
                    acc = op == MT_SUM ? acc + x : ((x > acc || isnan(x)) ? x : acc);
                }
                int same = 1;
                for (int j = 0; j < size; j++) same &= memcmp(&d.dout[(size_t)g[j] * n + i], &acc, sizeof acc) == 0;
                if (!same) { mt_expect(0, "all_reduce_double size %d op %d: element %zu differs", size, op, i); break; }
            }
            free_coll(&d);
        }
    }
}

MT_TEST(all_gather_reduce_scatter_broadcast) {
    const size_t counts[] = {0, 1, 5, 1001};
    for (int size = 1; size <= 4; size++) {
        const int *g = groups_by_size[size];
        for (size_t ci = 0; ci < 4; ci++) {
            size_t n = counts[ci];
            for (int in_place = 0; in_place < 2; in_place++) {
                // all-gather: rank j's chunk j is its input, in group-rank order
                coll_test t;
                memset(&t, 0, sizeof t);
                t.salt = 500u + (unsigned)ci;
                t.in_place = in_place;
                mt_expect(run_coll(&t, 2, g, size, n) == 0, "run");
                for (int j = 0; j < size; j++)
                    for (int k = 0; k < size; k++) {
                        int ok = n == 0 || memcmp(t.out + (size_t)g[j] * t.out_n + (size_t)k * n, t.in + (size_t)g[k] * n, n * sizeof(float)) == 0;
                        mt_expect(ok, "all_gather size %d n %zu%s: rank %d chunk %d", size, n, in_place ? " in place" : "", g[j], k);
                    }
                free_coll(&t);

                // reduce-scatter: rank j gets chunk j reduced in group-rank order
                for (int op = 0; op < 2; op++) {
                    memset(&t, 0, sizeof t);
                    t.salt = 600u + (unsigned)ci;
                    t.op = (mt_reduce_op)op;
                    t.in_place = in_place;
                    mt_expect(run_coll(&t, 3, g, size, n) == 0, "run");
                    for (int j = 0; j < size; j++)
                        for (size_t i = 0; i < n; i++) {
                            size_t at = (size_t)j * n + i;
                            float acc = t.in[(size_t)g[0] * t.in_n + at];
                            for (int k = 1; k < size; k++) acc = ref_op(acc, t.in[(size_t)g[k] * t.in_n + at], t.op);
                            if (memcmp(&acc, &t.out[(size_t)g[j] * n + i], sizeof acc) != 0) {
                                mt_expect(0, "reduce_scatter size %d n %zu op %d%s: rank %d element %zu: got %.9g want %.9g",
                                          size, n, op, in_place ? " in place" : "", g[j], i, (double)t.out[(size_t)g[j] * n + i], (double)acc);
                                break;
                            }
                        }
                    free_coll(&t);
                }
            }
            // broadcast from every root, the non-zero ones included
            for (int root = 0; root < size; root++) {
                coll_test t;
                memset(&t, 0, sizeof t);
                t.salt = 700u + (unsigned)root;
                t.root = root;
                mt_expect(run_coll(&t, 4, g, size, n) == 0, "run");
                for (int j = 0; j < size; j++) {
                    int ok = n == 0 || memcmp(t.out + (size_t)g[j] * n, t.in + (size_t)g[root] * n, n * sizeof(float)) == 0;
                    mt_expect(ok, "broadcast size %d n %zu root %d: rank %d", size, n, root, g[j]);
                }
                free_coll(&t);
            }
        }
    }
}

// all_gather(reduce_scatter(x)) must equal all_reduce(x) bit for bit: the distributed optimizer
// relies on it to match the plain data-parallel run
typedef struct { size_t n; float *ar, *rs_ag; } rs_ag_test;   // n per rank; ar, rs_ag (3, 3n)
static void rs_ag_rank(mt_world *w, int rank, void *arg) {
    rs_ag_test *t = (rs_ag_test *)arg;
    mt_comm c;
    mt_comm_init(&c, w, rank, iota4, 3);
    size_t total = 3 * t->n;
    float *x = (float *)malloc(total * sizeof(float));
    float *chunk = (float *)malloc(t->n * sizeof(float));
    float *ar = t->ar + (size_t)rank * total, *rs_ag = t->rs_ag + (size_t)rank * total;
    fill(x, total, rank, 901u);
    memcpy(ar, x, total * sizeof(float));
    mt_all_reduce(&c, ar, total, MT_SUM);
    mt_reduce_scatter(&c, x, chunk, t->n, MT_SUM);
    mt_all_gather(&c, chunk, rs_ag, t->n);
    free(x);
    free(chunk);
}
MT_TEST(reduce_scatter_then_all_gather_is_all_reduce) {
    rs_ag_test t;
    t.n = 333;
    t.ar = (float *)calloc(9 * t.n, sizeof(float));
    t.rs_ag = (float *)calloc(9 * t.n, sizeof(float));
    mt_world *w = mt_world_create(3);
    mt_expect(mt_world_run(w, rs_ag_rank, &t) == 0, "run");
    mt_world_destroy(w);
    for (int r = 0; r < 3; r++) {
        mt_expect(memcmp(t.ar + (size_t)r * 3 * t.n, t.rs_ag + (size_t)r * 3 * t.n, 3 * t.n * sizeof(float)) == 0,
                  "rank %d: all_gather(reduce_scatter(x)) != all_reduce(x)", r);
        mt_expect(memcmp(t.ar, t.ar + (size_t)r * 3 * t.n, 3 * t.n * sizeof(float)) == 0, "rank %d: all_reduce differs from rank 0", r);
    }
    free(t.ar);
    free(t.rs_ag);
}

// ---------------------------------------------------------------------------------------------
// barrier: nobody leaves before everybody arrived
// ---------------------------------------------------------------------------------------------
typedef struct { int flags[4]; int rounds; } barrier_test;
static void barrier_rank(mt_world *w, int rank, void *arg) {
    barrier_test *t = (barrier_test *)arg;
    mt_comm c;
    mt_comm_init(&c, w, rank, iota4, 4);
    for (int k = 1; k <= t->rounds; k++) {
        if (rank == 3 && k % 10 == 1) {   // a slow rank: a broken barrier lets the others run ahead
            struct timespec ts = {0, 5 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        t->flags[rank] = k;   // ordered by the barrier's mutex: no data race
        mt_barrier(&c);
        for (int r = 0; r < 4; r++) rank_expect(t->flags[r] == k, "round %d: rank %d sees rank %d's flag %d", k, rank, r, t->flags[r]);
        mt_barrier(&c);
    }
}
MT_TEST(barrier) {
    barrier_test t;
    memset(&t, 0, sizeof t);
    t.rounds = 100;
    mt_world *w = mt_world_create(4);
    mt_expect(mt_world_run(w, barrier_rank, &t) == 0, "run");
    mt_world_destroy(w);
}

// ---------------------------------------------------------------------------------------------
// overlapping groups at once: world 4 = TP 2 x DP 2, TP {0,1} {2,3}, DP {0,2} {1,3}
// ---------------------------------------------------------------------------------------------
#define OVL_ITERS 200
#define OVL_N 33
#define OVL_NDP 17   // the first 17 elements are max-reduced over DP, the rest broadcast over DP
static void ovl_rank(mt_world *w, int rank, void *arg) {
    float *res = (float *)arg;   // (4, OVL_ITERS, OVL_N)
    int tp_members[2] = {rank & ~1, rank | 1}, dp_members[2] = {rank & 1, (rank & 1) + 2};
    mt_comm tp, dp, world;
    mt_comm_init(&tp, w, rank, tp_members, 2);
    tp.name = "tp";
    mt_comm_init(&dp, w, rank, dp_members, 2);
    dp.name = "dp";
    mt_comm_init(&world, w, rank, iota4, 4);
    world.name = "world";
    for (int it = 0; it < OVL_ITERS; it++) {
        float *x = res + ((size_t)rank * OVL_ITERS + (size_t)it) * OVL_N;
        fill(x, OVL_N, rank, (unsigned)it);
        mt_all_reduce(&tp, x, OVL_N, MT_SUM);
        mt_all_reduce(&dp, x, OVL_NDP, MT_MAX);
        if (it % 10 == 0) mt_barrier(&world);
        mt_broadcast(&dp, x + OVL_NDP, OVL_N - OVL_NDP, it % 2);
    }
}
MT_TEST(overlapping_groups_concurrently) {
    float *res = (float *)calloc(4 * OVL_ITERS * OVL_N, sizeof(float));
    mt_world *w = mt_world_create(4);
    mt_expect(mt_world_run(w, ovl_rank, res) == 0, "run");
    mt_world_destroy(w);
    int bad = 0;
    for (int it = 0; it < OVL_ITERS && !bad; it++) {
        // after the TP all-reduce every rank of TP pair p holds s_p = x_{2p} + x_{2p+1}; both DP
        // groups {0,2} and {1,3} then hold (s_0, s_1) in group-rank order; the DP broadcast's
        // root (group rank it%2) holds s_{it%2}
        float x[4][OVL_N], s[2][OVL_N], want[OVL_N];
        for (int r = 0; r < 4; r++) fill(x[r], OVL_N, r, (unsigned)it);
        for (int i = 0; i < OVL_N; i++) { s[0][i] = x[0][i] + x[1][i]; s[1][i] = x[2][i] + x[3][i]; }
        for (int i = 0; i < OVL_N; i++) want[i] = i < OVL_NDP ? ref_op(s[0][i], s[1][i], MT_MAX) : s[it % 2][i];
        for (int r = 0; r < 4; r++) {
            if (memcmp(res + ((size_t)r * OVL_ITERS + (size_t)it) * OVL_N, want, sizeof want) != 0) {
                mt_expect(0, "iteration %d rank %d differs from the serial reference", it, r);
                bad = 1;
            }
        }
    }
    free(res);
}

// ---------------------------------------------------------------------------------------------
// send / recv
// ---------------------------------------------------------------------------------------------
static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void pingpong_rank(mt_world *w, int rank, void *arg) {
    (void)arg;
    int members[2] = {1, 0};   // group rank != global rank: peer numbers are GROUP ranks
    mt_comm c;
    mt_comm_init(&c, w, rank, members, 2);
    int peer = 1 - c.rank;
    float x[7];
    for (int round = 0; round < 200; round++) {
        if (rank == 0) {
            for (int i = 0; i < 7; i++) x[i] = (float)(round + i);
            mt_send(&c, x, 7, peer, 0);
            mt_recv(&c, x, 7, peer, 0);
            for (int i = 0; i < 7; i++) rank_expect(x[i] == (float)(round + i + 1), "ping-pong round %d: got %g", round, (double)x[i]);
        } else {
            mt_recv(&c, x, 7, peer, 0);
            for (int i = 0; i < 7; i++) x[i] += 1.0f;
            mt_send(&c, x, 7, peer, 0);
        }
    }
    // a message to oneself is buffered too
    float y[3] = {1, 2, 3}, z[3] = {0, 0, 0};
    mt_send(&c, y, 3, c.rank, 42);
    mt_recv(&c, z, 3, c.rank, 42);
    rank_expect(z[0] == 1 && z[1] == 2 && z[2] == 3, "rank %d: send to self", rank);
    // n == 0
    mt_send(&c, NULL, 0, peer, 7);
    mt_recv(&c, NULL, 0, peer, 7);
}
MT_TEST(send_recv_ping_pong) {
    mt_world *w = mt_world_create(2);
    mt_expect(mt_world_run(w, pingpong_rank, NULL) == 0, "run");
    mt_world_destroy(w);
}

#define MANY 3000
static void tags_rank(mt_world *w, int rank, void *arg) {
    (void)arg;
    mt_comm c;
    mt_comm_init(&c, w, rank, iota4, 2);
    float a[3] = {2, 2, 2}, b[3] = {1, 1, 1}, got[3];
    if (rank == 0) {
        // out of order: tag 2 first, tag 1 a little later, so the receiver waits for tag 1
        // with tag 2 already in its mailbox
        mt_send(&c, a, 3, 1, 2);
        sleep_ms(10);
        mt_send(&c, b, 3, 1, 1);
    } else {
        mt_recv(&c, got, 3, 0, 1);
        rank_expect(got[0] == 1 && got[2] == 1, "tag 1 received %g", (double)got[0]);
        mt_recv(&c, got, 3, 0, 2);
        rank_expect(got[0] == 2 && got[2] == 2, "tag 2 received %g", (double)got[0]);
    }
    // many messages both ways: message i has tag i%3, i%5+1 floats, all equal to i. Each side
    // receives all tag-2 messages first, then tag 0, then tag 1: FIFO within a tag.
    float buf[5];
    for (int i = 0; i < MANY; i++) {
        for (int k = 0; k < 5; k++) buf[k] = (float)i;
        mt_send(&c, buf, (size_t)(i % 5 + 1), 1 - rank, i % 3);
    }
    const int order[3] = {2, 0, 1};
    for (int o = 0; o < 3; o++) {
        for (int i = order[o]; i < MANY; i += 3) {
            for (int k = 0; k < 5; k++) buf[k] = -1.0f;
            mt_recv(&c, buf, (size_t)(i % 5 + 1), 1 - rank, order[o]);
            rank_expect(buf[0] == (float)i && buf[i % 5] == (float)i && (i % 5 == 4 || buf[i % 5 + 1] == -1.0f),
                        "rank %d: message %d arrived as %g", rank, i, (double)buf[0]);
        }
    }
}
MT_TEST(send_recv_tags_and_many_messages) {
    mt_world *w = mt_world_create(2);
    mt_expect(mt_world_run(w, tags_rank, NULL) == 0, "run");
    mt_world_destroy(w);
}

// ---------------------------------------------------------------------------------------------
// batches of pipeline messages (mt_p2p_batch): NCCL's rules on the threads backend
// ---------------------------------------------------------------------------------------------
typedef struct { double send_returned_after_ms[2]; } batch_test;
static void batch_rank(mt_world *w, int rank, void *arg) {
    batch_test *t = (batch_test *)arg;
    int members[2] = {1, 0};   // group ranks are not global ranks
    mt_comm c;
    mt_comm_init(&c, w, rank, members, 2);
    int peer = 1 - c.rank;
    // 1F1B's steady state: both ranks send and receive at once, in one batch each, 100 rounds;
    // every message carries (round, sender) so a mix-up shows
    float out[5], in[5];
    for (int round = 0; round < 100; round++) {
        for (int i = 0; i < 5; i++) out[i] = (float)(round * 10 + rank + i);
        mt_p2p_op ops[2] = {{0, out, 5, peer, round}, {1, in, 5, peer, round}};
        if (rank == 1) {   // the order inside a batch does not matter
            mt_p2p_op tmp = ops[0];
            ops[0] = ops[1];
            ops[1] = tmp;
        }
        mt_p2p_batch(&c, ops, 2);
        for (int i = 0; i < 5; i++)
            rank_expect(in[i] == (float)(round * 10 + (1 - rank) + i), "rank %d round %d: got %g", rank, round,
                        (double)in[i]);
    }
    // a send alone returns only when its receiver has the message, as NCCL's does: rank 1 takes
    // it 50 ms late. Two sends to the same peer in one batch arrive in order.
    float a[2] = {1, 1}, b[2] = {2, 2}, got[2];
    if (rank == 0) {
        double t0 = mt_time_seconds();
        mt_p2p_op ops[2] = {{0, a, 2, peer, 7}, {0, b, 2, peer, 8}};
        mt_p2p_batch(&c, ops, 2);
        t->send_returned_after_ms[0] = 1e3 * (mt_time_seconds() - t0);
    } else {
        sleep_ms(50);
        mt_p2p_op first = {1, got, 2, peer, 7}, second = {1, got, 2, peer, 8};
        mt_p2p_batch(&c, &first, 1);
        rank_expect(got[0] == 1 && got[1] == 1, "the first message: %g", (double)got[0]);
        mt_p2p_batch(&c, &second, 1);
        rank_expect(got[0] == 2 && got[1] == 2, "the second message: %g", (double)got[0]);
    }
    // the counters: a call per send and per receive, the bytes each side moved
    // (100 rounds of 2 x 5 floats, then rank 0's two sends and rank 1's two receives of 2 floats)
    rank_expect(c.calls == 202 && c.bytes == 100 * 2 * 5 * 4 + 2 * 2 * 4, "rank %d: %llu calls, %llu bytes", rank,
                c.calls, c.bytes);
    // a batch may send to its own rank and receive it (NCCL allows it; test_kernels' p2p_batch_nccl
    // runs the GPU's NCCL path that way on one GPU)
    float mine[3] = {rank + 0.5f, 7, 9}, back[3] = {0, 0, 0};
    mt_p2p_op self[2] = {{0, mine, 3, c.rank, 3}, {1, back, 3, c.rank, 3}};
    mt_p2p_batch(&c, self, 2);
    rank_expect(back[0] == rank + 0.5f && back[1] == 7 && back[2] == 9, "rank %d: a batch to itself got %g", rank,
                (double)back[0]);
}
MT_TEST(p2p_batch_pairs_and_waits) {
    batch_test t;
    memset(&t, 0, sizeof t);
    mt_world *w = mt_world_create(2);
    mt_expect(mt_world_run(w, batch_rank, &t) == 0, "run");
    mt_world_destroy(w);
    mt_expect(t.send_returned_after_ms[0] >= 45.0, "a send returned %.1f ms after it began, before its receiver "
              "took it (50 ms)", t.send_returned_after_ms[0]);
}

// ---------------------------------------------------------------------------------------------
// errors: one rank's mt_fatal stops all ranks; mistakes that would hang are reported instead
// ---------------------------------------------------------------------------------------------
typedef struct { int scenario; int after[4]; } fail_test;
static void fail_rank(mt_world *w, int rank, void *arg) {
    fail_test *t = (fail_test *)arg;
    int tp_members[2] = {rank & ~1, rank | 1}, dp_members[2] = {rank & 1, (rank & 1) + 2};
    mt_comm world, tp, dp;
    mt_comm_init(&world, w, rank, iota4, mt_world_size(w));
    world.name = "world";
    float x[7] = {0};
    switch (t->scenario) {
    case 0:   // rank 2 fails while 0, 1, 3 wait in an all-reduce with it
        if (rank == 2) {
            sleep_ms(20);
            mt_fatal("rank 2 failed on purpose\nhint: nothing to fix, this is a test");
        } else {
            mt_all_reduce(&world, x, 7, MT_SUM);
        }
        break;
    case 1:   // ... while 0 waits in recv, 1 in a TP barrier, 3 in a DP all-reduce
        mt_comm_init(&tp, w, rank, tp_members, 2);
        tp.name = "tp";
        mt_comm_init(&dp, w, rank, dp_members, 2);
        dp.name = "dp";
        if (rank == 2) { sleep_ms(20); mt_fatal("rank 2 failed on purpose"); }
        if (rank == 0) mt_recv(&world, x, 7, 2, 0);
        if (rank == 1) mt_barrier(&tp);
        if (rank == 3) mt_all_reduce(&dp, x, 7, MT_SUM);
        break;
    case 2:   // world 2: a count mismatch between send and recv
        if (rank == 0) mt_send(&world, x, 4, 1, 9);
        else mt_recv(&world, x, 5, 0, 9);
        break;
    case 3:   // world 2: rank 1 returns while rank 0 waits for it in an all-reduce
        if (rank == 0) mt_all_reduce(&world, x, 7, MT_SUM);
        break;
    case 4:   // world 2: rank 1 returns while rank 0 waits for its message
        if (rank == 0) mt_recv(&world, x, 7, 1, 3);
        break;
    case 5:   // world 2: collectives whose counts disagree
        mt_all_reduce(&world, x, rank == 0 ? 5 : 6, MT_SUM);
        break;
    case 6:   // world 2: different collectives
        if (rank == 0) mt_broadcast(&world, x, 7, 0);
        else mt_all_gather(&world, x, x, 3);
        break;
    case 7:   // world 2: waiting for a message from oneself
        if (rank == 1) mt_recv(&world, x, 7, 1, 0);
        else mt_barrier(&world);
        break;
    case 8:   // world 2: a barrier against an all-reduce
        if (rank == 0) mt_barrier(&world);
        else mt_all_reduce(&world, x, 3, MT_MAX);
        break;
    case 9: {   // world 2: a batch receives tag 2 first, but tag 1 was sent first (NCCL has no tags)
        mt_p2p_op sends[2] = {{0, x, 3, 1, 1}, {0, x + 3, 3, 1, 2}}, recv = {1, x, 3, 0, 2};
        if (rank == 0) mt_p2p_batch(&world, sends, 2);
        else mt_p2p_batch(&world, &recv, 1);
        break;
    }
    case 10: {   // world 2: a batch's send that rank 1 never receives
        mt_p2p_op send = {0, x, 3, 1, 4};
        if (rank == 0) mt_p2p_batch(&world, &send, 1);
        break;
    }
    }
    t->after[rank] = 1;   // only the ranks that were not stopped get here
}
static const char *run_failing(int scenario, int world_size, fail_test *t) {
    static char error[2048];
    memset(t, 0, sizeof *t);
    t->scenario = scenario;
    mt_world *w = mt_world_create(world_size);
    int rc = mt_world_run(w, fail_rank, t);
    const char *e = mt_world_error(w);
    snprintf(error, sizeof error, "%s", e ? e : "");
    mt_expect(rc == 1 && e != NULL, "scenario %d: mt_world_run returned %d, error %s", scenario, rc, e ? e : "(none)");
    mt_world_destroy(w);
    return error;
}
MT_TEST(fatal_in_one_rank_stops_all) {
    fprintf(stderr, "  (the \"error:\" lines below are expected)\n");
    fail_test t;
    const char *e = run_failing(0, 4, &t);
    // the recorded message names the rank that failed, then mt_fatal's text
    mt_expect(strcmp(e, "rank 2: rank 2 failed on purpose\nhint: nothing to fix, this is a test") == 0, "error recorded: '%s'", e);
    for (int r = 0; r < 4; r++) mt_expect(t.after[r] == 0, "rank %d went on after the abort", r);
    e = run_failing(1, 4, &t);
    mt_expect(strcmp(e, "rank 2: rank 2 failed on purpose") == 0, "error recorded: '%s'", e);
    for (int r = 0; r < 4; r++) mt_expect(t.after[r] == 0, "rank %d went on after the abort", r);
}
MT_TEST(errors_instead_of_hangs) {
    fail_test t;
    const char *e = run_failing(2, 2, &t);
    mt_expect(strstr(e, "received 4 floats") && strstr(e, "expected 5"), "wrong count: '%s'", e);
    mt_expect(t.after[1] == 0, "the receiver went on with a wrong count");
    e = run_failing(3, 2, &t);
    mt_expect(strstr(e, "waits in all_reduce on group world for rank 1") != NULL, "returned partner: '%s'", e);
    e = run_failing(4, 2, &t);
    mt_expect(strstr(e, "from rank 1") && strstr(e, "can never arrive"), "returned sender: '%s'", e);
    e = run_failing(5, 2, &t);
    mt_expect(strstr(e, "n=5") && strstr(e, "n=6"), "count mismatch: '%s'", e);
    mt_expect(t.after[0] == 0 && t.after[1] == 0, "a rank went on after a count mismatch");
    e = run_failing(6, 2, &t);
    mt_expect(strstr(e, "broadcast") && strstr(e, "all_gather"), "kind mismatch: '%s'", e);
    e = run_failing(7, 2, &t);
    mt_expect(strstr(e, "itself") != NULL, "recv from self: '%s'", e);
    e = run_failing(8, 2, &t);
    mt_expect(strstr(e, "barrier()") && strstr(e, "all_reduce(n=3, max)"), "barrier vs all_reduce: '%s'", e);
    mt_expect(t.after[0] == 0 && t.after[1] == 0, "a rank went on after a barrier mismatch");
    e = run_failing(9, 2, &t);
    mt_expect(strstr(e, "receives tag 2") && strstr(e, "next message to it is tag 1") && strstr(e, "in the same order"),
              "batch out of order: '%s'", e);
    e = run_failing(10, 2, &t);
    mt_expect(strstr(e, "never received") && strstr(e, "tag 4"), "batch send never received: '%s'", e);
}

// ---------------------------------------------------------------------------------------------
// determinism: the same reduction twice (and in a second run of the world) is bit-identical
// ---------------------------------------------------------------------------------------------
#define DET_N 100003
static void det_rank(mt_world *w, int rank, void *arg) {
    float *res = (float *)arg;   // (3 ranks, 2 repeats, DET_N)
    mt_comm c;
    mt_comm_init(&c, w, rank, iota4, 3);
    for (int k = 0; k < 2; k++) {
        float *x = res + ((size_t)rank * 2 + (size_t)k) * DET_N;
        fill(x, DET_N, rank, 4242u);
        if (rank == 1 && k == 1) sleep_ms(5);   // different timing, same bits
        mt_all_reduce(&c, x, DET_N, MT_SUM);
    }
}
MT_TEST(determinism) {
    size_t per_run = 3 * 2 * (size_t)DET_N;
    float *res = (float *)calloc(2 * per_run, sizeof(float));
    mt_world *w = mt_world_create(3);
    mt_expect(mt_world_run(w, det_rank, res) == 0, "run 1");
    mt_expect(mt_world_run(w, det_rank, res + per_run) == 0, "run 2 of the same world");
    mt_world_destroy(w);
    for (size_t k = 1; k < 12; k++)
        mt_expect(memcmp(res, res + k * DET_N, DET_N * sizeof(float)) == 0, "result %zu differs from result 0", k);
    free(res);
}
// the exact comparisons above can fail: on these inputs another order of the adds gives other bits
MT_TEST(order_matters) {
    size_t n = 1001, differ = 0;
    float *x[4];
    for (int r = 0; r < 4; r++) { x[r] = (float *)malloc(n * sizeof(float)); fill(x[r], n, r, 123u); }
    for (size_t i = 0; i < n; i++) {
        float fwd = ((x[0][i] + x[1][i]) + x[2][i]) + x[3][i];
        float rev = ((x[3][i] + x[2][i]) + x[1][i]) + x[0][i];
        if (memcmp(&fwd, &rev, sizeof fwd) != 0) differ++;
    }
    mt_expect(differ > 10, "only %zu of %zu sums depend on the order: the inputs are too tame", differ, n);
    for (int r = 0; r < 4; r++) free(x[r]);
}

// ---------------------------------------------------------------------------------------------
// naming: threads are "r<rank>", equal member lists make independent groups, MT_TRACE lines
// ---------------------------------------------------------------------------------------------
static void names_rank(mt_world *w, int rank, void *arg) {
    (void)arg;
#if defined(__linux__)
    char name[16] = "", want[16];
    pthread_getname_np(pthread_self(), name, sizeof name);
    snprintf(want, sizeof want, "r%d", rank);
    rank_expect(strcmp(name, want) == 0, "thread of rank %d is named '%s'", rank, name);
#endif
    rank_expect(mt_thread_rank() == rank, "mt_thread_rank() = %d in rank %d", mt_thread_rank(), rank);
    mt_comm world, dp;   // world 2 with DP 2: same members, two groups
    mt_comm_init(&world, w, rank, iota4, 2);
    mt_comm_init(&dp, w, rank, iota4, 2);
    rank_expect(world.group != dp.group, "equal member lists share one group");
    float a[3] = {1, 2, 3}, b[5] = {1, 1, 1, 1, 1};
    mt_all_reduce(&world, a, 3, MT_SUM);
    mt_all_reduce(&dp, b, 5, MT_SUM);
    rank_expect(a[2] == 6.0f && b[4] == 2.0f, "rank %d: sums", rank);
}
MT_TEST(thread_names_and_groups) {
    mt_expect(mt_thread_rank() == -1, "main thread is not a rank");
    mt_world *w = mt_world_create(2);
    mt_expect(mt_world_run(w, names_rank, NULL) == 0, "run");
    mt_world_destroy(w);
}

static void trace_rank(mt_world *w, int rank, void *arg) {
    (void)arg;
    mt_comm tp;
    mt_comm_init(&tp, w, rank, iota4, 2);
    tp.name = "tp";
    float x[7] = {0};
    mt_all_reduce(&tp, x, 7, MT_SUM);
    if (rank == 1) mt_send(&tp, x, 3, 0, 5);
    else mt_recv(&tp, x, 3, 1, 5);
}
MT_TEST(trace) {
    char path[] = "/tmp/mt_test_trace_XXXXXX";
    int fd = mkstemp(path);
    mt_expect(fd >= 0, "mkstemp");
    if (fd < 0) return;
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    setenv("MT_TRACE", "1", 1);
    mt_world *w = mt_world_create(2);
    unsetenv("MT_TRACE");
    int rc = mt_world_run(w, trace_rank, NULL);
    mt_world_destroy(w);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    mt_expect(rc == 0, "run");
    char text[4096] = "";
    FILE *f = fopen(path, "r");
    if (f) { size_t len = fread(text, 1, sizeof text - 1, f); text[len] = '\0'; fclose(f); }
    remove(path);
    const char *want[] = {"[r0] all_reduce tp n=7\n", "[r1] all_reduce tp n=7\n", "[r1] send -> r0 tag 5 n=3\n", "[r0] recv <- r1 tag 5 n=3\n"};
    for (int i = 0; i < 4; i++) mt_expect(strstr(text, want[i]) != NULL, "trace lacks '%s'; got:\n%s", want[i], text);
}

// ---------------------------------------------------------------------------------------------
// speed, for information: 4 ranks all-reduce 4 MB each (a CPU layer's activations)
// ---------------------------------------------------------------------------------------------
#define BENCH_N (1u << 20)
#define BENCH_ITERS 10
static void bench_rank(mt_world *w, int rank, void *arg) {
    double *seconds = (double *)arg;
    mt_comm c;
    mt_comm_init(&c, w, rank, iota4, 4);
    float *x = (float *)calloc(BENCH_N, sizeof(float));
    mt_all_reduce(&c, x, BENCH_N, MT_SUM);   // warm up (page faults)
    double t0 = mt_time_seconds();
    for (int k = 0; k < BENCH_ITERS; k++) mt_all_reduce(&c, x, BENCH_N, MT_SUM);
    if (rank == 0) *seconds = (mt_time_seconds() - t0) / BENCH_ITERS;
    free(x);
}
MT_TEST(all_reduce_speed) {
    double s = 0.0;
    mt_world *w = mt_world_create(4);
    mt_expect(mt_world_run(w, bench_rank, &s) == 0, "run");
    mt_world_destroy(w);
    printf("  all_reduce 4 ranks x %u floats: %.3f ms (%.2f GB/s per rank's buffer)\n",
           BENCH_N, s * 1e3, (double)BENCH_N * sizeof(float) / s / 1e9);
}

int main(void) {
    alarm(20);   // a hang is a failure: SIGALRM ends the process with a non-zero status
    mt_run_test(all_reduce);
    mt_run_test(all_reduce_max_nan_and_double);
    mt_run_test(all_gather_reduce_scatter_broadcast);
    mt_run_test(reduce_scatter_then_all_gather_is_all_reduce);
    mt_run_test(barrier);
    mt_run_test(overlapping_groups_concurrently);
    mt_run_test(send_recv_ping_pong);
    mt_run_test(send_recv_tags_and_many_messages);
    mt_run_test(p2p_batch_pairs_and_waits);
    mt_run_test(fatal_in_one_rank_stops_all);
    mt_run_test(errors_instead_of_hangs);
    mt_run_test(determinism);
    mt_run_test(order_matters);
    mt_run_test(thread_names_and_groups);
    mt_run_test(trace);
    mt_run_test(all_reduce_speed);
    return mt_test_summary();
}
