// tests/fuzz/fuzz_hook_spec.cc: comm hook specs, as COLLIE_COMM_HOOK and
// register_comm_hook("powersgd:rank=2") take them (hooks/comm_hook.cc and
// the parameter readers of each hook).
//
// Input: the spec. Contract: it is refused with an invalid_argument error
// (unavailable: PowerSGD in a build without BLAS), or it builds a hook whose
// name, given back as a spec, builds a hook of the same name, and which
// reduces the model's gradients at one rank (or refuses to at its first
// bucket, with an invalid_argument error: a subgroup that does not divide
// the world) and leaves them unchanged, except under PowerSGD, which
// approximates them.
#include <string>

#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/models.h"

using namespace collie;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string spec(reinterpret_cast<const char*>(data), size);
  std::shared_ptr<CommHook> hook;
  if (!fuzz::accepted([&] { hook = make_comm_hook(spec); },
                      {ErrorCode::invalid_argument, ErrorCode::unavailable}))
    return 0;
  const std::string name = hook->name();
  std::unique_ptr<CommHook> again;
  FUZZ_CHECK(fuzz::accepted([&] { again = make_comm_hook(name); }),
             "the hook's name '" + name + "' is not a spec that builds it");
  FUZZ_CHECK(again->name() == name,
             "the hook named '" + name + "', built from its name, is '" + again->name() + "'");

  fuzz::Model m;
  ReducerOptions opt = fuzz::reducer_options("");
  opt.hook = hook;
  Reducer red(fuzz::solo(), m.params(), opt);
  const bool exact = name.find("powersgd") == std::string::npos;
  for (uint64_t it = 0; it < 3; ++it) {
    if (!fuzz::accepted([&] { fuzz::train_step(red, m, it); })) break;
    if (!exact) continue;
    fuzz::Model want;
    want.fill(it);
    FUZZ_CHECK(m.g0 == want.g0 && m.gb0 == want.gb0 && m.g1 == want.g1 && m.g2 == want.g2,
               "hook '" + name + "' changed the gradients of one rank");
  }
  return 0;
}
