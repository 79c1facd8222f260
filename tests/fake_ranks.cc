// tests/fake_ranks.cc: one thread per rank over a fake network.
#include "fake_ranks.h"

#include <thread>

namespace collie::testing {

std::vector<RankResult> run_ranks(FakeNetwork& net,
                                  const std::function<std::string(int, Transport&)>& fn) {
  const int n = net.size();
  std::vector<RankResult> out(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      RankResult& res = out[r];
      try {
        res.failures = fn(r, net.endpoint(r));
        res.ok = true;
      } catch (const Vanished&) {
        res.vanished = true;
      } catch (const Error& e) {
        res.error = std::string(to_string(e.code())) + ": " + e.what();
      } catch (const std::exception& e) {
        res.error = std::string("other: ") + e.what();
      }
    });
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace collie::testing
