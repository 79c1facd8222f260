/* tests/installed/uses_c_abi.c: a C program built only against the
 * installed header and pkg-config file; one all-reduce through the ABI. */
#include <collie/collie.h>
#include <stdio.h>

int main(void) {
  collie_comm* comm = NULL;
  int rank = 0, size = 0;
  float x[4] = {1, 2, 3, 4};
  collie_tensor t = {x, 4, COLLIE_F32, COLLIE_CPU, 0};
  if (collie_comm_connect(NULL, &comm) != COLLIE_OK || collie_comm_rank(comm, &rank) != COLLIE_OK ||
      collie_comm_size(comm, &size) != COLLIE_OK ||
      collie_comm_allreduce(comm, t, t, COLLIE_SUM, NULL) != COLLIE_OK) {
    fprintf(stderr, "failed: %s\n", collie_last_error());
    return 1;
  }
  for (int i = 0; i < 4; ++i)
    if (x[i] != (float)((i + 1) * size)) {
      fprintf(stderr, "rank %d: x[%d] = %g\n", rank, i, x[i]);
      return 1;
    }
  printf("rank %d: C ABI from the installed tree ok\n", rank);
  collie_comm_destroy(comm);
  return 0;
}
