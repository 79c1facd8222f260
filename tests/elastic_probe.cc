// tests/elastic_probe.cc: a training loop that loses a rank and goes on
// with a replacement, under collie-run --elastic --max-restarts M.
//
//   elastic_probe [--steps N] [--kill-rank R --kill-at S] [--floats K] [--joiners-die 1]
//                 [--lost-at-end R --sync-dir D [--await-replacement 1]] [--spares-die 1]
//
// The "model" is K floats; at step i, rank r's "gradient" element j is
// (r + 1) * ((i + j) % 7 + 1), all-reduced (sum) and added to the model.
// Whatever the ranks' numbering, a world of W ranks adds W (W + 1) / 2 *
// ((i + j) % 7 + 1) per step: integers, exact in f32, so the final model
// is compared bit for bit with the serial sum (in double).
//
// Rank R, in its first life (COLLIE_RESTART_COUNT=0), prints "killed at
// step S epoch=..." and SIGKILLs itself before step S's all-reduce. The
// others get peer_lost there, shrink, then grow by one: collie-run has
// started rank R again alone (COLLIE_JOIN=1), and its connect() is the
// grow's joiner. The survivors' rank 0 broadcasts the step and the model
// to the new communicator, in memory, and every rank does step S again.
// Rank 0 prints "step S again with W ranks epoch=..." once that step is
// done (and, in a job restarted whole, "first step after a restart
// epoch=..."), and at the end every rank prints "done: N steps, model exact" or
// "WRONG element j: got X, want Y".
//
// --spares-die 1: a spare (collie-run --spares: COLLIE_SPARE set) in its
// first life prints "spare killed before joining" and SIGKILLs itself
// before it queues to join.
//
// Exit status: 0 all ok; 2 usage; 3 an error; 4 a wrong model.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collie/comm.h"

using namespace collie;

namespace {

double epoch_now() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "elastic_probe: %s\nusage: elastic_probe [--steps N] [--kill-rank R --kill-at S] "
               "[--floats K] [--joiners-die 1] [--lost-at-end R --sync-dir D] [--spares-die 1]\n",
               why.c_str());
  std::exit(2);
}

long number(const std::string& flag, const char* v) {
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (!*v || *end || x < 0) usage(flag + " takes a whole number >= 0, not '" + v + "'");
  return x;
}

// The step and the model, from the rank 0 of `comm` to every other rank.
void share_state(Communicator& comm, long& step, std::vector<float>& model) {
  int64_t s = step;
  comm.broadcast(view_of(&s, 1), 0).wait();
  comm.broadcast(view_of(model.data(), model.size()), 0).wait();
  step = static_cast<long>(s);
}

bool exists(const std::string& path) {
  return access(path.c_str(), F_OK) == 0;
}

// Whether process `pid` has ended (a zombie not yet reaped, or gone).
bool ended(pid_t pid) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return true;
  char line[512] = {0};
  const bool read = std::fgets(line, sizeof line, f) != nullptr;
  std::fclose(f);
  const char* close = std::strrchr(line, ')');
  return !read || !close || close[2] == 'Z';
}

// --lost-at-end R: rank R dies once every other rank has finished its work,
// while they are still running; they end once it has, or with
// --await-replacement once its replacement has started too (collie-run
// has then handled the loss while they ran: without it, collie-run may
// reap them first and take the loss for one after the end). Ordered by
// files in `dir` (done.<rank>, lost.pid, replacement), not by time; the
// wait for a replacement gives up after 60 s, so that a launcher that
// never starts one fails the test rather than hanging it.
void end_with_a_loss(const std::string& dir, int born, long lost, int world,
                     bool await_replacement) {
  if (born == lost) {
    for (int r = 0; r < world; ++r)
      while (r != lost && !exists(dir + "/done." + std::to_string(r))) usleep(1000);
    if (FILE* f = std::fopen((dir + "/lost.pid.tmp").c_str(), "w")) {
      std::fprintf(f, "%d\n", static_cast<int>(getpid()));
      std::fclose(f);
      std::rename((dir + "/lost.pid.tmp").c_str(), (dir + "/lost.pid").c_str());
    }
    std::printf("lost as the others finish\n");
    std::fflush(stdout);
    ::raise(SIGKILL);
  }
  if (FILE* f = std::fopen((dir + "/done." + std::to_string(born)).c_str(), "w")) std::fclose(f);
  while (!exists(dir + "/lost.pid")) usleep(1000);
  pid_t pid = 0;
  if (FILE* f = std::fopen((dir + "/lost.pid").c_str(), "r")) {
    if (std::fscanf(f, "%d", &pid) != 1) pid = 0;
    std::fclose(f);
  }
  while (pid > 0 && !ended(pid)) usleep(1000);
  for (int ms = 0; await_replacement && ms < 60000 && !exists(dir + "/replacement"); ++ms)
    usleep(1000);
}

}  // namespace

int main(int argc, char** argv) {
  long steps = 40, kill_rank = -1, kill_at = -1, floats = 1 << 16;
  bool joiners_die = false;        // a replacement kills itself once it has the state
  bool spares_die = false;         // a first-life spare kills itself before it joins
  long lost_at_end = -1;           // this rank, in its first life, dies as the others finish
  std::string sync_dir;            // where --lost-at-end's ranks order themselves
  bool await_replacement = false;  // ... and the others end once its replacement has started
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) usage("missing value after " + a);
    const char* v = argv[++i];
    if (a == "--steps")
      steps = number(a, v);
    else if (a == "--kill-rank")
      kill_rank = number(a, v);
    else if (a == "--kill-at")
      kill_at = number(a, v);
    else if (a == "--floats")
      floats = number(a, v);
    else if (a == "--joiners-die")
      joiners_die = number(a, v) != 0;
    else if (a == "--lost-at-end")
      lost_at_end = number(a, v);
    else if (a == "--spares-die")
      spares_die = number(a, v) != 0;
    else if (a == "--sync-dir")
      sync_dir = v;
    else if (a == "--await-replacement")
      await_replacement = number(a, v) != 0;
    else
      usage("unknown option " + a);
  }
  const char* restarts = std::getenv("COLLIE_RESTART_COUNT");
  const bool first_life = !restarts || std::string(restarts) == "0";
  const char* join = std::getenv("COLLIE_JOIN");
  const bool joining = join && std::string(join) == "1";
  const int world = [] {
    const char* w = std::getenv("WORLD_SIZE");
    return w ? std::atoi(w) : 1;
  }();

  if (joining && !sync_dir.empty())  // for --await-replacement: collie-run started this one
    if (FILE* f = std::fopen((sync_dir + "/replacement").c_str(), "w")) std::fclose(f);
  if (spares_die && first_life && std::getenv("COLLIE_SPARE")) {
    std::printf("spare killed before joining\n");
    std::fflush(stdout);
    ::raise(SIGKILL);
  }

  std::vector<float> model(static_cast<size_t>(floats), 0.0f), grad(model.size());
  long step = 0;
  bool again = false;  // the step after a recovery
  try {
    std::unique_ptr<Communicator> comm = connect();
    const int born = comm->rank();  // its number at the start, whatever the later ones
    if (joining) {
      std::printf("joined as rank %d of %d\n", comm->rank(), comm->size());
      std::fflush(stdout);
      share_state(*comm, step, model);
      if (joiners_die) {
        std::printf("joiner killed at step %ld\n", step);
        std::fflush(stdout);
        ::raise(SIGKILL);
      }
    }
    while (step < steps) {
      if (first_life && !joining && born == kill_rank && step == kill_at) {
        std::printf("killed at step %ld epoch=%.3f\n", step, epoch_now());
        std::fflush(stdout);
        ::raise(SIGKILL);
      }
      const int r = comm->rank();
      for (size_t j = 0; j < grad.size(); ++j)
        grad[j] = static_cast<float>(r + 1) * static_cast<float>((step + j) % 7 + 1);
      try {
        comm->allreduce(view_of(grad.data(), grad.size()), ReduceOp::sum).wait();
      } catch (const Error& e) {
        // Without collie-run --elastic (COLLIE_ELASTIC=1) no replacement
        // comes: end, and let the launcher restart the job.
        const char* el = std::getenv("COLLIE_ELASTIC");
        if (e.code() != ErrorCode::peer_lost || !el || std::string(el) != "1") throw;
        // A rank is gone: go on without it, then with its replacement.
        std::printf("step %ld: %s\n", step, e.what());
        comm = comm->shrink();
        comm = comm->grow(world - comm->size());
        share_state(*comm, step, model);
        again = true;
        continue;
      }
      if (again && comm->rank() == 0) {
        // The step again, now with the replacement: the job has recovered.
        std::printf("step %ld again with %d ranks epoch=%.3f\n", step, comm->size(), epoch_now());
        std::fflush(stdout);
      }
      again = false;
      if (!first_life && !joining && step == 0 && comm->rank() == 0) {
        // The whole job started again (--max-restarts without --elastic):
        // for bench/elastic_times.sh's comparison.
        std::printf("first step after a restart epoch=%.3f\n", epoch_now());
        std::fflush(stdout);
      }
      for (size_t j = 0; j < model.size(); ++j) model[j] += grad[j];
      ++step;
    }
    // The serial sum: every step added W (W + 1) / 2 * ((i + j) % 7 + 1).
    const double ranks_sum = static_cast<double>(comm->size()) * (comm->size() + 1) / 2;
    for (size_t j = 0; j < model.size(); ++j) {
      double want = 0;
      for (long i = 0; i < steps; ++i) want += ranks_sum * static_cast<double>((i + j) % 7 + 1);
      if (static_cast<double>(model[j]) != want) {
        std::printf("WRONG element %zu: got %.9g, want %.9g\n", j, model[j], want);
        return 4;
      }
    }
    std::printf("done: %ld steps, model exact, rank %d of %d\n", steps, comm->rank(), comm->size());
    std::fflush(stdout);
    if (lost_at_end >= 0 && first_life && !joining)
      end_with_a_loss(sync_dir, born, lost_at_end, world, await_replacement);
  } catch (const Error& e) {
    std::printf("ERROR code=%s: %s\n", std::string(to_string(e.code())).c_str(), e.what());
    return 3;
  }
  return 0;
}
