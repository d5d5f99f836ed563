/* tests/test_launch.c - §2 LAUNCH and the TCP channel: beyond one process.
 *
 *   make tests/test_launch && ./tests/test_launch
 *
 * Slurm's host lists; what each launcher's variables (torchrun-style, Slurm, Open MPI, none)
 * make of a process; then real jobs of several processes on loopback, each a fork() of this
 * test: the rendezvous (every process gets the same ids, the collectives across processes give
 * the same bits as one process would), and its failures, each a one-line error that names the
 * cause: a peer that never comes (within --dist-timeout), a wrong world size, a TP group across
 * nodes, a collective that differs between processes, a process that fails or dies mid-job.
 * Ports: process 0 listens on a port found free just before (bound on port 0, then released),
 * so parallel runs of the suite do not collide. main sets alarm(300): a hang fails the test.
 */
#define MEGATRON_IMPLEMENTATION
#include "../megatron.h"
#include "harness.h"
#include <sys/wait.h>

// ---------------------------------------------------------------------------------------------
// host lists
// ---------------------------------------------------------------------------------------------
static void expect_hosts(const char *list, const char *want) {   // want: the hosts, space-separated
    char got[4096] = "", host[256];
    const char *err = NULL;
    int n = mt_hostlist_get(list, 0, host, sizeof host, &err);
    mt_expect(n >= 1, "%s: %s", list, err ? err : "no hosts");
    for (int i = 0; i < n && i < 64; i++) {
        mt_hostlist_get(list, i, host, sizeof host, &err);
        if (i) strcat(got, " ");
        strcat(got, host);
    }
    mt_expect(strcmp(got, want) == 0, "%s -> \"%s\", want \"%s\"", list, got, want);
}

static void expect_bad_list(const char *list) {
    char host[256];
    const char *err = NULL;
    int n = mt_hostlist_get(list, 0, host, sizeof host, &err);
    mt_expect(n == -1 && err && *err, "\"%s\" should be malformed, got %d hosts", list, n);
}

MT_TEST(hostlist) {
    expect_hosts("node1", "node1");
    expect_hosts("node[01-04,07]", "node01 node02 node03 node04 node07");
    expect_hosts("node[1-3]", "node1 node2 node3");
    expect_hosts("a,b,c", "a b c");
    expect_hosts("gpu[9-11],login", "gpu9 gpu10 gpu11 login");     // the width of the lower bound, as Slurm
    expect_hosts("prefix-a[1-2]-b", "prefix-a1-b prefix-a2-b");
    expect_hosts("a[1-2]-b[3-4]", "a1-b3 a1-b4 a2-b3 a2-b4");        // the leftmost varies slowest
    expect_hosts("x[001-003],y[7]", "x001 x002 x003 y7");
    expect_hosts("n[0-1],m[10-11,20]", "n0 n1 m10 m11 m20");
    expect_hosts("rack1-[2-3]", "rack1-2 rack1-3");
    expect_hosts("10.0.0.[1-2]", "10.0.0.1 10.0.0.2");
    char host[64];
    mt_expect(mt_hostlist_get("node[0-999]", 500, host, sizeof host, NULL) == 1000 && strcmp(host, "node500") == 0,
              "node[0-999] #500 is %s", host);
    mt_expect(mt_hostlist_get("a[1-3]", 7, host, sizeof host, NULL) == 3, "an index past the end: only the count");
    const char *bad[] = {"", "node[", "node]", "node[1-", "node[3-1]", "node[]", "node[1,]", "node[a-b]",
                         "node[1-2", "a,,b", "a,", ",a", "node[[1]]", "no de", "n[0-99999999][0-99999999]",
                         "x[1-2-3]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) expect_bad_list(bad[i]);
    mt_expect(mt_hostlist_get(NULL, 0, host, sizeof host, NULL) == -1, "NULL is malformed");
}

// ---------------------------------------------------------------------------------------------
// running something in a child process, with its stderr and stdout captured
// ---------------------------------------------------------------------------------------------
typedef struct {
    int status;       // exit code (128 + signal if killed)
    char out[8192];   // stdout and stderr together
} child_result;

typedef void (*child_fn)(void *arg);

static pid_t child_start(child_fn fn, void *arg, const char *path) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
        fn(arg);
        fflush(stdout);
        fflush(stderr);
        _exit(0);
    }
    return pid;
}

static void child_finish(pid_t pid, const char *path, child_result *r) {
    int st = 0;
    waitpid(pid, &st, 0);
    r->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(r->out, 1, sizeof r->out - 1, f) : 0;
    r->out[n] = '\0';
    if (f) fclose(f);
    unlink(path);
}

static void clear_launch_env(void) {
    const char *names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                           "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS",
                           "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_NODELIST",
                           "SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_ID", "SLURM_TASKS_PER_NODE",
                           "SLURM_STEP_TASKS_PER_NODE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                           "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unsetenv(names[i]);
}

// "NAME=value NAME=value" -> the environment
static void set_env(const char *assignments) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", assignments);
    for (char *tok = strtok(buf, " "); tok; tok = strtok(NULL, " ")) {
        char *eq = strchr(tok, '=');
        *eq = '\0';
        setenv(tok, eq + 1, 1);
    }
}

// ---------------------------------------------------------------------------------------------
// what each launcher's variables say
// ---------------------------------------------------------------------------------------------
static mt_launch detect(const char *env, int nproc_per_node, int tp) {
    clear_launch_env();
    set_env(env);
    mt_config cfg;
    mt_config_defaults(&cfg);
    cfg.parallel.nproc_per_node = nproc_per_node;
    cfg.parallel.tensor_model_parallel_size = tp;
    mt_launch l;
    mt_launch_detect(&l, &cfg);
    mt_expect(cfg.parallel.num_processes == l.nprocs, "num_processes %d, launch %d", cfg.parallel.num_processes,
              l.nprocs);
    clear_launch_env();
    return l;
}

MT_TEST(detect_launchers) {
    mt_launch l = detect("", 0, 1);
    mt_expect(l.kind == MT_LAUNCH_THREADS && l.nprocs == 1, "no variables: one process");

    l = detect("RANK=3 WORLD_SIZE=8 LOCAL_RANK=3 LOCAL_WORLD_SIZE=4 GROUP_RANK=0 MASTER_ADDR=10.1.2.3 MASTER_PORT=29500",
               0, 1);
    mt_expect(l.kind == MT_LAUNCH_TORCHRUN && l.nprocs == 8 && l.proc == 3 && l.local_proc == 3 &&
              l.local_nprocs == 4 && l.node == 0 && l.ranks_per_proc == 1 && l.first_rank == 3,
              "torchrun: kind %d nprocs %d proc %d local %d/%d node %d", l.kind, l.nprocs, l.proc, l.local_proc,
              l.local_nprocs, l.node);
    mt_expect(strcmp(l.master_addr, "10.1.2.3") == 0 && l.master_port == 29500, "torchrun master %s:%d",
              l.master_addr, l.master_port);

    // Slurm, one process per node with 8 rank threads each: process 1's ranks are 8..15
    l = detect("SLURM_JOB_ID=4242 SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_STEP_ID=0 SLURM_LOCALID=0 SLURM_NODEID=1 "
               "SLURM_TASKS_PER_NODE=1(x2) SLURM_JOB_NODELIST=gpu[07-08]", 8, 8);
    mt_expect(l.kind == MT_LAUNCH_SLURM && l.nprocs == 2 && l.proc == 1 && l.node == 1 && l.ranks_per_proc == 8 &&
              l.first_rank == 8 && l.local_nprocs == 1, "slurm: kind %d nprocs %d proc %d node %d rpp %d first %d "
              "local %d", l.kind, l.nprocs, l.proc, l.node, l.ranks_per_proc, l.first_rank, l.local_nprocs);
    mt_expect(strcmp(l.master_addr, "gpu07") == 0 && l.master_port == 20000 + 4242,
              "slurm master from the host list: %s:%d", l.master_addr, l.master_port);
    // MASTER_ADDR wins over the host list; SLURM_STEP_NUM_TASKS counts the step's tasks
    l = detect("SLURM_JOB_ID=7 SLURM_PROCID=5 SLURM_STEP_NUM_TASKS=16 SLURM_NTASKS=32 SLURM_LOCALID=5 "
               "SLURM_NODEID=0 SLURM_STEP_TASKS_PER_NODE=8(x2) SLURM_JOB_NODELIST=n[1-2] MASTER_ADDR=head "
               "MASTER_PORT=1234", 0, 8);
    mt_expect(l.nprocs == 16 && l.local_nprocs == 8 && strcmp(l.master_addr, "head") == 0 && l.master_port == 1234,
              "slurm step: nprocs %d local %d master %s:%d", l.nprocs, l.local_nprocs, l.master_addr, l.master_port);
    // a batch script (no step): one process, whatever SLURM_NTASKS says
    l = detect("SLURM_JOB_ID=7 SLURM_PROCID=0 SLURM_NTASKS=16 SLURM_JOB_NODELIST=n[1-2]", 0, 1);
    mt_expect(l.kind == MT_LAUNCH_THREADS && l.nprocs == 1 && strstr(l.found, "not started by srun"),
              "a Slurm batch script is one process (%s)", l.found);

    l = detect("OMPI_COMM_WORLD_RANK=2 OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_RANK=0 "
               "OMPI_COMM_WORLD_LOCAL_SIZE=2 MASTER_ADDR=m MASTER_PORT=5000", 0, 1);
    mt_expect(l.kind == MT_LAUNCH_MPI && l.nprocs == 4 && l.proc == 2 && l.local_proc == 0 && l.local_nprocs == 2,
              "open mpi: kind %d nprocs %d proc %d", l.kind, l.nprocs, l.proc);
    l = detect("PMIX_RANK=1 OMPI_COMM_WORLD_SIZE=2 MASTER_ADDR=m MASTER_PORT=5000", 0, 1);
    mt_expect(l.kind == MT_LAUNCH_MPI && l.proc == 1, "PMIX_RANK: proc %d", l.proc);
    // torchrun's names win over the others (a script that sets them means them)
    l = detect("RANK=1 WORLD_SIZE=2 MASTER_ADDR=a MASTER_PORT=1 SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_STEP_ID=0", 0, 1);
    mt_expect(l.kind == MT_LAUNCH_TORCHRUN && l.proc == 1, "RANK wins over SLURM_PROCID");
    // a launcher of one process is today's single process
    l = detect("RANK=0 WORLD_SIZE=1", 4, 1);
    mt_expect(l.kind == MT_LAUNCH_THREADS && l.ranks_per_proc == 4, "WORLD_SIZE=1: threads");
    // the file instead of MASTER_*
    clear_launch_env();
    set_env("RANK=1 WORLD_SIZE=2");
    mt_config cfg;
    mt_config_defaults(&cfg);
    snprintf(cfg.parallel.nccl_init_file, sizeof cfg.parallel.nccl_init_file, "/shared/rdzv");
    cfg.parallel.dist_timeout = 7;
    mt_launch_detect(&l, &cfg);
    mt_expect(strcmp(l.init_file, "/shared/rdzv") == 0 && l.timeout_s == 7, "init file and timeout");
    // torch.distributed.launch passes --local_rank=N instead of LOCAL_RANK
    mt_config_defaults(&cfg);
    mt_config_parse(&cfg, 2, (char *[]){(char *)"train_gpt", (char *)"--local_rank=1", NULL});
    set_env("MASTER_ADDR=a MASTER_PORT=1");
    mt_launch_detect(&l, &cfg);
    mt_expect(l.local_proc == 1, "--local_rank=1: local process %d", l.local_proc);
    clear_launch_env();
}

// launcher variables that are wrong: each a one-line error naming the variable
typedef struct {
    const char *env;
    int tp;
} bad_env;

static void detect_in_child(void *arg) {
    const bad_env *b = (const bad_env *)arg;
    detect(b->env, 0, b->tp);
}

static void expect_env_error(const char *env, int tp, const char *want) {
    bad_env b = {env, tp};
    child_result r;
    pid_t pid = child_start(detect_in_child, &b, "build/test_launch_child.log");
    child_finish(pid, "build/test_launch_child.log", &r);
    mt_expect(r.status == 1 && strstr(r.out, want) != NULL, "%s: exit %d, want \"%s\" in: %s", env, r.status, want,
              r.out);
}

MT_TEST(detect_errors) {
    expect_env_error("RANK=x WORLD_SIZE=2", 1, "RANK=x is not a number");
    expect_env_error("RANK=2 WORLD_SIZE=2 MASTER_ADDR=a MASTER_PORT=1", 1, "RANK=2 is outside the job's 2 processes");
    expect_env_error("RANK=0 WORLD_SIZE=2", 1, "MASTER_ADDR and MASTER_PORT are not set");
    expect_env_error("OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2", 1, "mpirun -x MASTER_ADDR");
    expect_env_error("SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_STEP_ID=1 SLURM_JOB_NODELIST=node[1-", 1,
                     "cannot read the Slurm host list");
    expect_env_error("RANK=0 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 MASTER_ADDR=a MASTER_PORT=1", 4,
                     "TP=4 is larger than the 2 ranks of this node");
}

// ---------------------------------------------------------------------------------------------
// jobs of several processes on loopback
// ---------------------------------------------------------------------------------------------
static int free_port(void) {   // a port free right now: bind port 0, read it, release it
    char why[128];
    int port = 0;
    int fd = mt__listen(0, &port, why, sizeof why);
    if (fd >= 0) close(fd);
    return port;
}

typedef struct {
    char env[512];        // the launcher's variables of this process
    int nproc_per_node;   // rank threads per process
    int tp;               // --tensor-model-parallel-size (the topology check)
    double timeout;       // --dist-timeout
    char init_file[256];  // --nccl-init-file
    int scenario;         // what the ranks do (job_rank)
} job_spec;

enum { JOB_COLLECTIVES = 0, JOB_FAIL_ON_RANK_1, JOB_MISMATCH, JOB_RANK_1_LEAVES };

static float job_value(int rank, size_t i) {   // inputs where the order of the adds shows in the bits
    uint32_t x = (uint32_t)rank * 2654435761u ^ (uint32_t)i * 2246822519u;
    x ^= x >> 15; x *= 0x2c1b3c6du; x ^= x >> 12;
    static const float scale[5] = {1e-3f, 1e-1f, 1.0f, 1e1f, 1e3f};
    return ((float)(x & 0xffffffu) / 16777216.0f - 0.5f) * scale[(x >> 24) % 5];
}

// each rank: every collective across processes, checked against the serial rank-order reference;
// prints one "rank R ok id=..." line (the id is what rank 0 broadcast: an ncclUniqueId's role)
static void job_rank(mt_world *w, int rank, void *arg) {
    const job_spec *spec = (const job_spec *)arg;
    int size = mt_world_size(w);
    int *members = (int *)mt_malloc(sizeof(int) * (size_t)size, "members");
    for (int i = 0; i < size; i++) members[i] = i;
    mt_comm world;
    mt_comm_init(&world, w, rank, members, size);
    world.name = "world";
    if (spec->scenario == JOB_FAIL_ON_RANK_1 && rank == 1) mt_fatal("rank 1 fails on purpose");
    if (spec->scenario == JOB_RANK_1_LEAVES && rank == 1) {
        free(members);
        return;   // its process ends; the others must hear of it
    }
    enum { N = 1000 };
    float *x = (float *)mt_malloc(sizeof(float) * N * (size_t)size, "x");
    float *want = (float *)mt_malloc(sizeof(float) * N * (size_t)size, "want");
    int bad = 0;
    // the id: 128 random bytes made by rank 0, broadcast as 32 floats (what mt__nccl_join does)
    float id[32];
    memset(id, 0, sizeof id);
    if (rank == 0) {
        uint64_t seed = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)(mt_time_seconds() * 1e9);
        for (int i = 0; i < 32; i++) {
            uint32_t bits = (uint32_t)mt_hash64(seed + (uint64_t)i);
            memcpy(&id[i], &bits, 4);
        }
    }
    mt_broadcast(&world, id, 32, 0);
    // all-reduce: bit for bit the serial sum in rank order
    size_t n = spec->scenario == JOB_MISMATCH && rank == size - 1 ? N - 1 : N;
    for (size_t i = 0; i < n; i++) x[i] = job_value(rank, i);
    for (size_t i = 0; i < N; i++) {
        want[i] = job_value(0, i);
        for (int r = 1; r < size; r++) want[i] += job_value(r, i);
    }
    mt_all_reduce(&world, x, n, MT_SUM);
    bad += memcmp(x, want, sizeof(float) * N) != 0;
    // double all-reduce (max)
    double d = rank == size - 1 ? 3.5 : (double)rank;
    mt_all_reduce_double(&world, &d, 1, MT_MAX);
    bad += d != 3.5;
    // reduce-scatter in place and all-gather back: the all-reduce again
    size_t per = N / (size_t)size;
    for (size_t i = 0; i < per * (size_t)size; i++) x[i] = job_value(rank, i);
    mt_reduce_scatter(&world, x, x + (size_t)rank * per, per, MT_SUM);
    mt_all_gather(&world, x + (size_t)rank * per, x, per);
    bad += memcmp(x, want, sizeof(float) * per * (size_t)size) != 0;
    // a broadcast from the last rank, a barrier, send/recv around a ring
    float v = (float)rank + 0.25f;
    mt_broadcast(&world, &v, 1, size - 1);
    bad += v != (float)(size - 1) + 0.25f;
    mt_barrier(&world);
    float msg = (float)rank, got = -1;
    mt_send(&world, &msg, 1, (rank + 1) % size, 7);
    mt_recv(&world, &got, 1, (rank + size - 1) % size, 7);
    bad += got != (float)((rank + size - 1) % size);
    // a sub-group: the odd ranks, and two groups of the same members (world and "dp") stay apart
    int odd[64], n_odd = 0;
    for (int r = 1; r < size; r += 2) odd[n_odd++] = r;
    if (rank % 2 == 1 && n_odd > 1) {
        mt_comm g;
        mt_comm_init(&g, w, rank, odd, n_odd);
        g.name = "odd";
        float s = (float)rank;
        mt_all_reduce(&g, &s, 1, MT_SUM);
        float ws = 0;
        for (int i = 0; i < n_odd; i++) ws += (float)odd[i];
        bad += s != ws;
    }
    mt_comm dp;
    mt_comm_init(&dp, w, rank, members, size);
    dp.name = "dp";
    float one = 1.0f;
    mt_all_reduce(&dp, &one, 1, MT_SUM);
    bad += one != (float)size;
    char line[512];
    int len = snprintf(line, sizeof line, "rank %d %s node %d/%d id=", rank, bad ? "BAD" : "ok",
                       mt_world_node(w, rank), mt_world_node_rank(w, rank));
    for (int i = 0; i < 8; i++) {
        uint32_t bits;
        memcpy(&bits, &id[i], 4);
        len += snprintf(line + len, sizeof line - (size_t)len, "%08x", bits);
    }
    printf("%s\n", line);
    fflush(stdout);
    free(x);
    free(want);
    free(members);
}

static void job_process(void *arg) {
    const job_spec *spec = (const job_spec *)arg;
    clear_launch_env();
    set_env(spec->env);
    mt_config cfg;
    mt_config_defaults(&cfg);
    cfg.parallel.nproc_per_node = spec->nproc_per_node;
    cfg.parallel.tensor_model_parallel_size = spec->tp;
    cfg.parallel.dist_timeout = spec->timeout;
    snprintf(cfg.parallel.nccl_init_file, sizeof cfg.parallel.nccl_init_file, "%s", spec->init_file);
    mt_launch l;
    mt_launch_detect(&l, &cfg);
    cfg.world_size = l.nprocs * l.ranks_per_proc;   // what mt_config_derive would say
    mt_world *w = mt_world_create_launched(&l, &cfg);
    int rc = mt_world_run(w, job_rank, (void *)spec);
    mt_world_destroy(w);
    fflush(stdout);
    _exit(rc);
}

// runs processes procs[0..n) (a process with an empty env is not started: the one that never
// comes); results in r[]
static void run_job(job_spec *specs, int n, child_result *r) {
    pid_t pids[16];
    char paths[16][64];
    for (int i = 0; i < n; i++) {
        snprintf(paths[i], sizeof paths[i], "build/test_launch_p%d.log", i);
        pids[i] = specs[i].env[0] ? child_start(job_process, &specs[i], paths[i]) : -1;
    }
    for (int i = 0; i < n; i++) {
        memset(&r[i], 0, sizeof r[i]);
        if (pids[i] > 0) child_finish(pids[i], paths[i], &r[i]);
        else r[i].status = -1;
    }
}

// the torchrun-style variables of process p of n at the port; extra appended
static void torchrun_env(job_spec *s, int p, int n, int port, const char *extra) {
    memset(s, 0, sizeof *s);
    snprintf(s->env, sizeof s->env, "RANK=%d WORLD_SIZE=%d LOCAL_RANK=%d MASTER_ADDR=127.0.0.1 MASTER_PORT=%d %s", p,
             n, p, port, extra ? extra : "");
    s->tp = 1;
    s->timeout = 20;
}

static void expect_same_ids(child_result *r, int procs, int ranks) {
    char first_id[128] = "";
    int ok_lines = 0;
    for (int p = 0; p < procs; p++) {
        mt_expect(r[p].status == 0, "process %d exit %d: %s", p, r[p].status, r[p].out);
        for (const char *q = strstr(r[p].out, "rank "); q; q = strstr(q + 1, "rank ")) {
            const char *id = strstr(q, "id=");
            if (!id || strncmp(q + 5 + strcspn(q + 5, " ") + 1, "ok", 2) != 0) continue;
            char this_id[128];
            sscanf(id + 3, "%127s", this_id);
            if (!first_id[0]) snprintf(first_id, sizeof first_id, "%s", this_id);
            mt_expect(strcmp(this_id, first_id) == 0, "ids differ: %s vs %s", this_id, first_id);
            ok_lines++;
        }
    }
    mt_expect(ok_lines == ranks, "%d of %d ranks report ok", ok_lines, ranks);
}

MT_TEST(rendezvous_torchrun) {   // 3 processes of 1 rank: every collective, the same id everywhere
    int port = free_port();
    job_spec s[3];
    child_result r[3];
    for (int p = 0; p < 3; p++) torchrun_env(&s[p], p, 3, port, NULL);
    run_job(s, 3, r);
    expect_same_ids(r, 3, 3);
}

MT_TEST(rendezvous_threads_per_process) {   // 2 processes x 2 rank threads, nodes from GROUP_RANK
    int port = free_port();
    job_spec s[2];
    child_result r[2];
    for (int p = 0; p < 2; p++) {
        char extra[64];
        snprintf(extra, sizeof extra, "GROUP_RANK=%d", p);
        torchrun_env(&s[p], p, 2, port, extra);
        s[p].nproc_per_node = 2;
        s[p].tp = 2;   // ranks 0,1 on node 0 and 2,3 on node 1: TP=2 stays inside a node
    }
    run_job(s, 2, r);
    expect_same_ids(r, 2, 4);
    mt_expect(strstr(r[1].out, "rank 3 ok node 1/1") != NULL, "rank 3 is GPU 1 of node 1: %s", r[1].out);
}

MT_TEST(rendezvous_file) {   // --nccl-init-file: a file instead of MASTER_ADDR:MASTER_PORT (a stale one first)
    job_spec s[3];
    child_result r[3];
    char file[256];
    snprintf(file, sizeof file, "build/test_launch_rdzv.%d", (int)getpid());
    // a stale file from an earlier job, naming a port where nobody listens: the others keep
    // re-reading the file until process 0 has replaced it
    FILE *stale = fopen(file, "w");
    fprintf(stale, "MTRDZV1 127.0.0.1 %d\n", free_port());
    fclose(stale);
    for (int p = 0; p < 3; p++) {
        memset(&s[p], 0, sizeof s[p]);
        snprintf(s[p].env, sizeof s[p].env, "SLURM_JOB_ID=1 SLURM_PROCID=%d SLURM_NTASKS=3 SLURM_STEP_ID=0 "
                 "MASTER_ADDR=127.0.0.1", p);
        s[p].tp = 1;
        s[p].timeout = 20;
        snprintf(s[p].init_file, sizeof s[p].init_file, "%s", file);
    }
    run_job(s, 3, r);
    expect_same_ids(r, 3, 3);
    mt_expect(access(file, F_OK) != 0, "process 0 removes the file once everyone has read it");
}

MT_TEST(rendezvous_peer_never_comes) {   // 3 processes expected, 2 started: an error naming the missing one
    int port = free_port();
    job_spec s[3];
    child_result r[3];
    for (int p = 0; p < 3; p++) torchrun_env(&s[p], p, 3, port, NULL), s[p].timeout = 1;
    s[2].env[0] = '\0';
    double t0 = mt_time_seconds();
    run_job(s, 3, r);
    double took = mt_time_seconds() - t0;
    char want[128];
    snprintf(want, sizeof want, "127.0.0.1:%d: 1 of 3 processes never arrived within 1 s: process 2", port);
    mt_expect(r[0].status == 1 && strstr(r[0].out, want), "process 0: exit %d, want \"%s\" in: %s", r[0].status, want,
              r[0].out);
    mt_expect(r[1].status == 1 && strstr(r[1].out, want), "process 1 prints the same: %s", r[1].out);
    mt_expect(took < 10, "the timeout of 1 s took %.1f s", took);
}

MT_TEST(rendezvous_master_never_comes) {   // process 0 missing: the others name the host and port
    int port = free_port();
    job_spec s[2];
    child_result r[2];
    for (int p = 0; p < 2; p++) torchrun_env(&s[p], p, 2, port, NULL), s[p].timeout = 1;
    s[0].env[0] = '\0';
    run_job(s, 2, r);
    char want[128];
    snprintf(want, sizeof want, "process 1 cannot reach the rendezvous at 127.0.0.1:%d within 1 s", port);
    mt_expect(r[1].status == 1 && strstr(r[1].out, want), "exit %d, want \"%s\" in: %s", r[1].status, want, r[1].out);
}

MT_TEST(rendezvous_wrong_world_size) {   // process 1 thinks the job has 3 processes
    int port = free_port();
    job_spec s[2];
    child_result r[2];
    torchrun_env(&s[0], 0, 2, port, NULL);
    torchrun_env(&s[1], 1, 3, port, NULL);
    s[0].timeout = s[1].timeout = 5;
    run_job(s, 2, r);
    const char *want = "process 1 (host ";
    mt_expect(r[0].status == 1 && strstr(r[0].out, want) && strstr(r[0].out, "says the job has 3 processes, process "
              "0 says 2"), "process 0: %s", r[0].out);
    mt_expect(r[1].status == 1 && strstr(r[1].out, "says the job has 3 processes"), "process 1: %s", r[1].out);
}

MT_TEST(topology_tp_across_nodes) {   // 2 nodes of 1 rank each with TP=2: TP would cross the nodes
    int port = free_port();
    job_spec s[2];
    child_result r[2];
    for (int p = 0; p < 2; p++) {
        char extra[64];
        snprintf(extra, sizeof extra, "GROUP_RANK=%d", p);
        torchrun_env(&s[p], p, 2, port, extra);
        s[p].tp = 2;
    }
    run_job(s, 2, r);
    for (int p = 0; p < 2; p++)
        mt_expect(r[p].status == 1 && strstr(r[p].out, "TP=2 is larger than the 1 ranks of node 0"),
                  "process %d: %s", p, r[p].out);
    // 3 ranks per node with TP=2: the group of ranks 2,3 spans both nodes
    port = free_port();
    for (int p = 0; p < 2; p++) {
        char extra[64];
        snprintf(extra, sizeof extra, "GROUP_RANK=%d", p);
        torchrun_env(&s[p], p, 2, port, extra);
        s[p].tp = 2;
        s[p].nproc_per_node = 3;
    }
    run_job(s, 2, r);
    mt_expect(r[0].status == 1 && strstr(r[0].out, "the TP group of ranks 2..3 spans node 0"), "%s", r[0].out);
}

MT_TEST(job_abort_spreads) {   // rank 1 (process 1) fails while rank 0 waits for it: both stop with its error
    int port = free_port();
    job_spec s[2];
    child_result r[2];
    for (int p = 0; p < 2; p++) torchrun_env(&s[p], p, 2, port, NULL), s[p].scenario = JOB_FAIL_ON_RANK_1;
    run_job(s, 2, r);
    for (int p = 0; p < 2; p++)
        mt_expect(r[p].status == 1 && strstr(r[p].out, "error: rank 1: rank 1 fails on purpose"), "process %d: %s", p,
                  r[p].out);
}

MT_TEST(job_mismatch) {   // the last rank all-reduces one element fewer: named, as in one process
    int port = free_port();
    job_spec s[2];
    child_result r[2];
    for (int p = 0; p < 2; p++) torchrun_env(&s[p], p, 2, port, NULL), s[p].scenario = JOB_MISMATCH;
    run_job(s, 2, r);
    const char *want = "group world: rank 1 called all_reduce(n=999, sum) while rank 0 called all_reduce(n=1000, sum)";
    for (int p = 0; p < 2; p++)
        mt_expect(r[p].status == 1 && strstr(r[p].out, want), "process %d: %s", p, r[p].out);
}

MT_TEST(job_peer_leaves) {   // process 1's rank returns at once: rank 0 is told, not left hanging
    int port = free_port();
    job_spec s[2];
    child_result r[2];
    for (int p = 0; p < 2; p++) torchrun_env(&s[p], p, 2, port, NULL), s[p].scenario = JOB_RANK_1_LEAVES;
    run_job(s, 2, r);
    mt_expect(r[0].status == 1 && strstr(r[0].out, "rank 0 waits for a message from rank 1 (broadcast on group world) that can never arrive: its process has ended"),
              "process 0: %s", r[0].out);
}

int main(void) {
    alarm(300);
    mkdir("build", 0755);
    mt_run_test(hostlist);
    mt_run_test(detect_launchers);
    mt_run_test(detect_errors);
    mt_run_test(rendezvous_torchrun);
    mt_run_test(rendezvous_threads_per_process);
    mt_run_test(rendezvous_file);
    mt_run_test(rendezvous_peer_never_comes);
    mt_run_test(rendezvous_master_never_comes);
    mt_run_test(rendezvous_wrong_world_size);
    mt_run_test(topology_tp_across_nodes);
    mt_run_test(job_abort_spreads);
    mt_run_test(job_mismatch);
    mt_run_test(job_peer_leaves);
    return mt_test_summary();
}
