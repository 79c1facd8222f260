// bench/bench_tune.h: collie-bench --tune FILE: measures what the TCP cost
// model assumes and writes it for COLLIE_TUNING_FILE.
#pragma once

#include <string>

namespace bench {

// Returns the program's exit status.
int tune(const std::string& path);

}  // namespace bench
