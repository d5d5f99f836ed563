// ---------------------------------------------------------------------------------------------
// COMMUNICATORS: NCCL's shape. One mt_comm per (rank, group); every member of a group calls the
// same collectives in the same order. CPU build: every rank is a thread of this process.
// ---------------------------------------------------------------------------------------------
typedef enum { MT_SUM = 0, MT_MAX = 1 } mt_reduce_op;   // MT_MAX propagates NaN (like torch.max)

typedef struct mt_world mt_world;   // everything the rank threads of one process share

typedef struct mt_comm {           // a group communicator; NCCL's ncclComm_t
    mt_world *world;
    int size;                      // ranks in the group
    int rank;                      // my index in the group, 0..size-1
    int global_rank;               // my rank in the world
    const int *members;            // (size,) global ranks of the group, in group-rank order
                                   // (owned by the shared group state, lives as long as the world)
    const char *name;              // "tp", "dp", "pp", "world", "embd": for MT_TRACE and messages;
                                   // mt_comm_init sets "group", the caller overwrites
    void *group;                   // private: the group's shared state (mt__group)
} mt_comm;

/* world_size rank threads; MT_TRACE=1 in the environment (read here) traces every call */
mt_world *mt_world_create(int world_size);
void mt_world_destroy(mt_world *w);     /* after mt_world_run returned; frees groups and mailboxes */
int mt_world_size(const mt_world *w);
/* the message of the mt_fatal that aborted the world, or NULL if it was not aborted */
const char *mt_world_error(mt_world *w);

/* every member calls it with the same members list (global ranks, in group-rank order).
 * Like ncclCommInitRank, each call makes a new communicator: the k-th init of a member list
 * on one rank pairs with the k-th init of the same list on the others, so "world" and "dp"
 * with equal members are still two independent groups. */
void mt_comm_init(mt_comm *c, mt_world *w, int my_global_rank, const int *members, int size);

/* collectives: blocking, deterministic (bit-identical on every rank, every run; see §2) */
void mt_all_reduce(mt_comm *c, float *buf, size_t n, mt_reduce_op op);            /* in place */
void mt_all_reduce_double(mt_comm *c, double *buf, size_t n, mt_reduce_op op);    /* norms, loss sums */
/* recv (size*n_per_rank) = [rank 0's n | rank 1's n | ...]; send may be recv + rank*n_per_rank */
void mt_all_gather(mt_comm *c, const float *send, float *recv, size_t n_per_rank);
/* send (size*n_per_rank); rank r gets the reduced r-th chunk; recv may be send + rank*n_per_rank */
void mt_reduce_scatter(mt_comm *c, const float *send, float *recv, size_t n_per_rank, mt_reduce_op op);
void mt_broadcast(mt_comm *c, float *buf, size_t n, int root);                    /* root: group rank */
void mt_barrier(mt_comm *c);

/* point-to-point; peer is a GROUP rank. send is buffered: it copies and returns at once.
 * recv blocks until a message from peer with this tag arrives (FIFO among equal tags);
 * its count must equal n (else mt_fatal naming both). */
void mt_send(mt_comm *c, const float *buf, size_t n, int peer, int tag);
void mt_recv(mt_comm *c, float *buf, size_t n, int peer, int tag);

/* launcher: runs fn(w, rank, arg) on world_size threads named "r<rank>", joins them. Returns 0,
 * or 1 if a rank called mt_fatal (the world was aborted): then it has printed
 * "error: <message>" once, as mt_fatal would, and the caller should exit(1). */
typedef void (*mt_rank_fn)(mt_world *w, int global_rank, void *arg);
int mt_world_run(mt_world *w, mt_rank_fn fn, void *arg);
int mt_thread_rank(void);                 /* global rank of the calling rank thread, -1 elsewhere */
void mt_thread_set_name(const char *name);/* names the calling thread (debuggers), max 15 chars */
