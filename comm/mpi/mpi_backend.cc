// comm/mpi/mpi_backend.cc: see mpi_backend.h.
#include "comm/mpi/mpi_backend.h"

#include "collie_build_config.h"

#if COLLIE_HAVE_MPI

#include <mpi.h>

#include <memory>
#include <string>

#include "base/config.h"
#include "base/log.h"
#include "comm/host_executor.h"
#include "comm/mpi/mpi_process.h"
#include "comm/mpi/mpi_runner.h"

namespace collie::mpi {

namespace {

// The runner of the communicator `plan` describes: MPI_Comm_split of the
// parent's, which every rank of the parent calls, in the same place of the
// op order (the front's all-gather of colors has just ended). MPI orders
// the new ranks by (key, rank), as the front does.
std::unique_ptr<HostRunner> split_runner(HostRunner& parent, const SplitPlan& plan) {
  MPI_Comm c = MPI_COMM_NULL;
  int rc;
  {
    auto lk = Process::get().lock();
    rc = MPI_Comm_split(static_cast<MpiRunner&>(parent).comm(),
                        plan.color < 0 ? MPI_UNDEFINED : plan.color, plan.key, &c);
  }
  if (rc != MPI_SUCCESS)
    throw Error(ErrorCode::internal,
                "split on the mpi backend: MPI_Comm_split failed: " + mpi_error(rc));
  if (plan.color < 0) return nullptr;
  int r = -1, s = 0;
  MPI_Comm_rank(c, &r);
  MPI_Comm_size(c, &s);
  if (r != plan.new_rank || s != static_cast<int>(plan.members.size()))
    throw Error(ErrorCode::internal, "split on the mpi backend: MPI made rank " +
                                         std::to_string(r) + " of " + std::to_string(s) +
                                         ", collie expected " + std::to_string(plan.new_rank) +
                                         " of " + std::to_string(plan.members.size()));
  return std::make_unique<MpiRunner>(plan.context, c);
}

// "" under an MPI launch (or a single process: MPI starts as a singleton),
// else why not. Collie's own launch variables win over mpirun's, so the
// source says who started the ranks.
std::string unusable(const config::Launch& l) {
  if (l.world_size == 1 || l.source == "OMPI" || l.source == "SLURM") return "";
  return "it needs an MPI launch (mpirun or srun), and these ranks were started by " +
         (l.source == "none" ? std::string("no launcher") : l.source + "'s variables") +
         " (use tcp, shm or hier without mpirun)";
}

// The world communicator's runner: MPI started, checked against the launch
// variables, MPI_COMM_WORLD dupped.
std::unique_ptr<HostRunner> make_runner(const BackendContext& ctx) {
  Process::get().start(config::mpi_settings(ctx.env).choose_algorithms);
  int r = 0, s = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  if (r != ctx.launch.rank || s != ctx.launch.world_size)
    throw Error(ErrorCode::invalid_argument,
                "the mpi backend: MPI says this process is rank " + std::to_string(r) + " of " +
                    std::to_string(s) + ", and collie's launch variables say rank " +
                    std::to_string(ctx.launch.rank) + " of " +
                    std::to_string(ctx.launch.world_size) + " (from " + ctx.launch.source +
                    "): start every rank with one mpirun or srun");
  MPI_Comm c;
  {
    auto lk = Process::get().lock();
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
  }
  log::info("rank " + std::to_string(r) + ": mpi backend, MPI thread level " +
            level_name(Process::get().level()));
  return std::make_unique<MpiRunner>(ctx, c);
}

}  // namespace

BackendEntry backend_entry() {
  return {"mpi",
          true,
          "",
          &unusable,
          [](const BackendContext& ctx) {
            return make_host_backend("mpi", &make_runner, ctx, &split_runner);
          },
          false};
}

}  // namespace collie::mpi

#else  // !COLLIE_HAVE_MPI

namespace collie::mpi {

BackendEntry backend_entry() {
  return {"mpi",
          false,
          "this build has no MPI: install Open MPI (apt-get install libopenmpi-dev) and configure "
          "with -Dmpi=enabled",
          nullptr,
          nullptr,
          false};
}

}  // namespace collie::mpi

#endif
