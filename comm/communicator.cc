// comm/communicator.cc: connect(): resolve the launch settings, make the
// rendezvous store (once, whichever backend runs), pick the backend from the
// registry and put the communicator front over it.
#include <unistd.h>

#include "collie/comm.h"
#include "comm/backend.h"
#include "comm/config/config.h"
#include "comm/core/log.h"
#include "comm/front.h"

namespace collie {

namespace {

// The store every rank rendezvous through, and the address this rank's
// peers reach it on.
void make_rendezvous(const Options& options, BackendContext& ctx) {
  const config::Launch& launch = ctx.launch;
  std::string who = "rank " + std::to_string(launch.rank);
  if (options.store || !launch.store_file.empty()) {
    ctx.store = options.store
                    ? options.store
                    : std::shared_ptr<Store>(make_file_store(launch.store_file, launch.timeout));
    // Peers find this rank by the address it publishes: loopback when every
    // rank is on this host, else this host's name.
    if (launch.local_world_size < launch.world_size) {
      char host[256] = {0};
      gethostname(host, sizeof host - 1);
      ctx.listen_host = host;
    } else {
      ctx.listen_host = "127.0.0.1";
    }
  } else if (launch.world_size > 1) {
    std::shared_ptr<TcpStoreServer> server;
    int port = launch.master_port;
    if (launch.rank == 0) {
      server = TcpStoreServer::start(port < 0 ? 0 : port, launch.secret, launch.store_fd);
      port = server->port();
    }
    auto client = TcpStore::connect(launch.master_addr, port, launch.secret, launch.timeout, who);
    ctx.listen_host = client->local_address();
    ctx.store = std::move(client);
    ctx.keep_alive = server;
  }
}

}  // namespace

std::vector<std::string> available_backends() {
  std::vector<std::string> v;
  for (const auto& b : backend_registry())
    if (b.built) v.push_back(b.name);
  return v;
}

std::unique_ptr<Communicator> connect(const Options& options) {
  BackendContext ctx;
  ctx.env = config::process_env();
  ctx.launch = config::resolve_launch(options, ctx.env);
  const BackendEntry& entry = pick_backend(config::backend(options, ctx.env), ctx.launch);
  ctx.key = "collie/world";
  ctx.failure = std::make_shared<FailureLatch>();
  make_rendezvous(options, ctx);
  log::info("rank " + std::to_string(ctx.launch.rank) + " of " +
            std::to_string(ctx.launch.world_size) + ": backend " + entry.name +
            ", launch variables from " + ctx.launch.source);
  return make_front(ctx, entry.create(ctx));
}

}  // namespace collie
