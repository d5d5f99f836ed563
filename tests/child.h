/* tests/child.h - run a function in a forked child and capture what it prints.
 *
 * mt_fatal exits the process (STYLE: one exit for every error), so a test of an error path runs
 * the call in a child: run_child(fn, arg, out, cap) forks, sends the child's stdout and stderr
 * into one pipe, calls fn(arg) there, and returns the child's exit status: 77 if fn returned
 * (the call under test did not exit), 128 + signal if the child crashed. `out` receives what the
 * child printed (at most cap - 1 bytes, NUL-terminated; the rest is read and dropped, so the
 * child never blocks on a full pipe). Used by test_data, test_logging and test_deepspeed.
 */
#ifndef MT_TEST_CHILD_H
#define MT_TEST_CHILD_H
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

typedef void (*child_fn)(void *arg);
static int run_child(child_fn fn, void *arg, char *out, size_t cap) {
    int fd[2];
    if (pipe(fd) != 0) { perror("pipe"); exit(2); }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); exit(2); }
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 1);
        dup2(fd[1], 2);
        close(fd[1]);
        fn(arg);
        fflush(stdout);
        fflush(stderr);
        _exit(77);
    }
    close(fd[1]);
    size_t n = 0;
    char sink[4096];
    for (;;) {   // read to EOF, keeping what fits, so the child never blocks on a full pipe
        ssize_t k = n + 1 < cap ? read(fd[0], out + n, cap - 1 - n) : read(fd[0], sink, sizeof sink);
        if (k <= 0) break;
        if (n + 1 < cap) n += (size_t)k;
    }
    out[n] = 0;
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}
#endif
