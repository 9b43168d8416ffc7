/* check.h: the checks of the C suites (tests/test_*.c, one executable each).
 *
 * CHECK(cond, fmt, ...) counts one check and prints it: "ok    <message>", or
 * "FAIL  file:line: <message>" (suites with thousands of checks define CHECK_QUIET
 * before including this header and print failures only). check_summary() prints the last
 * line tests/tests.cmake expects, "N passed, N failed", and returns the exit status. */
#pragma once
#include <stdio.h>

static int check_passed, check_failed;

#ifdef CHECK_QUIET
#define CHECK_PRINT_OK 0
#else
#define CHECK_PRINT_OK 1
#endif

#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        if (cond) {                                                                                          \
            check_passed++;                                                                                  \
            if (CHECK_PRINT_OK) { printf("ok    "); printf(__VA_ARGS__); printf("\n"); }                    \
        } else {                                                                                             \
            check_failed++;                                                                                  \
            printf("FAIL  %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n");                 \
        }                                                                                                    \
    } while (0)

static inline int check_summary(void) {
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}
