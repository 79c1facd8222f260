// bench/bench_args.cc: collie-bench's command line.
#include "bench/bench_args.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

namespace bench {

namespace {

constexpr const char* kColls[] = {"allreduce", "allgather", "reduce_scatter",
                                  "broadcast", "sendrecv",  "alltoall"};

size_t parse_size(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  double scale = 1;
  if (end != v.c_str() && *end) {
    switch (*end) {
      case 'K':
      case 'k':
        scale = 1024.0;
        break;
      case 'M':
      case 'm':
        scale = 1024.0 * 1024;
        break;
      case 'G':
      case 'g':
        scale = 1024.0 * 1024 * 1024;
        break;
      default:
        scale = 0;
    }
    if (scale && end[1] != '\0') scale = 0;
  }
  if (end == v.c_str() || scale == 0 || !std::isfinite(x) || x < 0)
    throw UsageError(flag + " '" + v +
                     "' is not a size: give bytes with an optional K, M or G suffix (8, 512K, "
                     "256M)");
  return static_cast<size_t>(x * scale);
}

int parse_int(const std::string& flag, const std::string& v, long lo, long hi, const char* what) {
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < lo || x > hi)
    throw UsageError(flag + " '" + v + "': " + what);
  return static_cast<int>(x);
}

}  // namespace

const char* name(Coll c) {
  return kColls[static_cast<int>(c)];
}

bool reduces(Coll c) {
  return c == Coll::allreduce || c == Coll::reduce_scatter;
}

double bus_factor(Coll c, int n) {
  switch (c) {
    case Coll::allreduce:
      return 2.0 * (n - 1) / n;
    case Coll::allgather:
    case Coll::reduce_scatter:
    case Coll::alltoall:
      return static_cast<double>(n - 1) / n;
    case Coll::broadcast:
    case Coll::sendrecv:
      break;
  }
  return 1.0;
}

const char* const kUsage =
    "usage: collie-run -n N collie-bench [options]\n"
    "  -C, --collective C       allreduce allgather reduce_scatter broadcast sendrecv\n"
    "                           alltoall\n"
    "                           (default allreduce)\n"
    "  -b, --minbytes SIZE      smallest size (default 8); SIZE is bytes with an optional\n"
    "                           K, M or G suffix: 8, 512K, 256M; rounded down to whole\n"
    "                           elements, at least one\n"
    "  -e, --maxbytes SIZE      largest size (default 256M), at least -b\n"
    "  -f, --stepfactor F       multiply the size by F from one step to the next (>= 2)\n"
    "  -n, --iters N            timed samples per size (>= 1, default 20); a sample is a\n"
    "                           barrier and 10 back-to-back ops up to 64 KiB, else 1\n"
    "  -w, --warmup_iters N     untimed operations before them (>= 0, default 5)\n"
    "  -c, --check 0|1          check every result against the known answer (default 1)\n"
    "  -d, --datatype T         f32 f64 f16 bf16 i32 i64 u8 i8 (default f32)\n"
    "  -o, --op OP              sum avg min max prod (default sum)\n"
    "  -i, --inplace 0|1        in place (default 0: out of place)\n"
    "  -W, --work 0|1           1: time each op as issued and then waited for through its\n"
    "                           Work handle; 0 (default): the blocking calls, as MPI's\n"
    "                           benchmarks time MPI_Allreduce\n"
    "  -M, --comm-memory 0|1    buffers from the communicator's own memory\n"
    "                           (Communicator::allocate; on shm an in-place all-reduce\n"
    "                           then reads the peers' buffers directly; default 0)\n"
    "  -D, --device cpu|cuda    where the buffers are (default cpu); cuda: device memory\n"
    "                           on GPU rank % GPUs, moved by nccl (-B nccl) or staged\n"
    "                           through pinned host memory by the host backends\n"
    "  -a, --algo A             auto ring rd (default auto: the cost model picks)\n"
    "  -B, --backend NAME       auto tcp ... (default auto)\n"
    "      --plot FILE.png      draw busbw and time against size (needs gnuplot)\n"
    "      --csv, --json        print the table as CSV or as one JSON object\n"
    "      --tune FILE          measure the TCP transport's latency and bandwidth and the\n"
    "                           reduction's speed, and write them to FILE for the cost\n"
    "                           model (COLLIE_TUNING_FILE=FILE); needs 2 ranks or more\n"
    "  -h, --help               this text\n";

Args parse(int argc, char** argv) {
  Args a;
  bool have_min = false, have_max = false;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i], v;
    bool inline_value = false;
    if (auto eq = f.find('='); f.rfind("--", 0) == 0 && eq != std::string::npos) {
      v = f.substr(eq + 1);
      f.resize(eq);
      inline_value = true;
    }
    if (f == "-h" || f == "--help") {
      a.help = true;
      continue;
    }
    if (f == "--csv" || f == "--json") {
      a.format = f == "--csv" ? Format::csv : Format::json;
      continue;
    }
    auto value = [&]() -> const std::string& {
      if (!inline_value) {
        if (i + 1 >= argc) throw UsageError(f + " needs a value");
        v = argv[++i];
      }
      return v;
    };
    if (f == "-C" || f == "--collective") {
      const auto* c = std::find(std::begin(kColls), std::end(kColls), value());
      if (c == std::end(kColls))
        throw UsageError(f + " '" + v +
                         "' is not a collective: allreduce allgather reduce_scatter broadcast "
                         "sendrecv alltoall");
      a.coll = static_cast<Coll>(c - std::begin(kColls));
    } else if (f == "-b" || f == "--minbytes") {
      a.min_bytes = parse_size(f, value());
      have_min = true;
    } else if (f == "-e" || f == "--maxbytes") {
      a.max_bytes = parse_size(f, value());
      have_max = true;
    } else if (f == "-f" || f == "--stepfactor") {
      a.factor =
          static_cast<size_t>(parse_int(f, value(), 2, 1 << 30, "a whole number, at least 2"));
    } else if (f == "-n" || f == "--iters") {
      a.iters = parse_int(f, value(), 1, 1 << 30, "a whole number of timed samples, at least 1");
    } else if (f == "-w" || f == "--warmup_iters") {
      a.warmup =
          parse_int(f, value(), 0, 1 << 30, "a whole number of warm-up operations, 0 or more");
    } else if (f == "-c" || f == "--check") {
      a.check = parse_int(f, value(), 0, 1, "0 (do not check) or 1 (check every result)");
    } else if (f == "-W" || f == "--work") {
      a.work = parse_int(f, value(), 0, 1, "0 (blocking calls) or 1 (issue, then wait)");
    } else if (f == "-M" || f == "--comm-memory") {
      a.comm_memory = parse_int(f, value(), 0, 1, "0 (ordinary memory) or 1 (the communicator's)");
    } else if (f == "-D" || f == "--device") {
      const std::string d = value();
      if (d != "cpu" && d != "cuda") throw UsageError(f + " '" + d + "' is not cpu or cuda");
      a.cuda = d == "cuda";
    } else if (f == "-i" || f == "--inplace") {
      a.in_place = parse_int(f, value(), 0, 1, "0 (out of place) or 1 (in place)");
    } else if (f == "-d" || f == "--datatype") {
      auto d = collie::parse_dtype(value());
      if (!d) throw UsageError(f + " '" + v + "' is not a dtype: f32 f64 f16 bf16 i32 i64 u8 i8");
      a.dtype = *d;
    } else if (f == "-o" || f == "--op") {
      auto o = collie::parse_reduce_op(value());
      if (!o) throw UsageError(f + " '" + v + "' is not an op: sum avg min max prod");
      a.op = *o;
    } else if (f == "-a" || f == "--algo") {
      a.algo = value();
      if (a.algo != "auto" && a.algo != "ring" && a.algo != "rd")
        throw UsageError(f + " '" + v + "' is not an algorithm: auto ring rd");
    } else if (f == "-B" || f == "--backend") {
      a.backend = value();
    } else if (f == "--plot") {
      a.plot = value();
      if (a.plot.empty()) throw UsageError("--plot needs a file name (out.png)");
    } else if (f == "--tune") {
      a.tune = value();
      if (a.tune.empty()) throw UsageError("--tune needs a file name (tuning.txt)");
    } else {
      throw UsageError("unknown option '" + std::string(argv[i]) + "'");
    }
  }
  if (a.min_bytes < 1) throw UsageError("-b must be at least 1 byte");
  if (a.min_bytes > a.max_bytes)
    throw UsageError("-b (" + std::to_string(a.min_bytes) + " B) is larger than -e (" +
                     std::to_string(a.max_bytes) + " B)" +
                     (have_min && !have_max ? ", whose default is 256M" : "") +
                     (have_max && !have_min ? ", which must be at least -b's default, 8" : "") +
                     ": give -e at least -b");
  if (!collie::supports(a.op, a.dtype))
    throw UsageError(std::string("-o ") + std::string(collie::to_string(a.op)) +
                     " is not defined on -d " + std::string(collie::to_string(a.dtype)) +
                     " (avg on integers would truncate)");
  if (a.coll == Coll::alltoall && a.in_place)
    throw UsageError("-C alltoall runs out of place only (-i 0)");
  return a;
}

}  // namespace bench
