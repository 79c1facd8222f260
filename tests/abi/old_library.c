/* tests/abi/old_library.c: a stand-in for a libcollie of another release,
 * for tests/python/abi_check.py: it answers collie_abi_version with this
 * header's version less STUB_BEHIND and has no other call, as an older
 * library lacks the newer ones. Built twice: one version behind the
 * package's, and at its own (a library that claims the version but lacks
 * the calls). */
#include "collie/collie.h"

int collie_abi_version(void) {
  return COLLIE_ABI_VERSION - STUB_BEHIND;
}
