/* Catches a native crash (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) inside one call into a plugin, on the thread
 * that made it, and returns the signal instead of letting it kill the daemon. Outside a guarded call the
 * signal goes to the handler that was there before (Rust's stack-overflow report, or the default action). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stddef.h>
#include <string.h>

static __thread sigjmp_buf *canopy_guard_jump;
static __thread volatile sig_atomic_t canopy_guard_signal;

static const int canopy_guard_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
#define CANOPY_GUARD_NSIG (sizeof canopy_guard_signals / sizeof canopy_guard_signals[0])
static struct sigaction canopy_guard_previous[CANOPY_GUARD_NSIG];

static void canopy_guard_handler(int sig, siginfo_t *info, void *uctx) {
    sigjmp_buf *jump = canopy_guard_jump;
    if (jump != NULL) {
        canopy_guard_jump = NULL;
        canopy_guard_signal = sig;
        siglongjmp(*jump, 1);
    }
    for (size_t i = 0; i < CANOPY_GUARD_NSIG; i++) {
        if (canopy_guard_signals[i] != sig) {
            continue;
        }
        struct sigaction *prev = &canopy_guard_previous[i];
        if ((prev->sa_flags & SA_SIGINFO) && prev->sa_sigaction != NULL) {
            prev->sa_sigaction(sig, info, uctx);
            return;
        }
        if (prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN && prev->sa_handler != NULL) {
            prev->sa_handler(sig);
            return;
        }
    }
    /* The default action: the fault happens again on return, or the signal is raised again, and kills us. */
    signal(sig, SIG_DFL);
    if (sig == SIGABRT) {
        raise(sig);
    }
}

/* Installs the handler once per process; returns 0 or -1. */
int canopy_guard_install(void) {
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_sigaction = canopy_guard_handler;
    act.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&act.sa_mask);
    for (size_t i = 0; i < CANOPY_GUARD_NSIG; i++) {
        if (sigaction(canopy_guard_signals[i], &act, &canopy_guard_previous[i]) != 0) {
            return -1;
        }
    }
    return 0;
}

/* Runs f(arg); returns 0, or the signal that ended it. f must hold nothing that needs cleaning up. */
int canopy_guard_call(void (*f)(void *), void *arg) {
    sigjmp_buf jump;
    if (sigsetjmp(jump, 1) != 0) {
        return canopy_guard_signal;
    }
    canopy_guard_jump = &jump;
    f(arg);
    canopy_guard_jump = NULL;
    return 0;
}
