// comm/tcp/tcp_backend.h: collie's own TCP transport as a Communicator.
//
// Construction rendezvouses through the store (each rank publishes the
// address it listens on, connects to every lower rank and accepts every
// higher one, each connection opened with the job secret) and leaves a full
// mesh of sockets. Operations queue in order; one progress thread runs them,
// or the thread that waits on the next one runs it itself.
#pragma once

#include <memory>
#include <string>

#include "collie/comm.h"
#include "comm/config/config.h"

namespace collie::tcp {

struct Setup {
  config::Launch launch;
  config::TcpTuning tuning;
  std::shared_ptr<Store> store;
  std::shared_ptr<void> keep_alive;  // the store server, when this process serves it
  std::string key;                   // unique per communicator: store key prefix
  std::string listen_host;           // address peers can reach this rank on
};

std::unique_ptr<Communicator> make_tcp_communicator(Setup setup);

}  // namespace collie::tcp
