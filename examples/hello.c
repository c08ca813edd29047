/* SPDX-License-Identifier: MIT */
/* hello.c -- the README's example: one critical section under a lock. */
#include <dlock.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    dlock_client *c;
    dlock *l;

    /* argv[1]: a store URI; none: $DLOCK_STORE, else local lock files */
    if (dlock_client_open(&c, argc > 1 ? argv[1] : NULL, NULL) != DLOCK_OK) {
        fprintf(stderr, "dlock: %s\n", dlock_errmsg());
        return 1;
    }
    dlock_open(&l, c, "payments:42", NULL);   /* 30 s lease, renewed */
    if (dlock_acquire(l, 5000) == DLOCK_OK) { /* wait at most 5 s */
        printf("held, fencing token %llu\n",
               (unsigned long long)dlock_token(l));
        /* ... the critical section: give the token to what you write ... */
        if (dlock_release(l) == DLOCK_ELOST)
            fprintf(stderr, "the lock was lost: roll back\n");
    }
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}
