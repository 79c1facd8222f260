// comm/communicator.cc: connect(): resolve the launch settings, set up the
// rendezvous store, and hand over to the backend picked by name.
#include <unistd.h>

#include <algorithm>

#include "collie/comm.h"
#include "collie_build_config.h"
#include "comm/config/config.h"
#include "comm/core/log.h"
#include "comm/tcp/tcp_backend.h"

namespace collie {

namespace {

// Backends collie knows of, whether this build has them or not, so that
// asking for a missing one says why it is missing.
struct BackendInfo {
  const char* name;
  bool built;
  const char* missing;
};

constexpr BackendInfo kBackends[] = {
    {"tcp", true, ""},
    {"shm", false, "the shared-memory transport is not part of this version of collie yet"},
    {"mpi", false,
     COLLIE_HAVE_MPI
         ? "the MPI backend is not part of this version of collie yet"
         : "this build has no MPI: install libopenmpi-dev and configure with -Dmpi=enabled"},
    {"nccl", false, "the NCCL backend is not part of this version of collie yet"},
};

std::string resolve_backend(const std::string& requested) {
  if (requested == "auto") return "tcp";
  for (const auto& b : kBackends) {
    if (requested != b.name) continue;
    if (b.built) return requested;
    throw Error(ErrorCode::unavailable,
                "backend '" + requested + "' is not available: " + b.missing + " (available: tcp)");
  }
  throw Error(ErrorCode::invalid_argument,
              "unknown backend '" + requested + "'; choose one of auto, tcp, shm, mpi, nccl");
}

}  // namespace

std::vector<std::string> available_backends() {
  std::vector<std::string> v;
  for (const auto& b : kBackends)
    if (b.built) v.push_back(b.name);
  return v;
}

std::unique_ptr<Communicator> connect(const Options& options) {
  auto env = config::process_env();
  config::Launch launch = config::resolve_launch(options, env);
  std::string backend = resolve_backend(config::backend(options, env));
  std::string who = "rank " + std::to_string(launch.rank);

  tcp::Setup setup;
  setup.launch = launch;
  setup.tuning = config::tcp_tuning(env);
  setup.key = "collie/world";
  if (options.store || !launch.store_file.empty()) {
    setup.store = options.store
                      ? options.store
                      : std::shared_ptr<Store>(make_file_store(launch.store_file, launch.timeout));
    // Peers find this rank by the address it publishes: loopback when every
    // rank is on this host, else this host's name.
    if (launch.local_world_size < launch.world_size) {
      char host[256] = {0};
      gethostname(host, sizeof host - 1);
      setup.listen_host = host;
    } else {
      setup.listen_host = "127.0.0.1";
    }
  } else if (launch.world_size > 1) {
    std::shared_ptr<TcpStoreServer> server;
    int port = launch.master_port;
    if (launch.rank == 0) {
      server = TcpStoreServer::start(port < 0 ? 0 : port, launch.secret, launch.store_fd);
      port = server->port();
    }
    auto client = TcpStore::connect(launch.master_addr, port, launch.secret, launch.timeout, who);
    setup.listen_host = client->local_address();
    setup.store = std::move(client);
    setup.keep_alive = server;
  }
  log::info(who + " of " + std::to_string(launch.world_size) + ": backend " + backend +
            ", launch variables from " + launch.source);
  return tcp::make_tcp_communicator(std::move(setup));
}

}  // namespace collie
