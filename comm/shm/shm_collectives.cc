// comm/shm/shm_collectives.cc: the shm backend's collectives: its steps
// (comm/shm/steps.h) over its segment, compiled here once.
#include "comm/shm/shm_runner.h"

namespace collie::shm {

template class ShmSteps<Segment>;

void ShmRunner::run_collective(const Op& op, Deadline dl) {
  collective(op, dl);
}

}  // namespace collie::shm
