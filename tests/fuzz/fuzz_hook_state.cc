// tests/fuzz/fuzz_hook_state.cc: the checkpoints of the comm hooks
// (CommHook::load_state: PowerSGD's error feedback and Q, post-local SGD's
// and the averagers' step counts; hooks/) on their own.
//
// Input: one byte that picks a hook spec (tests/fuzz/models.h) or, past
// them, a model averager; then the state. Contract: it is refused with an
// invalid_argument error, or it loads, and then what the hook saves is what
// it loaded (read independently: tests/fuzz/models.h) and loads into a fresh
// one, which saves the same bytes (an averager's state is its
// step count, saved back as it was loaded); and the hook, driven by a
// reducer at one rank, reduces the model's gradients (or refuses a state
// that does not fit its buckets, with an invalid_argument error), leaving
// them unchanged under every hook but PowerSGD; an averager leaves one
// rank's parameters as they are and counts the steps on from the loaded one.
#include <string>

#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/models.h"

using namespace collie;

namespace {

template <typename Averager>
void averager(Averager& avg, const Bytes& state) {
  if (!fuzz::accepted([&] { avg.load_state(state); })) return;
  FUZZ_CHECK(avg.save_state() == state, "an averager's state does not round-trip");
  const uint64_t step = avg.step();
  std::vector<float> values = fuzz::averaged_values();
  for (uint64_t k = 1; k <= 3; ++k) {
    avg.average_parameters({view_of(values.data(), values.size())});
    FUZZ_CHECK(values == fuzz::averaged_values(), "averaging at one rank changed a parameter");
    FUZZ_CHECK(avg.step() == step + k, "the averager's step did not count on from the loaded one");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const auto& specs = fuzz::hook_specs();
  const size_t pick = in.byte() % (specs.size() + fuzz::kNumAveragers);
  const Bytes state = in.rest();
  if (pick == specs.size()) {
    PeriodicModelAverager avg(fuzz::solo(), 3, 2);
    averager(avg, state);
    return 0;
  }
  if (pick == specs.size() + 1) {
    HierarchicalModelAverager avg(fuzz::solo(), {{2, 1}, {4, 1}}, 1);
    averager(avg, state);
    return 0;
  }

  const std::string& spec = specs[pick];
  std::shared_ptr<CommHook> hook = fuzz::hook_or_null(spec);
  if (!hook) return 0;  // not in this build
  if (!fuzz::accepted([&] { hook->load_state(state); })) return 0;
  const Bytes saved = hook->save_state();
  FUZZ_CHECK(saved == fuzz::hook_canonical(spec, state),
             "the saved state is not the loaded one (hook " + spec + ")");
  {
    std::unique_ptr<CommHook> fresh = make_comm_hook(spec);
    FUZZ_CHECK(fuzz::accepted([&] { fresh->load_state(saved); }),
               "a saved state does not load (hook " + spec + ")");
    FUZZ_CHECK(fresh->save_state() == saved,
               "a saved state, loaded and saved again, differs (hook " + spec + ")");
  }

  fuzz::Model m;
  ReducerOptions opt = fuzz::reducer_options("");
  opt.hook = hook;
  Reducer red(fuzz::solo(), m.params(), opt);
  const bool exact = spec.find("powersgd") == std::string::npos;
  for (uint64_t it = 0; it < 3; ++it) {
    if (!fuzz::accepted([&] { fuzz::train_step(red, m, it); })) break;
    if (!exact) continue;
    fuzz::Model want;
    want.fill(it);
    FUZZ_CHECK(m.g0 == want.g0 && m.gb0 == want.gb0 && m.g1 == want.g1 && m.g2 == want.g2,
               "after a loaded state, hook " + spec + " changed the gradients of one rank");
  }
  return 0;
}
