// tests/fuzz/fuzz_reducer_state.cc: a reducer checkpoint
// (Reducer::load_state, reducer/reducer.cc), with the comm hook's state
// inside it.
//
// Input: one byte that picks the reducer's comm hook (tests/fuzz/models.h),
// then the checkpoint. Contract: it is refused with an invalid_argument
// error, or it loads, and then: what the reducer saves is what it loaded
// (read independently: tests/fuzz/models.h), and loads into a fresh
// reducer, which saves the same bytes again (a checkpoint round-trips); and
// the reducer trains on from it, reducing the model's gradients at one rank
// (or refusing a hook state that does not fit the buckets, with an
// invalid_argument error), leaving them unchanged under every hook but
// PowerSGD, which approximates them.
#include <string>

#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/models.h"

using namespace collie;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const std::string spec = fuzz::hook_specs()[in.byte() % fuzz::hook_specs().size()];
  if (!fuzz::hook_or_null(spec)) return 0;  // not in this build
  const Bytes state = in.rest();

  fuzz::Model m;
  Reducer red(fuzz::solo(), m.params(), fuzz::reducer_options(spec));
  if (!fuzz::accepted([&] { red.load_state(state); })) return 0;

  // What it saves is what it loaded: the reducer's fields as written, the
  // hook's state as the hook keeps it.
  const Bytes saved = red.save_state();
  auto was = fuzz::read_reducer_checkpoint(state), out = fuzz::read_reducer_checkpoint(saved);
  FUZZ_CHECK(was && out, "a loaded or saved checkpoint that does not parse (hook " + spec + ")");
  FUZZ_CHECK(
      was->params == out->params && was->iteration == out->iteration &&
          was->rebuilt == out->rebuilt && was->order == out->order,
      "the saved iteration, layout or parameter count is not the loaded one (hook " + spec + ")");
  FUZZ_CHECK(out->hook == fuzz::hook_canonical(spec, was->hook),
             "the saved hook state is not the loaded one (hook " + spec + ")");
  {
    fuzz::Model m2;
    Reducer fresh(fuzz::solo(), m2.params(), fuzz::reducer_options(spec));
    FUZZ_CHECK(fuzz::accepted([&] { fresh.load_state(saved); }),
               "a saved state does not load (hook " + spec + ")");
    FUZZ_CHECK(fresh.save_state() == saved,
               "a saved state, loaded and saved again, differs (hook " + spec + ")");
  }

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
