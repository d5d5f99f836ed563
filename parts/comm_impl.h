// =============================================================================================
// 2. RANKS, GROUPS, COMMUNICATORS
// =============================================================================================
// What NCCL does between GPUs, done with threads for the CPU build: every rank is a pthread of
// this one process, so a rank can read and write another rank's buffers directly. A group
// (tp, dp, pp, embd, world) is a small shared struct; a collective is "post my buffers, wait
// for every member, each member does its disjoint part of the work, wait again".
// Mirrors torch.distributed / NCCL (the calls) and megatron/core/parallel_state.py (the groups).
//
//   mt_world   one per process: the registry of groups, one mailbox per rank, the abort flag
//   mt__group  one per group: a barrier (mutex + condition variable + generation counter) and
//              a table where each member posts what it is calling and with which buffers
//   mt_comm    one per (rank, group): the handle a rank passes around, ncclComm_t's role
//
// What the backend promises:
//  - deterministic: a reduction adds rank 0 + rank 1 + ... + rank size-1, in group order and in
//    the buffer's own type, for every element. Results are bit-identical on every rank, in every
//    run, whatever the thread timing, and equal to one thread adding the inputs in that order.
//  - no busy waiting: a rank that waits sleeps in pthread_cond_wait and burns no core.
//  - no hang on errors: mt_fatal in any rank aborts the world, every waiting rank wakes up and
//    ends, and mt_world_run prints the error once and returns 1.

// ---------------------------------------------------------------------------------------------
// shared state: groups, mailboxes, the world
// ---------------------------------------------------------------------------------------------
typedef enum {   // what a member posts that it is calling; all members must agree
    MT__COLL_BARRIER = 0, MT__COLL_ALL_REDUCE, MT__COLL_ALL_REDUCE_DOUBLE,
    MT__COLL_ALL_GATHER, MT__COLL_REDUCE_SCATTER, MT__COLL_BROADCAST
} mt__coll_kind;
static const char *const mt__coll_names[] = {
    "barrier", "all_reduce", "all_reduce_double", "all_gather", "reduce_scatter", "broadcast"
};

typedef struct {         // one member's side of the collective in progress
    int kind;            // mt__coll_kind
    int arg;             // mt_reduce_op for reductions, root for broadcast, 0 otherwise
    size_t n;            // count as the member passed it (per rank for all-gather/reduce-scatter)
    const void *send;    // the member's input buffer
    void *recv;          // the member's output buffer (== send for the in-place calls)
} mt__post;

typedef struct mt__group {
    int size;
    int *members;              // (size,) global ranks in group-rank order; mt_comm.members
    int *joined;               // (size,) member i's mt_comm_init took this group (world->mu)
    struct mt__group *next;    // the world's registry is a list
    pthread_mutex_t mu;        // guards everything below
    pthread_cond_t cv;         // members wait here for the barrier to open
    int arrived;               // members inside the current barrier
    unsigned long generation;  // barriers completed so far
    mt__post *posts;           // (size,) what each member calls, with its buffers
    int aborted;               // the world was aborted (copied here under mu, see abort)
    int *done;                 // (size,) member's rank function has returned
    int n_done;
    int mismatch;              // the last sync 1 found members calling different collectives
    char mismatch_msg[512];
} mt__group;

typedef struct mt__message {   // one buffered send; its floats follow the struct in memory
    struct mt__message *next;
    int tag;
    size_t n;
    float *data;               // (n,) == (float *)(message + 1)
} mt__message;

typedef struct {               // the mailbox of one destination rank
    pthread_mutex_t mu;        // guards everything below
    pthread_cond_t cv;         // the owner waits here in mt_recv
    mt__message **head;        // (world size,) FIFO of messages per source rank
    mt__message **tail;
    int *src_done;             // (world size,) source's rank function has returned
    int aborted;
} mt__inbox;

struct mt_world {
    int size;
    int trace;                 // MT_TRACE=1: one stderr line per collective and send/recv
    pthread_mutex_t mu;        // guards groups (and their joined[]), rank_done, aborted, error
    mt__group *groups;         // registry of every group made by mt_comm_init
    mt__inbox *inbox;          // (size,) inbox[dst]
    int *rank_done;            // (size,) rank's function has returned (for groups made later)
    int aborted;
    int error_rank;
    char error[2048];          // the first mt_fatal message of a rank (mt_fatal's buffer size)
};

typedef struct {               // what a rank thread knows about itself
    mt_world *world;
    int rank;
    mt_rank_fn fn;
    void *arg;
} mt__rank_thread;

// set when a rank thread starts: mt_fatal uses it to tell "a rank of a running world" (abort the
// world, end the thread) from "the main program" (print and exit).
static MT_THREAD_LOCAL mt__rank_thread *mt__this_rank = NULL;

mt_world *mt_world_create(int world_size) {
    if (world_size < 1) mt_fatal("world size must be at least 1, got %d", world_size);
    mt_world *w = (mt_world *)mt_calloc(1, sizeof(mt_world), "world");
    w->size = world_size;
    const char *trace = getenv("MT_TRACE");
    w->trace = trace != NULL && trace[0] != '\0' && strcmp(trace, "0") != 0;
    pthread_mutex_init(&w->mu, NULL);
    w->rank_done = (int *)mt_calloc((size_t)world_size, sizeof(int), "world");
    w->inbox = (mt__inbox *)mt_calloc((size_t)world_size, sizeof(mt__inbox), "mailboxes");
    for (int r = 0; r < world_size; r++) {
        mt__inbox *box = &w->inbox[r];
        pthread_mutex_init(&box->mu, NULL);
        pthread_cond_init(&box->cv, NULL);
        box->head = (mt__message **)mt_calloc((size_t)world_size, sizeof(mt__message *), "mailbox");
        box->tail = (mt__message **)mt_calloc((size_t)world_size, sizeof(mt__message *), "mailbox");
        box->src_done = (int *)mt_calloc((size_t)world_size, sizeof(int), "mailbox");
    }
    return w;
}

static mt__group *mt__group_new(const int *members, int size) {
    mt__group *g = (mt__group *)mt_calloc(1, sizeof(mt__group), "group");
    g->size = size;
    g->members = (int *)mt_malloc((size_t)size * sizeof(int), "group members");
    memcpy(g->members, members, (size_t)size * sizeof(int));
    g->joined = (int *)mt_calloc((size_t)size, sizeof(int), "group");
    g->done = (int *)mt_calloc((size_t)size, sizeof(int), "group");
    g->posts = (mt__post *)mt_calloc((size_t)size, sizeof(mt__post), "group");
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    return g;
}

static void mt__group_free(mt__group *g) {
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->members);
    free(g->joined);
    free(g->done);
    free(g->posts);
    free(g);
}

void mt_world_destroy(mt_world *w) {
    if (!w) return;
    for (mt__group *g = w->groups; g;) {
        mt__group *next = g->next;
        mt__group_free(g);
        g = next;
    }
    for (int r = 0; r < w->size; r++) {
        mt__inbox *box = &w->inbox[r];
        for (int src = 0; src < w->size; src++) {   // messages nobody received
            for (mt__message *m = box->head[src]; m;) {
                mt__message *next = m->next;
                free(m);
                m = next;
            }
        }
        free(box->head);
        free(box->tail);
        free(box->src_done);
        pthread_mutex_destroy(&box->mu);
        pthread_cond_destroy(&box->cv);
    }
    free(w->inbox);
    free(w->rank_done);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

int mt_world_size(const mt_world *w) { return w->size; }

const char *mt_world_error(mt_world *w) {
    pthread_mutex_lock(&w->mu);
    int aborted = w->aborted;
    pthread_mutex_unlock(&w->mu);
    return aborted ? w->error : NULL;   // error is written once, before aborted is set
}

int mt_thread_rank(void) { return mt__this_rank ? mt__this_rank->rank : -1; }

// ---------------------------------------------------------------------------------------------
// abort: how one rank's mt_fatal stops every rank instead of hanging them
// ---------------------------------------------------------------------------------------------
// If rank 2 fails while ranks 0, 1, 3 wait in an all-reduce with it, they would wait forever;
// and exit() from rank 2 would tear the process down under ranks that are still writing files
// or printing. So mt_fatal calls this first. In a rank thread of a multi-rank world it:
//   1. records the message in the world (the first error wins: when all ranks hit the same bad
//      file, the user sees one line, not one per rank),
//   2. sets `aborted` in the world, in every group and in every mailbox, each under that
//      object's own mutex, and broadcasts its condition variable: every waiting rank wakes up,
//      sees the flag and ends its thread with pthread_exit (setting the flag under the same
//      mutex the waiter holds while it checks the flag is what guarantees no wake-up is lost),
//   3. ends the calling thread.
// mt_world_run joins all threads, prints "error: <message>" and returns 1.
// Lock order is always world->mu, then a group's or a mailbox's mu; code that holds a group or
// mailbox mutex never calls mt_fatal (it unlocks first), or this function would deadlock.
static void mt__rank_exit(void) { pthread_exit(NULL); }

void mt__abort_world_from_rank(const char *msg) {
    mt__rank_thread *self = mt__this_rank;
    if (!self || self->world->size <= 1) return;   // main program or one rank: mt_fatal exits
    mt_world *w = self->world;
    pthread_mutex_lock(&w->mu);
    if (!w->aborted) {
        snprintf(w->error, sizeof w->error, "%s", msg);
        w->error_rank = self->rank;
        w->aborted = 1;
        for (mt__group *g = w->groups; g; g = g->next) {
            pthread_mutex_lock(&g->mu);
            g->aborted = 1;
            pthread_cond_broadcast(&g->cv);
            pthread_mutex_unlock(&g->mu);
        }
        for (int r = 0; r < w->size; r++) {
            pthread_mutex_lock(&w->inbox[r].mu);
            w->inbox[r].aborted = 1;
            pthread_cond_broadcast(&w->inbox[r].cv);
            pthread_mutex_unlock(&w->inbox[r].mu);
        }
    }
    pthread_mutex_unlock(&w->mu);
    mt__rank_exit();
}

// The other way a rank can wait forever: a partner whose rank function already returned. When
// a rank function returns we mark the rank done in the world, in its groups and in every mailbox
// (under their mutexes, with a broadcast), so a rank that waits for it reports the bug instead of
// hanging. (A group made later copies the world's marks when it is created.)
static void mt__mark_rank_done(mt_world *w, int rank) {
    pthread_mutex_lock(&w->mu);
    w->rank_done[rank] = 1;
    for (mt__group *g = w->groups; g; g = g->next) {
        for (int i = 0; i < g->size; i++) {
            if (g->members[i] != rank) continue;
            pthread_mutex_lock(&g->mu);
            g->done[i] = 1;
            g->n_done++;
            pthread_cond_broadcast(&g->cv);
            pthread_mutex_unlock(&g->mu);
        }
    }
    for (int r = 0; r < w->size; r++) {
        pthread_mutex_lock(&w->inbox[r].mu);
        w->inbox[r].src_done[rank] = 1;
        pthread_cond_broadcast(&w->inbox[r].cv);
        pthread_mutex_unlock(&w->inbox[r].mu);
    }
    pthread_mutex_unlock(&w->mu);
}

// ---------------------------------------------------------------------------------------------
// launcher: one thread per rank (what torchrun does with processes)
// ---------------------------------------------------------------------------------------------
void mt_thread_set_name(const char *name) {
    char short_name[16];   // Linux keeps 15 characters and the terminating zero
    size_t len = strlen(name);
    if (len > sizeof short_name - 1) len = sizeof short_name - 1;
    memcpy(short_name, name, len);
    short_name[len] = '\0';
#if defined(__APPLE__)
    pthread_setname_np(short_name);
#elif defined(__linux__)
    pthread_setname_np(pthread_self(), short_name);
#else
    (void)short_name;
#endif
}

static void *mt__rank_thread_main(void *p) {
    mt__rank_thread *self = (mt__rank_thread *)p;
    char name[16];
    snprintf(name, sizeof name, "r%d", self->rank);
    mt_thread_set_name(name);   // gdb's `info threads` lists r0, r1, ...
    mt__this_rank = self;
    self->fn(self->world, self->rank, self->arg);
    mt__this_rank = NULL;
    mt__mark_rank_done(self->world, self->rank);
    return NULL;
}

int mt_world_run(mt_world *w, mt_rank_fn fn, void *arg) {
    if (!w->aborted) {
        // a world may run several times (no threads run now, so no locks are needed here)
        for (mt__group *g = w->groups; g; g = g->next) {
            memset(g->done, 0, (size_t)g->size * sizeof(int));
            g->n_done = 0;
        }
        memset(w->rank_done, 0, (size_t)w->size * sizeof(int));
        for (int r = 0; r < w->size; r++) memset(w->inbox[r].src_done, 0, (size_t)w->size * sizeof(int));
        mt__rank_thread *ranks = (mt__rank_thread *)mt_calloc((size_t)w->size, sizeof(mt__rank_thread), "rank threads");
        pthread_t *threads = (pthread_t *)mt_calloc((size_t)w->size, sizeof(pthread_t), "rank threads");
        for (int r = 0; r < w->size; r++) {
            ranks[r].world = w;
            ranks[r].rank = r;
            ranks[r].fn = fn;
            ranks[r].arg = arg;
            int err = pthread_create(&threads[r], NULL, mt__rank_thread_main, &ranks[r]);
            if (err != 0)
                mt_fatal("cannot start the thread of rank %d: %s\nhint: lower --nproc-per-node or raise the thread limit (ulimit -u)", r, strerror(err));
        }
        for (int r = 0; r < w->size; r++) pthread_join(threads[r], NULL);
        free(threads);
        free(ranks);
    }
    const char *error = mt_world_error(w);
    if (!error) return 0;
    fflush(stdout);
    fprintf(stderr, "error: %s\n", error);   // exactly as mt_fatal prints it
    return 1;
}

// ---------------------------------------------------------------------------------------------
// groups: mt_comm_init and the registry
// ---------------------------------------------------------------------------------------------
// NCCL's rule holds here too: each mt_comm_init call makes a new communicator, and the k-th call
// with a given member list on one rank pairs with the k-th call with that list on every other
// member. A world of 2 with DP 2 has "world" = {0,1} and "dp" = {0,1}: two calls, two groups,
// so a collective on one can never be mistaken for a collective on the other.
void mt_comm_init(mt_comm *c, mt_world *w, int my_global_rank, const int *members, int size) {
    if (size < 1 || size > w->size)
        mt_fatal("a group of %d ranks does not fit in a world of %d ranks", size, w->size);
    int me = -1;
    for (int i = 0; i < size; i++) {
        if (members[i] < 0 || members[i] >= w->size)
            mt_fatal("group member %d is rank %d, outside the world of %d ranks", i, members[i], w->size);
        for (int j = 0; j < i; j++)
            if (members[j] == members[i]) mt_fatal("rank %d appears twice in a group", members[i]);
        if (members[i] == my_global_rank) me = i;
    }
    if (me < 0) mt_fatal("rank %d initializes a group it is not a member of\nhint: pass the members list that contains the calling rank", my_global_rank);

    // allocate before locking: mt_malloc may call mt_fatal, which takes world->mu itself
    mt__group *fresh = mt__group_new(members, size);
    pthread_mutex_lock(&w->mu);
    mt__group *g = NULL, **link = &w->groups;
    for (; *link; link = &(*link)->next) {
        mt__group *h = *link;
        if (h->size == size && !h->joined[me] && memcmp(h->members, members, (size_t)size * sizeof(int)) == 0) {
            g = h;
            break;
        }
    }
    if (!g) {   // first member to arrive: publish the new group at the end of the registry
        g = fresh;
        fresh = NULL;
        g->aborted = w->aborted;
        for (int i = 0; i < size; i++) {
            g->done[i] = w->rank_done[members[i]];
            g->n_done += g->done[i];
        }
        *link = g;
    }
    g->joined[me] = 1;
    pthread_mutex_unlock(&w->mu);
    if (fresh) mt__group_free(fresh);

    c->world = w;
    c->size = size;
    c->rank = me;
    c->global_rank = my_global_rank;
    c->members = g->members;
    c->name = "group";
    c->group = g;
}

// MT_TRACE=1: "[r3] all_reduce tp n=4096", one fputs per line so ranks' lines never interleave
static void mt__trace(const mt_comm *c, const char *fmt, ...) {
    if (!c->world->trace) return;
    char line[256];
    int len = snprintf(line, sizeof line, "[r%d] ", c->global_rank);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + len, sizeof line - (size_t)len - 1, fmt, ap);
    va_end(ap);
    strcat(line, "\n");
    fputs(line, stderr);
}

// ---------------------------------------------------------------------------------------------
// the barrier: mutex + condition variable + generation counter
// ---------------------------------------------------------------------------------------------
static void mt__describe_post(const mt__post *p, char *out, size_t cap) {
    if (p->kind == MT__COLL_BARRIER) snprintf(out, cap, "barrier()");
    else if (p->kind == MT__COLL_BROADCAST) snprintf(out, cap, "broadcast(n=%zu, root %d)", p->n, p->arg);
    else if (p->kind == MT__COLL_ALL_GATHER) snprintf(out, cap, "all_gather(n=%zu)", p->n);
    else snprintf(out, cap, "%s(n=%zu, %s)", mt__coll_names[p->kind], p->n, p->arg == MT_SUM ? "sum" : "max");
}

// The member that opens sync 1 compares every post with group rank 0's, before anyone touches
// a buffer, and leaves the verdict in the group; every member reads it under the mutex as it
// leaves (it stays valid: the next barrier cannot open before this member arrives there). On a
// mismatch all members stop with the same message and none writes a buffer. (Real NCCL would
// hang or corrupt memory; here the student is told which calls disagree.)
static void mt__check_posts_locked(mt__group *g, const mt_comm *c) {
    const mt__post *p0 = &g->posts[0];
    g->mismatch = 0;
    for (int j = 1; j < g->size; j++) {
        const mt__post *p = &g->posts[j];
        if (p->kind == p0->kind && p->n == p0->n && p->arg == p0->arg) continue;
        char mine[96], theirs[96];
        mt__describe_post(p, mine, sizeof mine);
        mt__describe_post(p0, theirs, sizeof theirs);
        snprintf(g->mismatch_msg, sizeof g->mismatch_msg,
                 "group %s: rank %d called %s while rank %d called %s\n"
                 "hint: every member of a group must call the same collectives, with the same counts, in the same order (NCCL's rule)",
                 c->name, g->members[j], mine, g->members[0], theirs);
        g->mismatch = 1;
        return;
    }
}

// The last member to arrive opens the barrier: it resets `arrived` and bumps `generation`, then
// wakes everyone. A waiter does not wait for "arrived == size" (the last one already reset it to
// 0, and a fast member may already be arriving at the next barrier): it waits until the
// generation it arrived in is over. pthread_cond_wait can wake up spuriously, hence the loop.
//
// Every collective is this barrier twice, around a data phase:
//   sync 1 (abortable=1)  post my call and buffers in g->posts[rank], wait for all members.
//                         Now every input is ready and every output may be written.
//                         (mt_barrier is sync 1 alone: it has no data phase.)
//   data phase            each rank reads other ranks' buffers (one process: shared memory)
//                         and writes only its own disjoint part, so no lock is needed.
//   sync 2 (abortable=0)  wait again: nobody returns, reuses or frees its buffers while another
//                         rank may still be reading or writing them.
// Sync 1 is all or nothing: a waiter that leaves on abort first takes itself out (arrived--),
// and a rank that arrives after the abort leaves at once, so once a group is aborted its barrier
// can never open. Everyone who passed sync 1 is in the data phase, which never blocks, so sync 2
// always opens; it must not be left on abort, or a rank could end (and the launcher free its
// stack) while a partner still writes into its buffers.
static void mt__group_sync(const mt_comm *c, const mt__post *post, int abortable) {
    mt__group *g = (mt__group *)c->group;
    pthread_mutex_lock(&g->mu);
    if (abortable && g->aborted) {
        pthread_mutex_unlock(&g->mu);
        mt__rank_exit();
    }
    if (post) g->posts[c->rank] = *post;
    unsigned long my_generation = g->generation;
    if (++g->arrived == g->size) {   // last to arrive: check the posts, open the barrier
        if (post) mt__check_posts_locked(g, c);
        g->arrived = 0;
        g->generation++;
        pthread_cond_broadcast(&g->cv);
    }
    while (g->generation == my_generation) {
        if (abortable && g->aborted) {
            g->arrived--;
            pthread_mutex_unlock(&g->mu);
            mt__rank_exit();
        }
        if (abortable && g->n_done > 0) {   // a member returned: it will never come
            int gone = 0;
            while (!g->done[gone]) gone++;
            g->arrived--;
            pthread_mutex_unlock(&g->mu);
            mt_fatal("rank %d waits in %s on group %s for rank %d, whose rank function has already returned\n"
                     "hint: every member of a group must make the same collective calls in the same order",
                     c->global_rank, post ? mt__coll_names[post->kind] : "barrier", c->name, g->members[gone]);
        }
        pthread_cond_wait(&g->cv, &g->mu);
    }
    if (post && g->mismatch) {   // copy the message out: mt_fatal must not run under the mutex
        char msg[sizeof g->mismatch_msg];
        memcpy(msg, g->mismatch_msg, sizeof msg);
        pthread_mutex_unlock(&g->mu);
        mt_fatal("%s", msg);
    }
    pthread_mutex_unlock(&g->mu);
}

static void mt__post_set(mt__post *p, int kind, int arg, size_t n, const void *send, void *recv) {
    p->kind = kind;
    p->arg = arg;
    p->n = n;
    p->send = send;
    p->recv = recv;
}

void mt_barrier(mt_comm *c) {
    mt__trace(c, "barrier %s", c->name);
    if (c->size == 1) return;
    mt__post p;
    mt__post_set(&p, MT__COLL_BARRIER, 0, 0, NULL, NULL);
    mt__group_sync(c, &p, 1);
}

// ---------------------------------------------------------------------------------------------
// all-reduce: each rank reduces one slice for everybody, in fixed rank order
// ---------------------------------------------------------------------------------------------
// 3 ranks, the buffer cut into 3 slices; rank r computes slice r of the result and writes it
// into all 3 buffers:
//
//              slice 0           slice 1           slice 2
//   buf r0   a0 a1 a2 a3       a4 a5 a6 a7       a8 a9
//   buf r1   b0 b1 b2 b3       b4 b5 b6 b7       b8 b9
//   buf r2   c0 c1 c2 c3       c4 c5 c6 c7       c8 c9
//            rank 0 computes   rank 1 computes   rank 2 computes
//            s0 = (a0+b0)+c0   s4 = (a4+b4)+c4   ...  and writes s_i into buf r0, r1 and r2
//
// Why the results are deterministic: float addition is not associative ((a+b)+c and a+(b+c)
// can differ in the last bit), so the order of the adds must not depend on timing or on which
// thread does the work. Here element i is always (((x_0 + x_1) + x_2) + ...) in rank order, it is
// computed once and copied, so every rank holds the same bits, in every run; and the slicing only
// decides WHICH thread computes an element, never HOW. (NCCL's ring adds in an order that depends
// on the element's chunk, which is why GPU and CPU results can differ in the last bits.)
// Cost: each rank reads size slices of n/size and writes size of them: O(size * n) in all, in
// parallel. Slices are whole multiples of 64 bytes so that two ranks never write one cache line.
#define MT__BLOCK 1024   // elements reduced at a time in a small stack buffer (stays in L1)

static void mt__slice(size_t n, int parts, int i, size_t align, size_t *lo, size_t *hi) {
    size_t per = (n + (size_t)parts - 1) / (size_t)parts;
    per = (per + align - 1) / align * align;
    size_t start = per * (size_t)i;
    *lo = start < n ? start : n;
    *hi = n - *lo < per ? n : *lo + per;
}

// MT_MAX lets NaN through (like torch.max), so a found-nan flag survives the reduction
static float mt__max_f32(float a, float b) { return (b > a || isnan(b)) ? b : a; }
static double mt__max_f64(double a, double b) { return (b > a || isnan(b)) ? b : a; }

// acc[0..m) = acc op x, elementwise
static void mt__accumulate_f32(float *acc, const float *x, size_t m, int op) {
    if (op == MT_SUM) for (size_t i = 0; i < m; i++) acc[i] += x[i];
    else              for (size_t i = 0; i < m; i++) acc[i] = mt__max_f32(acc[i], x[i]);
}
static void mt__accumulate_f64(double *acc, const double *x, size_t m, int op) {
    if (op == MT_SUM) for (size_t i = 0; i < m; i++) acc[i] += x[i];
    else              for (size_t i = 0; i < m; i++) acc[i] = mt__max_f64(acc[i], x[i]);
}

static void mt__check_op(const mt_comm *c, const char *what, mt_reduce_op op) {
    if (op != MT_SUM && op != MT_MAX) mt_fatal("%s on group %s: unknown reduce op %d", what, c->name, (int)op);
}

void mt_all_reduce(mt_comm *c, float *buf, size_t n, mt_reduce_op op) {
    mt__trace(c, "all_reduce %s n=%zu", c->name, n);
    mt__check_op(c, "all_reduce", op);
    if (c->size == 1) return;
    mt__post p;
    mt__post_set(&p, MT__COLL_ALL_REDUCE, (int)op, n, buf, buf);
    mt__group_sync(c, &p, 1);
    const mt__post *posts = ((const mt__group *)c->group)->posts;
    size_t lo, hi;
    mt__slice(n, c->size, c->rank, 64 / sizeof(float), &lo, &hi);
    float acc[MT__BLOCK];
    for (size_t b = lo; b < hi; b += MT__BLOCK) {
        size_t m = hi - b < MT__BLOCK ? hi - b : MT__BLOCK;
        memcpy(acc, (const float *)posts[0].send + b, m * sizeof(float));
        for (int j = 1; j < c->size; j++) mt__accumulate_f32(acc, (const float *)posts[j].send + b, m, (int)op);
        for (int j = 0; j < c->size; j++) memcpy((float *)posts[j].recv + b, acc, m * sizeof(float));
    }
    mt__group_sync(c, NULL, 0);
}

// the same in double: global gradient norms and loss sums, where float would lose digits
void mt_all_reduce_double(mt_comm *c, double *buf, size_t n, mt_reduce_op op) {
    mt__trace(c, "all_reduce_double %s n=%zu", c->name, n);
    mt__check_op(c, "all_reduce_double", op);
    if (c->size == 1) return;
    mt__post p;
    mt__post_set(&p, MT__COLL_ALL_REDUCE_DOUBLE, (int)op, n, buf, buf);
    mt__group_sync(c, &p, 1);
    const mt__post *posts = ((const mt__group *)c->group)->posts;
    size_t lo, hi;
    mt__slice(n, c->size, c->rank, 64 / sizeof(double), &lo, &hi);
    double acc[MT__BLOCK];
    for (size_t b = lo; b < hi; b += MT__BLOCK) {
        size_t m = hi - b < MT__BLOCK ? hi - b : MT__BLOCK;
        memcpy(acc, (const double *)posts[0].send + b, m * sizeof(double));
        for (int j = 1; j < c->size; j++) mt__accumulate_f64(acc, (const double *)posts[j].send + b, m, (int)op);
        for (int j = 0; j < c->size; j++) memcpy((double *)posts[j].recv + b, acc, m * sizeof(double));
    }
    mt__group_sync(c, NULL, 0);
}

// ---------------------------------------------------------------------------------------------
// reduce-scatter and all-gather: the two halves of an all-reduce (distributed optimizer, SP)
// ---------------------------------------------------------------------------------------------
// reduce-scatter: send is (size * n) on every rank; rank r gets chunk r reduced over the ranks:
//   recv_r[i] = send_0[r*n + i] + send_1[r*n + i] + ...   (rank order, as in all-reduce)
// Rank r is the only one that reads chunk r of any send buffer, so recv may alias it
// (recv = send + r*n, "in place"). all_gather(reduce_scatter(x)) == all_reduce(x), bit for bit.
void mt_reduce_scatter(mt_comm *c, const float *send, float *recv, size_t n_per_rank, mt_reduce_op op) {
    mt__trace(c, "reduce_scatter %s n=%zu", c->name, n_per_rank);
    mt__check_op(c, "reduce_scatter", op);
    if (c->size == 1) {
        if (n_per_rank > 0 && recv != send) memmove(recv, send, n_per_rank * sizeof(float));
        return;
    }
    mt__post p;
    mt__post_set(&p, MT__COLL_REDUCE_SCATTER, (int)op, n_per_rank, send, recv);
    mt__group_sync(c, &p, 1);
    const mt__post *posts = ((const mt__group *)c->group)->posts;
    size_t offset = (size_t)c->rank * n_per_rank;
    float acc[MT__BLOCK];
    for (size_t b = 0; b < n_per_rank; b += MT__BLOCK) {
        size_t m = n_per_rank - b < MT__BLOCK ? n_per_rank - b : MT__BLOCK;
        memcpy(acc, (const float *)posts[0].send + offset + b, m * sizeof(float));
        for (int j = 1; j < c->size; j++) mt__accumulate_f32(acc, (const float *)posts[j].send + offset + b, m, (int)op);
        memcpy(recv + b, acc, m * sizeof(float));   // after all reads of this block: in place is safe
    }
    mt__group_sync(c, NULL, 0);
}

// all-gather: recv = [send_0 | send_1 | ... ], each (n_per_rank); every rank copies all chunks
// into its own recv (it writes only its own memory). send may be recv + rank*n ("in place").
void mt_all_gather(mt_comm *c, const float *send, float *recv, size_t n_per_rank) {
    mt__trace(c, "all_gather %s n=%zu", c->name, n_per_rank);
    size_t bytes = n_per_rank * sizeof(float);
    if (c->size == 1) {
        if (bytes > 0 && recv != send) memmove(recv, send, bytes);
        return;
    }
    mt__post p;
    mt__post_set(&p, MT__COLL_ALL_GATHER, 0, n_per_rank, send, recv);
    mt__group_sync(c, &p, 1);
    const mt__post *posts = ((const mt__group *)c->group)->posts;
    for (int j = 0; j < c->size; j++) {
        float *dst = recv + (size_t)j * n_per_rank;
        if (bytes > 0 && dst != posts[j].send) memcpy(dst, posts[j].send, bytes);
    }
    mt__group_sync(c, NULL, 0);
}

// broadcast: every rank's buf becomes root's buf (root is a group rank)
void mt_broadcast(mt_comm *c, float *buf, size_t n, int root) {
    mt__trace(c, "broadcast %s n=%zu root %d", c->name, n, root);
    if (root < 0 || root >= c->size) mt_fatal("broadcast on group %s: root %d is not a group rank (size %d)", c->name, root, c->size);
    if (c->size == 1) return;
    mt__post p;
    mt__post_set(&p, MT__COLL_BROADCAST, root, n, buf, buf);
    mt__group_sync(c, &p, 1);
    const mt__post *posts = ((const mt__group *)c->group)->posts;
    if (c->rank != root && n > 0) memcpy(buf, posts[root].send, n * sizeof(float));
    mt__group_sync(c, NULL, 0);
}

// ---------------------------------------------------------------------------------------------
// send / recv: buffered point-to-point (pipeline activations and their gradients)
// ---------------------------------------------------------------------------------------------
// Every rank has one mailbox holding a FIFO list per source rank. mt_send copies the data into
// a fresh heap message, appends it to the destination's list for this source and returns: it
// never waits for the receiver. That is what lets a pipeline stage send its activation forward
// and go on with the next micro-batch; with a blocking send, two neighbours that both send
// before they receive (1F1B's steady state does exactly that) would wait for each other forever.
// mt_recv takes the OLDEST message from that source with the right tag (FIFO among equal tags,
// any order across tags), sleeping on the mailbox's condition variable until it arrives.
void mt_send(mt_comm *c, const float *buf, size_t n, int peer, int tag) {
    if (peer < 0 || peer >= c->size) mt_fatal("send on group %s: peer %d is not a group rank (size %d)", c->name, peer, c->size);
    int dst = c->members[peer];
    mt__trace(c, "send -> r%d tag %d n=%zu", dst, tag, n);
    if (n > ((size_t)-1 - sizeof(mt__message)) / sizeof(float)) mt_fatal("send of %zu floats is too large", n);
    mt__message *m = (mt__message *)mt_malloc(sizeof(mt__message) + n * sizeof(float), "send buffer");
    m->next = NULL;
    m->tag = tag;
    m->n = n;
    m->data = (float *)(m + 1);   // sizeof(mt__message) is a multiple of 8: floats are aligned
    if (n > 0) memcpy(m->data, buf, n * sizeof(float));
    mt__inbox *box = &c->world->inbox[dst];
    pthread_mutex_lock(&box->mu);
    int src = c->global_rank;
    if (box->tail[src]) box->tail[src]->next = m;
    else box->head[src] = m;
    box->tail[src] = m;
    pthread_cond_broadcast(&box->cv);   // only the owner waits on it
    pthread_mutex_unlock(&box->mu);
}

void mt_recv(mt_comm *c, float *buf, size_t n, int peer, int tag) {
    if (peer < 0 || peer >= c->size) mt_fatal("recv on group %s: peer %d is not a group rank (size %d)", c->name, peer, c->size);
    int src = c->members[peer], dst = c->global_rank;
    mt__trace(c, "recv <- r%d tag %d n=%zu", src, tag, n);
    mt__inbox *box = &c->world->inbox[dst];
    mt__message *m = NULL;
    pthread_mutex_lock(&box->mu);
    for (;;) {
        mt__message *prev = NULL;   // find the oldest message from src with this tag, unlink it
        for (m = box->head[src]; m && m->tag != tag; m = m->next) prev = m;
        if (m) {
            if (prev) prev->next = m->next;
            else box->head[src] = m->next;
            if (box->tail[src] == m) box->tail[src] = prev;
            break;
        }
        if (box->aborted) {
            pthread_mutex_unlock(&box->mu);
            mt__rank_exit();
        }
        if (box->src_done[src] || src == dst) {   // nobody can send it any more: report, don't hang
            pthread_mutex_unlock(&box->mu);
            mt_fatal("rank %d waits for a message from rank %d (tag %d, n=%zu) that can never arrive: %s\n"
                     "hint: every recv needs a matching send with the same tag",
                     dst, src, tag, n, src == dst ? "it would have to send it to itself" : "its rank function has returned");
        }
        pthread_cond_wait(&box->cv, &box->mu);
    }
    pthread_mutex_unlock(&box->mu);
    if (m->n != n) {
        size_t sent = m->n;
        free(m);
        mt_fatal("rank %d received %zu floats from rank %d (tag %d) but expected %zu\n"
                 "hint: the send and the recv of a message must use the same count",
                 dst, sent, src, tag, n);
    }
    if (n > 0) memcpy(buf, m->data, n * sizeof(float));
    free(m);
}
