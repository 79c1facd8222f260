/* tests/c_check.h: the C tests' assertions. CHECK counts a failure and goes
 * on (the test exits non-zero at the end); OK stops at once when a call that
 * must succeed does not, printing collie_last_error(). The file that uses it
 * includes a collie C header too: collie/collie.h, or tests/abi/collie_v1.h
 * for the ABI 1 caller. */
#ifndef COLLIE_TESTS_C_CHECK_H
#define COLLIE_TESTS_C_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static int failures = 0;
#define CHECK(cond, ...)                                     \
  do {                                                       \
    if (!(cond)) {                                           \
      fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                          \
      fprintf(stderr, "\n");                                 \
      ++failures;                                            \
    }                                                        \
  } while (0)
#define OK(call)                                                                     \
  do {                                                                               \
    collie_status st_ = (call);                                                      \
    if (st_ != COLLIE_OK) {                                                          \
      fprintf(stderr, "%s failed (%d): %s\n", #call, (int)st_, collie_last_error()); \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

#endif
