// tests/fuzz/make_seeds.cc: writes the fuzz targets' seed inputs (made by
// collie's own writers: real frame headers, real checkpoints of the models
// in tests/fuzz/models.h) and hand-written edge cases, into
// <dir>/<target>/. tests/fuzz/make_seeds.sh runs it, and adds the
// environments the launchers really set.
//
//   fuzz_make_seeds tests/fuzz/corpus
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/state_bytes.h"
#include "comm/store/store_protocol.h"
#include "comm/tcp/frame.h"
#include "comm/tcp/handshake.h"
#include "tests/fuzz/models.h"

using namespace collie;
namespace fs = std::filesystem;

namespace {

fs::path root;

void write(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::create_directories(root / target);
  std::ofstream(root / target / name, std::ios::binary) << bytes;
}

std::string str(const Bytes& b) {
  return std::string(b.begin(), b.end());
}

std::string header(const tcp::FrameHeader& h) {
  return std::string(reinterpret_cast<const char*>(&h), sizeof h);
}

OpDesc op(OpKind k, DType t, ReduceOp r, uint32_t seq, int32_t tag, uint64_t count) {
  OpDesc d;
  d.op = k;
  d.dtype = t;
  d.redop = r;
  d.seq = seq;
  d.tag = tag;
  d.count = count;
  return d;
}

// A spec as a file name: "powersgd:rank=1" -> "powersgd_rank_1".
std::string file_name(std::string s) {
  for (char& c : s)
    if (c == ':' || c == ',' || c == '=') c = '_';
  return s;
}

void frames() {
  using tcp::FrameKind;
  using tcp::make_header;
  const OpDesc ar = op(OpKind::allreduce, DType::f32, ReduceOp::sum, 3, 0, 1000);
  const std::string posted = header(make_header(FrameKind::data, ar, 4000));
  write("frame", "data-expected", posted + posted);
  write("frame", "data-other-step-size", posted + header(make_header(FrameKind::data, ar, 512)));
  write("frame", "data-other-count",
        posted +
            header(make_header(FrameKind::data,
                               op(OpKind::allreduce, DType::f32, ReduceOp::sum, 3, 0, 999), 3996)));
  write("frame", "data-other-op",
        posted + header(make_header(FrameKind::data,
                                    op(OpKind::broadcast, DType::f32, ReduceOp::sum, 3, 1, 1000),
                                    4000)));
  const OpDesc p2p = op(OpKind::p2p, DType::bf16, ReduceOp::sum, 17, 42, 8);
  write("frame", "p2p-expected",
        header(make_header(FrameKind::data, p2p, 16)) +
            header(make_header(FrameKind::data, p2p, 16)));
  const OpDesc rs = op(OpKind::reduce_scatter, DType::f64, ReduceOp::max, 9, 0, 64);
  write("frame", "reduce-scatter-other-redop",
        header(make_header(FrameKind::data, rs, 512)) +
            header(make_header(FrameKind::data,
                               op(OpKind::reduce_scatter, DType::f64, ReduceOp::min, 9, 0, 64),
                               512)));
  // A message from the higher rank on its own connection, announced on the
  // shared one; a receiver expecting a small message there meets it.
  const std::string announced = header(make_header(FrameKind::elsewhere, p2p, 1 << 20));
  write("frame", "elsewhere-expected", announced + announced);
  write("frame", "elsewhere-where-data-expected",
        header(make_header(FrameKind::data, p2p, 16)) + announced);
  write("frame", "data-where-elsewhere-expected",
        announced + header(make_header(FrameKind::data, p2p, 16)));
  const std::string why = "rank 7: allreduce #3 (f32 x 1000, sum) on rank 7 timed out";
  write("frame", "abort", posted + tcp::last_frame(FrameKind::abort, 1, why));
  write("frame", "abort-cut-off",
        posted + tcp::last_frame(FrameKind::abort, 2, why).substr(0, sizeof(tcp::FrameHeader) + 9));
  write("frame", "bye", posted + tcp::last_frame(FrameKind::bye, 0, ""));
  write("frame", "not-a-frame", posted + "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  write("frame", "short", posted.substr(0, 20));
}

// A reducer over the model with `spec`, trained `steps` iterations.
struct Trained {
  fuzz::Model m;
  std::unique_ptr<Reducer> red;
  Trained(const std::string& spec, int steps) {
    red = std::make_unique<Reducer>(fuzz::solo(), m.params(), fuzz::reducer_options(spec));
    for (int it = 0; it < steps; ++it) fuzz::train_step(*red, m, static_cast<uint64_t>(it));
  }
};

void checkpoints() {
  const auto& specs = fuzz::hook_specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!fuzz::hook_or_null(specs[i])) {
      std::fprintf(stderr, "fuzz_make_seeds: %s is not in this build: no seed for it\n",
                   specs[i].c_str());
      continue;
    }
    const std::string pick(1, static_cast<char>(i));
    const std::string name = std::to_string(i) + "-" + file_name(specs[i]);
    Trained t(specs[i], 4);
    write("reducer_state", name, pick + str(t.red->save_state()));
    write("hook_state", name, pick + str(t.red->comm_hook().save_state()));
    if (i == 0 || specs[i].find("powersgd") != std::string::npos) {
      Trained fresh(specs[i], 0);
      write("reducer_state", name + "-fresh", pick + str(fresh.red->save_state()));
    }
  }
  write("reducer_state", "empty", "");
  write("reducer_state", "not-a-checkpoint", std::string(1, '\0') + "RCDREST1 and then nothing");
  // The averagers: PeriodicModelAverager, then HierarchicalModelAverager.
  {
    PeriodicModelAverager avg(fuzz::solo(), 3, 2);
    std::vector<float> v = fuzz::averaged_values();
    for (int k = 0; k < 5; ++k) avg.average_parameters({view_of(v.data(), v.size())});
    write("hook_state", "periodic-averager",
          std::string(1, static_cast<char>(specs.size())) + str(avg.save_state()));
  }
  {
    HierarchicalModelAverager avg(fuzz::solo(), {{2, 1}, {4, 1}}, 1);
    std::vector<float> v = fuzz::averaged_values();
    for (int k = 0; k < 7; ++k) avg.average_parameters({view_of(v.data(), v.size())});
    write("hook_state", "hierarchical-averager",
          std::string(1, static_cast<char>(specs.size() + 1)) + str(avg.save_state()));
  }
}

void hook_specs() {
  int n = 0;
  auto add = [&n](const std::string& spec) {
    write("hook_spec", std::to_string(n++) + "-" + file_name(spec), spec);
  };
  for (const auto& s : fuzz::hook_specs()) add(s);
  for (const auto& s : comm_hook_names()) add(s);
  add("fp16_wrap:bf16_wrap:noop");
  add("powersgd:rank=4,start_iter=10,min_compression_rate=1.5,error_feedback=false,"
      "warm_start=on,orthogonalization_epsilon=1e-8,seed=7");
  add("batched_powersgd:rank=3,start_iter=2,warm_start=no");
  add("post_local_sgd:start_iter=0,subgroup=1");
  add("post_local_sgd:subgroup=host");
  add("allreduce:,");
  add("powersgd:rank=0");
  add("fp16_wrap:");
  add("fp8");
}

void environments() {
  // The variables each launcher sets come from the launchers themselves
  // (make_seeds.sh); these are what users add, and edge cases.
  write("launch_env", "tuning-knobs",
        "COLLIE_TIMEOUT=120\nCOLLIE_ALLREDUCE_ALGO=ring\nCOLLIE_TCP_CHUNK_BYTES=4096\n"
        "COLLIE_TCP_SOCKETS=3\nCOLLIE_TCP_SOCKET_MIN_BYTES=4096\nCOLLIE_SPIN_US=0\n"
        "COLLIE_SOCKET_BUFFER=4194304\nCOLLIE_TCP_LATENCY_US=12.5\nCOLLIE_TCP_GBPS=3\n"
        "COLLIE_REDUCE_GBPS=9.5\nCOLLIE_SHM_CHUNK=8192\nCOLLIE_SHM_SMALL=0\n"
        "COLLIE_HIER_PIECE=65536\nCOLLIE_CUDA_CHUNK=4096\nCOLLIE_CUDA_BACKEND=staged\n"
        "COLLIE_MPI_CHECK=2\nCOLLIE_MPI_ALGORITHMS=0\nCOLLIE_BIND=core\nCOLLIE_DEBUG=INFO\n"
        "COLLIE_REDUCER_LOG_EVERY=10\nCOLLIE_RUN_GRACE=2\nCOLLIE_BACKEND=shm\n"
        "COLLIE_COMM_HOOK=powersgd:rank=2\nCOLLIE_HOSTNAME=node7\nOMPI_MCA_btl=^vader,tcp\n");
  write("launch_env", "rank-past-world", "RANK=4\nWORLD_SIZE=4\n");
  write("launch_env", "torchrun-agent-store",
        "RANK=0\nWORLD_SIZE=2\nMASTER_ADDR=10.0.0.1\nMASTER_PORT=65535\n"
        "TORCHELASTIC_USE_AGENT_STORE=True\nTORCHELASTIC_RUN_ID=job7\n");
  write("launch_env", "slurm-two-nodes",
        "SLURM_PROCID=3\nSLURM_NTASKS=4\nSLURM_LOCALID=1\nSLURM_JOB_ID=123456\n");
  write("launch_env", "not-numbers",
        "COLLIE_RANK=one\nCOLLIE_WORLD_SIZE=2x\nCOLLIE_TIMEOUT=soon\n");
  // Sizes with K, M and G (config::parse_bytes), and one suffix that is not.
  write("launch_env", "size-suffixes",
        "COLLIE_TCP_CHUNK_BYTES=512K\nCOLLIE_SOCKET_BUFFER=4m\nCOLLIE_TCP_SOCKET_MIN_BYTES=64k\n"
        "COLLIE_SHM_CHUNK=1M\nCOLLIE_SHM_SMALL=16K\nCOLLIE_HIER_PIECE=2M\nCOLLIE_CUDA_CHUNK=1G\n");
  write("launch_env", "size-suffix-bad", "COLLIE_SOCKET_BUFFER=4MB\nCOLLIE_SHM_CHUNK=-1K\n");
  write("tuning_file", "edge-cases",
        "# comment\n\n  COLLIE_TCP_SOCKETS = 2  # two lanes\r\nCOLLIE_ALLREDUCE_ALGO=rd\n"
        "COLLIE_SHM_CHUNK=4096\nCOLLIE_HIER_PIECE=1e6\n");
  write("tuning_file", "not-a-setting", "COLLIE_TIMEOUT=5\n");
  write("tuning_file", "not-name-value", "COLLIE_TCP_GBPS\n");
}

}  // namespace

// Sessions of fuzz_store.cc's command language: a command byte is
// (what << 2) | connection, what: 0 raw bytes, 1 a request, 2 an honest
// handshake, 3 its hello alone, 4 close and reopen. A request is its op, the
// number of fields and, per field, an index into the target's pool (0 "a",
// 1 "b", 4 "1", 6 INT64_MAX, 8 "7").
void store_sessions() {
  using namespace store_detail;
  auto bytes = [](std::initializer_list<int> v) {
    std::string s;
    for (int b : v) s += static_cast<char>(b);
    return s;
  };
  auto raw = [](int conn, const std::string& b) {
    std::string s;
    s += static_cast<char>(conn);
    s += static_cast<char>(b.size() & 0xff);
    s += static_cast<char>(b.size() >> 8);
    return s + b;
  };
  // Two connections: one parks a get and a wait, the other sets, adds,
  // compares and sets, deletes and checks.
  write("store", "two-clients",
        bytes({1, 8,       9, 5, kGet,        1,      0, 4, kSet, 2, 0,     8, 4, kAdd,
               2, 1,       4, 4, kCompareSet, 3,      0, 8, 4,    5, kWait, 2, 0, 1,
               4, kDelete, 1, 0, 4,           kCheck, 2, 0, 1,    4, kAdd,  2, 1, 6}));
  // A second request while a get is parked; an unknown op; a malformed set.
  write("store", "parked-twice", bytes({0, 8, 4, kGet, 1, 1, 4, kSet, 1, 0}));
  write("store", "malformed", bytes({0, 8, 4, 11, 0, 4, kSet, 1, 0, 4, kAdd, 2, 0, 7}));
  // Before the handshake: garbage, a request, a hello of another job, a
  // proof that is not the secret's, a length over the cap.
  write("store", "garbage", raw(0, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
  write("store", "request-first", bytes({0, 4, kSet, 2, 0, 1}));
  write("store", "other-job",
        raw(0, message(kHello, {kMagic, "another job", std::string(auth::kNonceBytes, 'n')})));
  write("store", "forged-proof",
        bytes({0, 12}) + raw(0, message(kProof, {std::string(auth::kMacBytes, 'p')})));
  write("store", "huge-length", raw(0, bytes({0xff, 0xff, 0xff, 0x7f, kHello})));
  // A connection closed with a request parked, then reopened.
  write("store", "close-parked", bytes({1, 8, 9, 4, kGet, 1, 0, 16, 5, kSet, 2, 0, 4}));
}

// fuzz_handshake.cc's inputs: n, rank, the mode (0 any bytes, 1 honest,
// 2 changed in flight, 3 replayed), then the mode's bytes.
void handshakes() {
  auto b = [](std::initializer_list<int> v) {
    std::string s;
    for (int x : v) s += static_cast<char>(x);
    return s;
  };
  auth::Nonce n{};
  n.fill(7);
  const tcp::Hello h = tcp::make_hello(3, 1, 0, 1, "collie/comm/0", n);
  const std::string hello(reinterpret_cast<const char*>(&h), sizeof h);
  write("handshake", "any-bytes-real-hello", b({4, 1, 0}) + hello);
  write("handshake", "any-bytes-stranger", b({4, 1, 0}) + "GET / HTTP/1.1\r\n");
  write("handshake", "honest", b({6, 2, 1, 1, 2, 1, 9, 159, 31}));
  // Changed in flight: the key (refused), its padding and the nonce (both
  // still of this communicator, and then not proved).
  write("handshake", "changed-key", b({6, 2, 2, 0, 1, 0, 9, 20, 1}));
  write("handshake", "changed-padding", b({6, 2, 2, 0, 1, 0, 9, 100, 0x20}));
  write("handshake", "changed-nonce", b({6, 2, 2, 0, 1, 0, 9, 140, 1}));
  write("handshake", "replayed", b({3, 0, 3, 1, 1, 0, 5}));
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds DIR (e.g. tests/fuzz/corpus)\n");
    return 2;
  }
  root = argv[1];
  frames();
  checkpoints();
  hook_specs();
  environments();
  store_sessions();
  handshakes();
  std::printf("fuzz_make_seeds: seeds written under %s\n", root.c_str());
  return 0;
}
